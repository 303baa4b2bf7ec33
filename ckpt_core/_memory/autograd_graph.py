"""The forward half of the autograd replay: ops that record what their backward needs.

A forward op allocates its outputs, saves what its backward needs (a reference
held until that backward ran) and the program drops each intermediate where the
Python variable dies; a view (a slice, a chunk) allocates nothing and holds its
base's storage.  Each op that needs a gradient is recorded in the graph, which
`Sim` (``autograd_sim``) walks backward.  Checkpointed regions record nothing
in forward but their input and the count of tensors they would save, for the
recompute's early stop.

Pure Python; sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ckpt_core._memory.autograd_tensors import Tensors


@dataclass(slots=True)
class RecordedOp:
    """An op that needs a gradient, as the backward will replay it."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    saved: tuple[int, ...]
    temporaries: tuple[int, ...]
    scratch: tuple[int, ...]
    alias: bool
    param_grad: int
    unpacked: bool  # saved through checkpoint's hooks: freed as the backward returns
    matmul: bool  # a cuBLAS call, forward and backward
    unpacks: bool  # its backward reads a saved tensor (tracked or not)
    cast: bool  # an alias op whose inputs differ in dtype: each gets a gradient of its own
    shared_weight: bool  # its param_grad is a second gradient of the first weight: summed
    releases: tuple[int, ...] = ()  # what the checkpointed forward's node held: freed after it
    view_grads: bool = False  # its inputs' gradients are views of another tensor
    input_grad_first: bool = False  # AddmmBackward0: the input's gradient before the weight's
    grads_in_order: bool = False  # the inputs' gradients made first to last, not last first


@dataclass(slots=True)
class CheckpointedRegion:
    """A checkpointed region: its forward, rerun in the backward, and its input."""

    region: Callable[..., int]
    inputs: int
    output: int
    packs: int  # tensors the region saves for backward (checkpoint's pack-hook calls)
    held: tuple[int, ...] = ()  # what its nodes keep as attributes, out of the hooks' sight
    arguments: tuple[int, ...] = ()  # its other arguments, held until its backward is done


