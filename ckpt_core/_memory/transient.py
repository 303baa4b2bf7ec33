"""The transient working set of the backward pass, on top of the kept activations.

Two moments compete for the step's peak (`ckpt_core._memory.estimate` takes the larger):

- the loss backward, right after forward: the gradient of the log-softmax and
  its input, each vocab x tokens (fp32 for causal LMs, whose loss upcasts the
  logits; the dtype for BERT / T5).  Logit softcapping's gradients come after
  both are freed, one logits-sized tensor at a time;
- one block's backward: a checkpointed block is recomputed first, so its
  activations exist again (for selective, its attention's), plus the gradient
  buffers of the block's widest op (MLP intermediate, MoE expert rows, or the
  s x s scores of eager attention) and two hidden-size gradients.

Checked against ``MemTracker``'s peak of a training step on meta (eager
attention, gradients held; measured here): when the loss backward is the peak
(Llama-3.2-1B, seq 1024-4096, every tier) weights + gradients + activations +
this transient equal it; when a block's backward is the peak it errs high,
because it holds the whole recomputed block with the widest gradients and does
not subtract the head's buffers, already freed by then (Llama-2-7B shape, seq
1024, full: +0.9 % with 32 layers, +3.1 % with 8).  Pure arithmetic.
"""

from __future__ import annotations

import functools

from ckpt_core._memory.activations import Assignment, largest_block, mode_counts
from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention import eager_softmax_bytes
from ckpt_core._memory.families import family_of
from ckpt_core._memory.ledger import Step


def transient_bytes(arch: Arch, step: Step, assignment: Assignment) -> int:
    """Bytes allocated temporarily during the backward of ``assignment`` (the larger moment)."""
    return max(
        loss_backward(arch, step),
        recomputed(arch, step, assignment) + widest_gradients(arch, step),
    )


@functools.lru_cache(maxsize=1024)
def loss_backward(arch: Arch, step: Step) -> int:
    logits = step.tokens * arch.vocab
    loss_bytes = 4 if family_of(arch).loss_in_fp32 else step.dtype_bytes
    return 2 * loss_bytes * logits


def recomputed(arch: Arch, step: Step, assignment: Assignment) -> int:
    """Activations a checkpointed block (or attention) holds again while it is differentiated.

    One region is recomputed at a time: the largest of the modes the assignment uses.
    """
    modes = {mode for (mode, _), count in mode_counts(arch, assignment) if count and mode != "off"}
    if not modes:
        return 0
    plain = largest_block(arch, step, "off")
    return max(plain - largest_block(arch, step, mode) for mode in modes)


@functools.lru_cache(maxsize=1024)
def widest_gradients(arch: Arch, step: Step) -> int:
    elem_bytes, tokens = step.dtype_bytes, step.tokens
    inner = max(arch.intermediate, arch.shared_expert_intermediate) * (2 if arch.glu else 1)
    widest = elem_bytes * tokens * inner
    if arch.is_moe:
        widest = max(widest, 2 * elem_bytes * tokens * arch.top_k * arch.moe_intermediate)
    if step.adapted("mlp.experts.gate_up_proj"):  # PEFT's parametrized weight's gradient
        stacked = arch.experts * 2 * arch.moe_intermediate * arch.hidden
        widest = max(widest, step.residual_bytes * stacked)
    if step.attention == "eager":  # the softmax's output and its input's gradient
        scores = step.batch * arch.heads * step.seq * step.seq
        widest = max(widest, (eager_softmax_bytes(arch, elem_bytes) + elem_bytes) * scores)
    return widest + 2 * elem_bytes * tokens * arch.hidden
