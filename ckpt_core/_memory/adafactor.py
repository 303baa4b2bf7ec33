"""transformers' Adafactor, as HF Trainer builds it (``optim="adafactor"``): its states and step.

``Adafactor(scale_parameter=False, relative_step=False)``, no ``beta1``
(``transformers/optimization.py``): no first moment; the second moment of a
matrix is factored into a row and a column vector (fp32), that of a vector is
kept whole (fp32).  Its ``step()`` walks the parameters one by one in Python,
so its temporaries are those of one parameter at a time - except that each
iteration's locals (``grad``, ``p_data_fp32``, ``update``) live until the next
iteration rebinds them:

- a 16-bit gradient and parameter are copied to fp32 (``grad.float()``,
  ``p.float()``);
- ``update = grad**2 + eps`` (the square, then the sum; the square dies, then
  the last parameter's ``update``);
- the row and column means, then ``_approx_sq_grad``: ``row / row.mean()``,
  ``col.rsqrt()`` and their outer product, the new ``update`` (the factors die
  on return, then the sum);
- ``p_data_fp32.add_(-update)``: the negation;
- ``state["RMS"]``, a 0-dim tensor on the device, replaced each step.

At its first step the states are made after the gradient's fp32 copy:
``torch.zeros(shape[:-1]).to(grad)`` (the row) and the column.  Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.param_layout import ParamLayout

__all__ = ["Event", "Trained", "state_bytes", "step_events", "step_temporary"]

FP32: Final = 4
SCALAR: Final = 4  # a 0-dim fp32 tensor

# ("new", key, bytes) or ("free", key, 0), in the order the step makes them.
Event = tuple[str, object, int]


class Trained(NamedTuple):
    """A trained matrix (``rows`` x ``cols``, ``element`` bytes each), in
    ``model.parameters()`` order."""

    element: int
    rows: int
    cols: int

    @property
    def nbytes(self) -> int:
        return self.element * self.rows * self.cols


def state_bytes(
    arch: Arch, layout: ParamLayout, adapted: frozenset[str] | None, rank: int = 0
) -> int:
    """The states of a full fine-tune (``adapted`` None) or of the adapters on the
    ``adapted`` linears: a matrix's row and column second moments, a vector's whole
    second moment, fp32.  The parameters besides the linears and the embeddings (norms,
    biases, a position table) are taken as vectors: exact for norms and biases, more
    than a position table's factored states."""
    if adapted is not None:
        return sum(
            linear.count * (_factored(rank, linear.fan_in) + _factored(linear.fan_out, rank))
            for linear in layout.linears
            if linear.name in adapted
        )
    matrices = sum(
        linear.count * _factored(linear.fan_out, linear.fan_in) for linear in layout.linears
    )
    embeddings = (1 if arch.tied else 2) * _factored(arch.vocab, arch.hidden)
    biases = sum(linear.fan_out * linear.count for linear in layout.linears if linear.bias)
    return matrices + embeddings + FP32 * (biases + layout.other)


def _factored(rows: int, cols: int) -> int:
    return FP32 * (rows + cols)


def step_events(tensors: Sequence[Trained], *, first: bool) -> Iterator[Event]:
    """The device allocations and frees of one ``step()`` over ``tensors``; ``first``: it
    makes the states (kept, keys ``("row", i)`` / ``("col", i)``) and the RMS scalars."""
    # The last iteration's locals still alive: its fp32 grad and p_data_fp32 copies (None
    # for an fp32 parameter, whose locals are the parameter and its gradient) and update.
    last_grad: object = None
    last_weights: object = None
    last_update: object = None
    for i, tensor in enumerate(tensors):
        whole = FP32 * tensor.rows * tensor.cols
        half = tensor.element < FP32
        row, col = FP32 * tensor.rows, FP32 * tensor.cols
        # grad = p.grad releases the last fp32 gradient copy; a 16-bit one is copied.
        yield from _free(last_grad)
        grad = ("grad", i) if half else None
        if grad:
            yield "new", grad, whole
        if first:
            yield "new", ("row", i), row
            yield "new", ("col", i), col
        # p_data_fp32 = p releases the last parameter copy; a 16-bit one is copied.
        yield from _free(last_weights)
        weights = ("p32", i) if half else None
        if weights:
            yield "new", weights, whole
        yield "new", ("rms", i, first), SCALAR
        if not first:
            yield "free", ("rms", i, True), 0  # the last step's, replaced
        # update = grad**2 + eps: the square dies, then the last parameter's update.
        yield "new", ("square", i), whole
        yield "new", ("sum", i), whole
        yield "free", ("square", i), 0
        yield from _free(last_update)
        for name, size in (("row_mean", row), ("col_mean", col)):
            yield "new", (name, i), size
            yield "free", (name, i), 0
        # _approx_sq_grad: the row and column factors, their outer product; the factors
        # die on return, then the sum as update is rebound.
        yield "new", ("r_factor", i), row
        yield "new", ("c_factor", i), col
        yield "new", ("update", i), whole
        for name in ("r_factor", "c_factor", "sum"):
            yield "free", (name, i), 0
        # p_data_fp32.add_(-update)
        yield "new", ("negated", i), whole
        yield "free", ("negated", i), 0
        last_grad, last_weights, last_update = grad, weights, ("update", i)
    for key in (last_grad, last_weights, last_update):  # step() returns: its locals die
        yield from _free(key)


def step_temporary(tensors: Sequence[Trained]) -> int:
    """The most a step (states made) holds at once beyond its states: bytes."""
    live = peak = 0
    # The last step's RMS scalars, which this step's replace.
    sizes: dict[object, int] = {("rms", i, True): SCALAR for i in range(len(tensors))}
    for kind, key, size in step_events(tensors, first=False):
        if kind == "new":
            sizes[key] = size
            live += size
            peak = max(peak, live)
        else:
            live -= sizes.pop(key)
    return peak


def _free(key: object) -> Iterator[Event]:
    """Free ``key``'s tensor, if there is one."""
    if key is not None:
        yield "free", key, 0