@dataclass(slots=True)
class Graph(Tensors):
    """The simulated device's tensors and the graph its forward ops record."""

    graph: list[RecordedOp | CheckpointedRegion] = field(default_factory=list)
    saving: bool = True
    # The Python thread's cuBLAS workspace, at the forward's first matmul when no earlier
    # op made it (`ckpt_core._memory.workspace`): 0 once allocated.
    forward_workspace: int = 0
    _packs: int = 0  # pack events counted (forward) or left (recompute)
    # Tensors a backward function keeps as an attribute (``ctx.x = x``), which checkpoint's
    # saved-tensor hooks never see: held by a checkpointed region's first forward, by its
    # recompute until that ends, and, in the recompute's order, the first forward's to free.
    _held: list[int] | None = None
    _recompute_held: list[int] = field(default_factory=list)
    _held_queue: list[int] = field(default_factory=list)
    _arguments: list[int] | None = None  # a checkpointed region's other arguments

    def views(self, base: int, sizes: Sequence[int]) -> tuple[int, ...]:
        """Views of ``base`` made by one op (a slice: one size; ``chunk``: several).

        A view allocates nothing and keeps ``base``'s storage while it lives.  Its
        backward (SliceBackward0, SplitBackward0) makes one gradient of the base's
        full size: zeros with the views' gradients copied in.
        """
        grad = self.info[base][1]
        made = tuple(self._view(base, size, grad) for size in sizes)
        if self.saving and grad:
            self._link((base,), made, alias=False)
        return made

    def in_place(self, target: int, others: Sequence[int] = (), *, alias: bool = True) -> int:
        """An in-place op on ``target`` (``target += other``; ``/= scalar``): nothing is
        allocated; returns the result, which holds ``target``'s storage (the caller drops
        ``target``'s name).  Its backward hands the incoming gradient on as it is
        (AddBackward0), or, not ``alias``, makes a new one (DivBackward1)."""
        grad = any(self.info[t][1] for t in (target, *others))
        result = self._view(target, self.size(target), grad)
        if self.saving and grad:
            self._link((target, *others), (result,), alias=alias)
        return result

    def _link(self, inputs: tuple[int, ...], outputs: tuple[int, ...], *, alias: bool) -> None:
        """Record an op that allocates nothing in forward (a view, an in-place add)."""
        self.graph.append(
            RecordedOp(
                inputs=inputs,
                outputs=outputs,
                saved=(),
                temporaries=(),
                scratch=(),
                alias=alias,
                param_grad=0,
                unpacked=self._recomputing,
                matmul=False,
                unpacks=False,
                cast=False,
                shared_weight=False,
            )
        )

    def op(
        self,
        inputs: Sequence[int],
        out: int,
        *,
        save: Sequence[int] = (),
        save_out: bool = False,
        saves_other: bool = False,
        temps: Sequence[int] = (),
        saved_outputs: Sequence[int] = (),
        backward_temps: Sequence[int] = (),
        backward_scratch: Sequence[int] = (),
        holds: Sequence[int] = (),
        alias: bool = False,
        cast: bool = False,
        param_grad: int = 0,
        shared_weight: bool = False,
        matmul: bool = False,
        view_grads: bool = False,
        input_grad_first: bool = False,
        grads_in_order: bool = False,
    ) -> int:
        """Run an op: ``temps`` live during it; returns its output (``out`` bytes).

        ``saves_other``: it also saves a tensor the replay does not track (a
        weight, RoPE's cos / sin).  Inputs are saved before the output is
        allocated (the generated autograd code), the output after.
        ``saved_outputs``: the bytes of the kernel's further outputs, allocated
        after the output and only saved for its backward (a LayerNorm's mean and
        rstd, a dropout's mask).  Its
        backward holds ``backward_temps`` from before its input gradients are
        allocated and ``backward_scratch`` from after them (a structured
        kernel's output is allocated before its implementation's temporaries).
        ``matmul``: a cuBLAS call (its backward's too), which may make a workspace.
        ``cast``: an input of another dtype gets its gradient cast to its dtype (the
        engine's validate_outputs, torch/csrc/autograd/engine.cpp): with ``alias`` a
        cast copy of the incoming gradient (the others get the incoming one), else a
        gradient computed in the output's dtype, then cast, then freed.
        ``shared_weight``: the ``param_grad`` is of the weight whose gradient the
        backward made first (tied embeddings: the LM head's); the two are summed.
        ``holds``: inputs its backward keeps as attributes, not through
        ``save_for_backward``: kept in a checkpointed region too (`_hold`).
        ``view_grads``: the gradients it makes for its inputs are views (``aten::linear``
        on a 3-D input: the backward of the input's reshape), so a second gradient of
        one of them is summed out of place (`_sum`).
        ``input_grad_first``: its backward makes the inputs' gradients, then the cuBLAS
        workspace when one is due, then ``param_grad`` (a linear with a bias: ``addmm``'s
        backward, as recorded), rather than ``param_grad`` first.
        ``grads_in_order``: its backward makes the inputs' gradients in their order (sdpa's
        fused kernels: dq, dk, dv, then the bias's), not the generated functions' last
        input first.
        """
        grad = param_grad > 0 or any(self.info[t][1] for t in inputs)
        recording = self.saving and grad
        releases = self._hold(holds) if grad and holds else ()
        kept: tuple[int, ...] = ()
        if recording:
            # Recorded outside a recompute, an attribute is kept as a saved tensor is.
            kept = tuple(save) if self._recomputing else (*save, *holds)
            for tid in kept:
                self.tensors[tid].refs += 1
        if grad and (save or saves_other):
            self._pack()
        held = [self.new(size) for size in temps]
        result = self.new(out, grad)
        extra = [self.new(size) for size in saved_outputs] if saved_outputs else None
        if matmul and self.forward_workspace and not self._recomputing:
            # cuBLAS asks for the thread's workspace once the output is allocated; kept.
            self.new(self.forward_workspace)
            self.forward_workspace = 0
        self.drop(*held)
        if recording:
            saved = (*kept, result) if save_out else kept
            if save_out:
                self.tensors[result].refs += 1
            if extra:
                for tid in extra:
                    self.tensors[tid].refs += 1
                saved = (*saved, *extra)
            self.graph.append(
                RecordedOp(
                    tuple(inputs),
                    (result,),
                    saved,
                    tuple(backward_temps),
                    tuple(backward_scratch),
                    alias,
                    param_grad,
                    self._recomputing,
                    matmul,
                    bool(save or saves_other or save_out or extra),
                    cast,
                    shared_weight,
                    releases,
                    view_grads,
                    input_grad_first,
                    grads_in_order,
                )
            )
        if extra:
            self.drop(*extra)  # no Python name holds them
        if grad and (save_out or extra):
            self._pack()
        return result

    def _hold(self, tids: Sequence[int]) -> tuple[int, ...]:
        """Attributes of a backward function in a checkpointed region: its first forward
        keeps them until that function's backward (returned then, by the recompute's
        same op); the recompute keeps its own until it ends."""
        if self._recomputing:
            for tid in tids:
                self.tensors[tid].refs += 1
            self._recompute_held.extend(tids)
            count = min(len(tids), len(self._held_queue))
            released = tuple(self._held_queue[:count])
            del self._held_queue[:count]
            return released
        if not self.saving and self._held is not None:
            for tid in tids:
                self.tensors[tid].refs += 1
            self._held.extend(tids)
        return ()

    def _pack(self) -> None:
        """A pack event; in a recompute, the last one stops it (checkpoint's early stop)."""
        if not self._recomputing:
            self._packs += 1
            return
        self._packs -= 1
        if self._packs == 0 and not self._stopped:
            # _StopRecomputationError unwinds the region: its Python names let go.
            self._stopped = True
            for tid in sorted(self._locals, reverse=True):  # innermost frame first
                self.drop(tid)
                self._unwound.add(tid)
            self._release_recompute_held()

    def checkpoint(
        self, region: Callable[..., int], x: int, outputs: list[int] | None = None
    ) -> int:
        """Run ``region`` on ``x`` without saving; keep ``x`` for the recompute.

        ``outputs``: the checkpointed function's further outputs (eager attention's
        weights) stay referenced by the caller, which drops them: the first forward
        hands ``region`` the list as its third argument; the recompute does not, and
        its outputs go with the region's locals."""
        saving, self.saving = self.saving, False
        packs, self._packs = self._packs, 0
        self._held, self._arguments = [], []
        out = region(self, x) if outputs is None else region(self, x, outputs)
        held, self._held = tuple(self._held), None
        arguments, self._arguments = tuple(self._arguments), None
        self.saving = saving
        self.requires_grad(out)
        self.tensors[x].refs += 1
        self.graph.append(CheckpointedRegion(region, x, out, self._packs, held, arguments))
        self._packs = packs
        return out

    def hold_arguments(self, *tids: int) -> None:
        """Tensors a checkpointed region reads besides its input (the checkpointed
        function's other arguments, T5's position bias): torch's checkpoint keeps them
        for the recompute, so its first forward holds them until the region's backward is
        done.  Outside a region's first forward, nothing."""
        if self._arguments is None:  # not in a region's first forward (nor a recompute)
            return
        for tid in tids:
            self.tensors[tid].refs += 1
        self._arguments.extend(tids)

    def _release_recompute_held(self) -> None:
        """The recompute's graph is freed when it ends (or stops early): its attributes."""
        held, self._recompute_held = self._recompute_held, []
        for tid in held:  # a reference of its own, whatever the early stop did to the names
            self._release(tid)
