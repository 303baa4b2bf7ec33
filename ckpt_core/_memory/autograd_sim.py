"""A small replay of autograd's memory behaviour on top of `CachingAllocator`.

`Graph` records the forward (``autograd_graph``); `Sim.backward` walks the recorded
ops in reverse: for each, it allocates the gradients of the inputs that require
one (same bytes as the input, as autograd's gradients have the input's dtype;
``alias`` ops pass the gradient through), then frees the incoming gradient and
the op's saved tensors - the order of autograd's engine with
``retain_graph=False``.  For a checkpointed region, the region's last backward
functions that read no saved tensor run first (the engine reaches them before
the first unpack), then the region's forward is replayed with saving on
(non-reentrant checkpoint's recompute), which stops at the region's last saved
tensor (``torch.utils.checkpoint``'s early stop): what the region's Python code
still held then is freed, and the rest of the region only links the graph (no
allocation).

Pure Python; sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ckpt_core._memory.autograd_graph import CheckpointedRegion, Graph, RecordedOp


@dataclass(slots=True)
class Sim(Graph):
    """The simulated device: its tensors, the recorded graph, and autograd's backward."""

    accumulate: bool = False  # gradients allocated before the step and kept
    # The backward's first weight gradient (a tied LM head's) is summed with a later one.
    first_grad_shared: bool = False
    param_grads: list[int] = field(default_factory=list)  # gradient tensors of parameters
    # cuBLAS workspace autograd's device thread (a handle of its own) allocates at its
    # first matmul and keeps: 0 once allocated (`ckpt_core._memory.workspace`).
    blas_workspace: int = 0
    _view_grads: set[int] = field(default_factory=set)  # gradients that are views (`op`)
    # Accumulating, the tied LM head's gradient waits in AccumulateGrad's input buffer.
    _first_grad: int | None = None

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
            if isinstance(node, CheckpointedRegion):
                self._recompute(node, grads)
                continue
            self._backward_op(node, grads)
            if on_op is not None:
                on_op()
        kept = [grads.pop(tid) for tid in leaves if tid in grads]
        for tid in list(grads.values()):
            self.drop(tid)
        return kept

    def _backward_op(self, node: RecordedOp, grads: dict[int, int]) -> None:
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
            wides: list[int] = []  # gradients made in the output's dtype, to be cast
            casts: list[tuple[int, int]] = []  # their inputs and the inputs' sizes
            for tid in node.inputs if node.grads_in_order else reversed(node.inputs):
                size, grad = self.info[tid]
                if not grad:
                    continue
                cast = node.cast and size != self.size(node.outputs[0])
                if node.alias and tid not in grads and not cast:
                    grads[tid] = incoming[0]
                    self.tensors[incoming[0]].refs += 1
                    continue
                if cast and not node.alias:
                    wides.append(self.new(self.size(node.outputs[0])))
                    casts.append((tid, size))
                    continue
                self._take(node, tid, self.new(size), grads, summed)
            if wides:
                # The engine's validate_outputs casts them, in input order, once the
                # function has returned them all; the wide ones die after.
                for tid, size in casts if node.grads_in_order else reversed(casts):
                    self._take(node, tid, self.new(size), grads, summed)
                self.drop(*wides)
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

    def _take(
        self,
        node: RecordedOp,
        tid: int,
        fresh: int,
        grads: dict[int, int],
        summed: list[tuple[int, int]],
    ) -> None:
        """``fresh`` is input ``tid``'s gradient: its first, or a second to sum into it."""
        if tid in grads:
            summed.append((tid, fresh))
        else:
            grads[tid] = fresh
            if node.view_grads:
                self._view_grads.add(fresh)

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

    def _weight_grad(self, node: RecordedOp) -> int:
        """The backward's weight gradient, which AccumulateGrad steals as ``.grad``."""
        grad = self.new(node.param_grad)
        if not node.shared_weight and not self.accumulate:
            self.param_grads.append(grad)
        return grad

    def _settle(self, node: RecordedOp, grad: int | None) -> None:
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

    def _recompute(self, node: CheckpointedRegion, grads: dict[int, int]) -> None:
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
        while inner and isinstance(inner[-1], RecordedOp) and not inner[-1].unpacks:
            self._backward_op(inner.pop(), grads)
        self._replay(events)
        if out_alive:
            self.drop(out)
        while inner:
            item = inner.pop()
            if isinstance(item, RecordedOp):
                self._backward_op(item, grads)
        self.drop(node.inputs, *self._held_queue)  # nodes the recompute never reached
        self.drop(*node.arguments)
        self._held_queue = []
