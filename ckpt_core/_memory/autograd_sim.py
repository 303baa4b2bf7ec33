"""A small replay of autograd's memory behaviour on top of `CachingAllocator`.

Tensors are sizes with reference counts: a forward op allocates its outputs,
saves what its backward needs (a reference held until that backward ran) and
the program drops each intermediate where the Python variable dies; a view
(a slice, a chunk) allocates nothing and holds its base's storage.  The
backward walks the recorded ops in reverse: for each, it allocates the
gradients of the inputs that require one (same bytes as the input, as
autograd's gradients have the input's dtype; ``alias`` ops pass the gradient
through), then frees the incoming gradient and the op's saved tensors - the
order of autograd's engine with ``retain_graph=False``.  Checkpointed regions
record nothing in forward but their input; in backward, the region's last
backward functions that read no saved tensor run first (the engine reaches
them before the first unpack), then the region's forward is replayed with
saving on (non-reentrant checkpoint's recompute), which stops at the region's
last saved tensor (``torch.utils.checkpoint``'s early stop): what the region's
Python code still held then is freed, and the rest of the region only links
the graph (no allocation).

Pure Python; sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ckpt_core._memory.allocator import CachingAllocator


@dataclass(slots=True)
class _Tensor:
    handle: tuple[int, int] | None  # None: never allocated (after a recompute's early stop)
    refs: int
    base: int | None = None  # a view's: the tensor whose storage it holds


@dataclass(slots=True)
class _Op:
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


@dataclass(slots=True)
class _Checkpoint:
    region: Callable[..., int]
    inputs: int
    output: int
    packs: int  # tensors the region saves for backward (checkpoint's pack-hook calls)
    held: tuple[int, ...] = ()  # what its nodes keep as attributes, out of the hooks' sight


@dataclass(slots=True)
class Sim:
    """The simulated device: tensors, the recorded graph, the allocator."""

    allocator: CachingAllocator = field(default_factory=CachingAllocator)
    tensors: dict[int, _Tensor] = field(default_factory=dict)
    info: dict[int, tuple[int, bool]] = field(default_factory=dict)  # tid -> (bytes, grad)
    graph: list[_Op | _Checkpoint] = field(default_factory=list)
    saving: bool = True
    accumulate: bool = False  # gradients allocated before the step and kept
    # The backward's first weight gradient (a tied LM head's) is summed with a later one.
    first_grad_shared: bool = False
    param_grads: list[int] = field(default_factory=list)  # gradient tensors of parameters
    # cuBLAS workspace autograd's device thread (a handle of its own) allocates at its
    # first matmul and keeps: 0 once allocated (`ckpt_core._memory.workspace`).
    blas_workspace: int = 0
    # The Python thread's, at the forward's first matmul when no earlier op made it.
    forward_workspace: int = 0
    _next: int = 0
    _packs: int = 0  # pack events counted (forward) or left (recompute)
    _recomputing: bool = False
    _stopped: bool = False
    _locals: set[int] = field(default_factory=set)  # the recompute's live tensors
    _unwound: set[int] = field(default_factory=set)  # freed by the early stop
    # A recompute's mallocs and frees, held back while the region's last backward
    # functions run (`_recompute`): (handle or placeholder, bytes; None for a free).
    _deferred: list[tuple[tuple[int, int], int | None]] | None = None
    _pending: list[int] = field(default_factory=list)  # tensors made while deferred
    _view_grads: set[int] = field(default_factory=set)  # gradients that are views (`op`)
    # Tensors a backward function keeps as an attribute (``ctx.x = x``), which checkpoint's
    # saved-tensor hooks never see: held by a checkpointed region's first forward, by its
    # recompute until that ends, and, in the recompute's order, the first forward's to free.
    _held: list[int] | None = None
    _recompute_held: list[int] = field(default_factory=list)
    _held_queue: list[int] = field(default_factory=list)
    # Accumulating, the tied LM head's gradient waits in AccumulateGrad's input buffer.
    _first_grad: int | None = None

    # --- tensors ---
    def new(self, size: int, grad: bool = False) -> int:
        tid = self._next
        self._next += 1
        handle = None if self._stopped else self._malloc(size)
        if handle is not None and self._deferred is not None:
            self._pending.append(tid)
        self.tensors[tid] = _Tensor(handle, 1)
        self.info[tid] = (size, grad)
        if self._recomputing:
            self._locals.add(tid)
        return tid

    def drop(self, *tids: int) -> None:
        for tid in tids:
            if tid in self._unwound:  # the early stop already let this name go
                self._unwound.discard(tid)
                continue
            self._locals.discard(tid)
            self._release(tid)

    def _release(self, tid: int) -> None:
        """One reference fewer; at none the storage is freed (a view's: its base's reference)."""
        tensor = self.tensors[tid]
        tensor.refs -= 1
        if tensor.refs == 0:
            if tensor.handle is not None:
                self._free(tensor.handle)
            del self.tensors[tid]
            if tensor.base is not None:
                self._release(tensor.base)

    def _malloc(self, size: int) -> tuple[int, int]:
        if self._deferred is None:
            return self.allocator.malloc(size)
        placeholder = (-1, len(self._deferred))  # no real segment is negative
        self._deferred.append((placeholder, size))
        return placeholder

    def _free(self, handle: tuple[int, int]) -> None:
        if self._deferred is None:
            self.allocator.free(handle)
        else:
            self._deferred.append((handle, None))

    def _replay(self, events: list[tuple[tuple[int, int], int | None]]) -> None:
        """Make the held-back mallocs and frees, then point live tensors at their blocks."""
        real: dict[tuple[int, int], tuple[int, int]] = {}
        for handle, size in events:
            if size is None:
                self.allocator.free(real.pop(handle, handle))
            else:
                real[handle] = self.allocator.malloc(size)
        for tid in self._pending:
            tensor = self.tensors.get(tid)
            if tensor is not None and tensor.handle is not None:
                tensor.handle = real[tensor.handle]
        self._pending.clear()

    @property
    def recomputing(self) -> bool:
        """Whether a checkpointed region's forward is being replayed for its backward."""
        return self._recomputing

    def size(self, tid: int) -> int:
        return self.info[tid][0]

    def storage_bytes(self, tids: Iterable[int]) -> int:
        """Bytes of the storages ``tids`` hold: a view counts as its base, each base once."""
        bases = set()
        for tid in tids:
            root = tid
            while (base := self.tensors[root].base) is not None:
                root = base
            bases.add(root)
        return sum(self.size(tid) for tid in bases)

    def requires_grad(self, tid: int) -> None:
        self.info[tid] = (self.info[tid][0], True)

    def hold(self, tid: int) -> int:
        """One more reference to ``tid`` (a holder the replay does not name), dropped later."""
        self.tensors[tid].refs += 1
        return tid

    # --- forward ---
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

    def _view(self, base: int, size: int, grad: bool) -> int:
        tid = self._next
        self._next += 1
        self.tensors[base].refs += 1
        self.tensors[tid] = _Tensor(None, 1, base)
        self.info[tid] = (size, grad)
        if self._recomputing:
            self._locals.add(tid)
        return tid

    def _link(self, inputs: tuple[int, ...], outputs: tuple[int, ...], *, alias: bool) -> None:
        """Record an op that allocates nothing in forward (a view, an in-place add)."""
        self.graph.append(
            _Op(
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
                _Op(
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
        self._held = []
        out = region(self, x) if outputs is None else region(self, x, outputs)
        held, self._held = tuple(self._held), None
        self.saving = saving
        self.requires_grad(out)
        self.tensors[x].refs += 1
        self.graph.append(_Checkpoint(region, x, out, self._packs, held))
        self._packs = packs
        return out

    def _release_recompute_held(self) -> None:
        """The recompute's graph is freed when it ends (or stops early): its attributes."""
        held, self._recompute_held = self._recompute_held, []
        for tid in held:  # a reference of its own, whatever the early stop did to the names
            self._release(tid)

    # --- backward ---
    def backward(
        self, root: int, on_op: Callable[[], None] | None = None, leaves: Sequence[int] = ()
    ) -> list[int]:
        """Backward from the scalar ``root``: the recorded graph in reverse, then cleared.

        Returns the gradients of ``leaves`` (tensors that require grad and have no
        history: AccumulateGrad stores them in ``.grad``), which the caller drops;
        every other gradient left is freed as the engine returns.
        """
        grads: dict[int, int] = {root: self.new(4)}
        while self.graph:
            node = self.graph.pop()
            if isinstance(node, _Checkpoint):
                self._recompute(node, grads)
                continue
            self._backward_op(node, grads)
            if on_op is not None:
                on_op()
        kept = [grads.pop(tid) for tid in leaves if tid in grads]
        for tid in list(grads.values()):
            self.drop(tid)
        return kept

    def _backward_op(self, node: _Op, grads: dict[int, int]) -> None:
        incoming = [grads.pop(t) for t in node.outputs if t in grads]
        # A second gradient of a tensor is summed into the first in place, and freed,
        # once the function has returned and released its saved tensors
        # (torch/csrc/autograd/engine.cpp evaluate_function, InputBuffer::add).
        summed: list[tuple[int, int]] = []  # (input, its second gradient)
        if incoming:
            held = [self.new(size) for size in node.temporaries]
            weight_grad = None
            if node.param_grad and not node.input_grad_first:
                weight_grad = self._weight_grad(node)
            # The generated backward functions compute the last input's gradient first
            # (BmmBackward0: mat2 before self; MulBackward0: other before self).
            for tid in reversed(node.inputs):
                size, grad = self.info[tid]
                if not grad:
                    continue
                cast = node.cast and size != self.size(node.outputs[0])
                if node.alias and tid not in grads and not cast:
                    grads[tid] = incoming[0]
                    self.tensors[incoming[0]].refs += 1
                    continue
                if cast and not node.alias:  # made in the output's dtype, then cast
                    wide = self.new(self.size(node.outputs[0]))
                    fresh = self.new(size)
                    self.drop(wide)
                else:
                    fresh = self.new(size)
                if tid in grads:
                    summed.append((tid, fresh))
                else:
                    grads[tid] = fresh
                    if node.view_grads:
                        self._view_grads.add(fresh)
            if node.matmul and self.blas_workspace:
                # cuBLAS asks for the thread's workspace after the output is allocated;
                # it is never freed, wherever best fit put it (a freed logits block).
                self.new(self.blas_workspace)
                self.blas_workspace = 0
            if node.param_grad and node.input_grad_first:
                weight_grad = self._weight_grad(node)
            self.drop(*[self.new(size) for size in node.scratch])
            self.drop(*held)
            if node.unpacked:
                # checkpoint's unpack hook hands the recomputed tensor over and forgets it:
                # it dies with the backward function's locals, before the engine frees the
                # incoming gradient (torch/autograd/engine.cpp call_function).
                self.drop(*node.saved, *incoming, *node.releases)
                self._settle(node, weight_grad)
                self._sum(summed, grads)
                return
            self.drop(*incoming)
            self._settle(node, weight_grad)
        self.drop(*node.saved, *node.releases)
        self._sum(summed, grads)

    def _sum(self, summed: list[tuple[int, int]], grads: dict[int, int]) -> None:
        """The engine's input buffer: a second gradient is added into the first in place
        and freed, unless the first shares its storage (a view: ``can_accumulate_inplace``
        fails), when ``old + new`` is made, then both are freed."""
        for tid, fresh in summed:
            first = grads[tid]
            if first in self._view_grads:
                grads[tid] = self.new(self.size(first))
                self.drop(first)
            self.drop(fresh)

    def _weight_grad(self, node: _Op) -> int:
        """The backward's weight gradient, which AccumulateGrad steals as ``.grad``."""
        grad = self.new(node.param_grad)
        if not node.shared_weight and not self.accumulate:
            self.param_grads.append(grad)
        return grad

    def _settle(self, node: _Op, grad: int | None) -> None:
        """What AccumulateGrad does with a weight's gradient, right after the backward
        function: a second gradient of one weight is summed with the first; into an
        existing ``.grad`` (``accumulate``) it is added in place and freed - unless it is
        the tied LM head's, which waits for the embedding's."""
        if grad is None:
            return
        if node.shared_weight:
            self._sum_with_first_weight_grad(grad)
        elif self.accumulate:
            if self.first_grad_shared and self._first_grad is None:
                self._first_grad = grad
            else:
                self.drop(grad)

    def _sum_with_first_weight_grad(self, grad: int) -> None:
        """A second gradient of one weight, reaching its AccumulateGrad after the first:
        the engine's input buffer sums the two out of place (torch/csrc/autograd/
        input_buffer.cpp), then frees both; the sum becomes the weight's gradient."""
        if self.accumulate:  # the sum is then added into .grad in place
            first, self._first_grad = self._first_grad, None
            assert first is not None, "a second gradient of a weight before its first"
            total = self.new(self.size(grad))
            self.drop(first, grad, total)
            return
        first = self.param_grads[0]  # the LM head's backward ran first of all
        total = self.new(self.size(grad))
        self.param_grads[0] = total
        self.drop(first, grad)

    def _recompute(self, node: _Checkpoint, grads: dict[int, int]) -> None:
        outer = self.graph
        self.graph = []
        self.requires_grad(node.inputs)
        self._recomputing, self._stopped, self._packs = True, False, node.packs
        self._held_queue = list(node.held)
        self._deferred = []
        out = node.region(self, node.inputs)
        self._release_recompute_held()
        events, self._deferred = self._deferred, None
        self._recomputing = self._stopped = False
        # The early stop lets the output go too when the region's last op saves a tensor
        # made after it (a dropout's mask).
        out_alive = out not in self._unwound
        self._locals.clear()
        self._unwound.clear()
        if node.output in grads:
            grads[out] = grads.pop(node.output)
        inner, self.graph = self.graph, outer
        # The engine reaches the region's last backward functions first; those that read
        # no saved tensor (a cast, an add, PEFT's `* scaling`) run before the first unpack
        # starts the recompute (torch/utils/checkpoint.py _checkpoint_hook.unpack_hook).
        while inner and isinstance(inner[-1], _Op) and not inner[-1].unpacks:
            self._backward_op(inner.pop(), grads)
        self._replay(events)
        if out_alive:
            self.drop(out)
        while inner:
            item = inner.pop()
            if isinstance(item, _Op):
                self._backward_op(item, grads)
        self.drop(node.inputs, *self._held_queue)  # nodes the recompute never reached
        self._held_queue = []
