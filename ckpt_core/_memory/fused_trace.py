"""Single CUDA kernels whose backward keeps outputs of their own, for the step replay.

``nn.LayerNorm`` is one ``native_layer_norm``: its output, then an fp32 mean and
rstd per row, kept with its input for the backward.  ``nn.Dropout`` in training
is CUDA's fused ``native_dropout``: its output, then a bool mask the backward
keeps (aten's ``dropout`` returns its input itself when p is 0).  Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.linear_trace import TraceRecipe

__all__ = ["dropout", "dropped_out", "layer_norm"]


def layer_norm(
    sim: Sim, x: int, rows: int, width: int, recipe: TraceRecipe, *, dtype: int | None = None
) -> int:
    """``native_layer_norm`` on ``x`` (``dtype``: its bytes per element, the residual
    stream's unless given): its output, then the fp32 mean and rstd, kept with x."""
    dtype = recipe.residual if dtype is None else dtype
    return sim.op(
        [x], dtype * rows * width, save=[x], saves_other=True, saved_outputs=(4 * rows,) * 2
    )


def dropout(sim: Sim, x: int, size: int, elements: int, p: float) -> int:
    """``nn.Dropout(p)`` in training on ``x`` of ``size`` bytes and ``elements`` elements:
    the output and a bool mask (kept); ``x`` itself when p is 0 (aten's ``dropout``)."""
    if not p:
        return x
    return sim.op([x], size, saved_outputs=(elements,))


def dropped_out(
    sim: Sim, x: int, recipe: TraceRecipe, width: int, p: float, *, dtype: int | None = None
) -> int:
    """``x = dropout(x, p)`` on a (tokens, ``width``) activation of ``dtype`` bytes per
    element (the activations' unless given): the rebinding frees ``x``."""
    elements = recipe.batch * recipe.seq * width
    out = dropout(sim, x, (dtype or recipe.act) * elements, elements, p)
    if out != x:
        sim.drop(x)
    return out
