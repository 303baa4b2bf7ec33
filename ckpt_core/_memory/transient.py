"""The transient working set of the backward pass, on top of the kept activations.

Two moments compete for the step's peak (`ckpt_core._memory.estimate` takes the larger):

- the loss backward, right after forward: the gradient of the log-softmax and
  its input, each vocab x tokens (fp32 for causal LMs, whose loss upcasts the
  logits; the dtype for BERT / T5).  Logit softcapping's gradients come after
  both are freed, one logits-sized tensor at a time;
- the worst block's backward (`worst_block_backward`): the blocks after it
  have freed what they kept; a checkpointed block is recomputed first, so its
  activations exist again (for selective, its attention's), plus the gradient
  buffers of the block's widest op (MLP intermediate, MoE expert rows, an
  adapted expert stack, or the s x s scores of eager attention) and two
  hidden-size gradients.

Checked against ``MemTracker``'s peak of a training step on meta (eager
attention, gradients held; measured here): when the loss backward is the peak
(Llama-3.2-1B, seq 1024-4096, every tier) weights + gradients + activations +
this transient equal it; when a block's backward is the peak it errs high,
because it holds the whole recomputed block with the widest gradients and does
not subtract the head's buffers, already freed by then (Llama-2-7B shape, seq
1024, full: +0.9 % with 32 layers, +3.1 % with 8; seq 2048, 4 layers, medium:
+4.2 %).  Pure arithmetic.
"""

from __future__ import annotations

import functools

from ckpt_core._memory.activations import Assignment, block_bytes, block_layout, block_modes
from ckpt_core._memory.arch import Arch, BlockKind
from ckpt_core._memory.attention import any_math_kernel, eager_softmax_bytes
from ckpt_core._memory.families import family_of
from ckpt_core._memory.ledger import BlockMode, Step
from ckpt_core._memory.moe_trace import DOWN, GATE_UP
from ckpt_core._memory.placement import place


def transient_bytes(arch: Arch, step: Step, assignment: Assignment) -> int:
    """Bytes allocated temporarily during the backward of ``assignment`` (the larger moment)."""
    return max(
        loss_backward(arch, step),
        worst_block_backward(arch, step, assignment) + widest_gradients(arch, step),
    )


@functools.lru_cache(maxsize=1024)
def loss_backward(arch: Arch, step: Step) -> int:
    logits = step.tokens * arch.vocab
    loss_bytes = 4 if family_of(arch).loss_in_fp32 else step.dtype_bytes
    return 2 * loss_bytes * logits


def worst_block_backward(arch: Arch, step: Step, assignment: Assignment, gradients: int = 0) -> int:
    """What a block's backward holds beyond the kept activations, at its worst block.

    The backward differentiates the blocks in reverse module order: when it reaches
    a block, the blocks after it have freed what they kept and made their parameters'
    gradients (``gradients`` bytes a block: kept to the optimizer step), and the block
    holds its whole forward again (a checkpointed block is recomputed; a selective
    one, its attention).  So at block ``i`` the kept activations lose what blocks
    ``i`` onwards keep, and gain their gradients and block ``i``'s plain activations;
    the largest of these over the blocks, placed as the plan's hooks place them
    (`place`).  A plan that leaves its last block unchecked (medium on an even
    count, a block-level plan) holds no more than the kept activations there: its
    recomputed blocks come after that block's kept storages are freed.
    """
    worst = after = 0
    for mode, kind in reversed(_placed_modes(arch, assignment)):
        after += block_bytes(arch, step, mode, kind)[0] - gradients
        worst = max(worst, block_bytes(arch, step, "off", kind)[0] - after)
    return worst


@functools.lru_cache(maxsize=1024)
def _placed_modes(arch: Arch, assignment: Assignment) -> tuple[tuple[BlockMode, BlockKind], ...]:
    """(mode, kind) of every block in module order: a tier's modes, or where `place`
    puts a block-level plan's."""
    layout = block_layout(arch)
    if isinstance(assignment, str):
        modes = block_modes(arch, assignment)
    else:
        plan = place(arch, assignment)
        full, selective = set(plan.full), set(plan.selective)
        modes = [
            "full" if counter in full else "selective" if counter in selective else "off"
            for counter, _, _, _ in layout
        ]
    return tuple((mode, kind) for mode, (_, _, _, kind) in zip(modes, layout, strict=True))


@functools.lru_cache(maxsize=1024)
def widest_gradients(arch: Arch, step: Step) -> int:
    elem_bytes, tokens = step.dtype_bytes, step.tokens
    inner = max(arch.intermediate, arch.shared_expert_intermediate) * (2 if arch.glu else 1)
    widest = elem_bytes * tokens * inner
    if arch.is_moe:  # the gated product's backward: its rows' gradient and both factors'
        widest = max(widest, 3 * elem_bytes * tokens * arch.top_k * arch.moe_intermediate)
    # PEFT's parametrized stacks: each grouped matmul's backward makes a stack-sized gradient
    # with its input rows' gradient while the rebuilt stack is kept; down_proj's comes
    # first, and its rebuilt stack is freed with its node, before gate_up_proj's.
    rows, inter = tokens * arch.top_k, arch.moe_intermediate
    stack = step.residual_bytes * arch.experts * inter * arch.hidden
    down = stack if step.adapted(DOWN) else 0
    if down:
        widest = max(widest, down + elem_bytes * rows * inter)
    if step.adapted(GATE_UP):
        widest = max(widest, 2 * stack - down + elem_bytes * rows * arch.hidden)
    scores = step.batch * arch.heads * step.seq * step.seq
    if step.attention == "eager":  # the softmax's output and its input's gradient
        widest = max(widest, (eager_softmax_bytes(arch, elem_bytes) + elem_bytes) * scores)
    elif any_math_kernel(arch, step):  # the fp32 softmax's incoming and input gradients
        widest = max(widest, 8 * scores)
    return widest + 2 * elem_bytes * tokens * arch.hidden
