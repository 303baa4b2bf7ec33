"""The allocated peak of one real training step: the moments that compete for it.

`ckpt_core._memory.estimate` holds what is resident all step (weights, optimizer
states) and `ckpt_core._memory.activations` what autograd keeps at the end of the
forward.  On top of them, four moments of a step on a CUDA device compete
for ``torch.cuda.max_memory_allocated()`` (the recipe: `Recipe`):

- the loss backward, right after the forward: every kept activation, the
  logits the caller still holds (``out.logits``, in the LM head's output
  dtype: fp32 after PEFT's kbit preparation, whose LM head is fp32), and the
  log-softmax backward's two loss-dtype vocab x tokens buffers;
- a block's backward: the head's kept storages are freed by then, and so are
  those of the blocks differentiated before it; the block holds its whole
  forward again (recomputed when checkpointed) and its widest gradients
  (`ckpt_core._memory.transient`), plus
  what the meta trace does not show: CUDA's eager-attention backward holds one
  more score-sized buffer in the compute dtype (counted on the shared T4 rows:
  softmax output, its fp32 gradient and two score-sized gradients coexist),
  and bitsandbytes dequantizes the widest quantized weight for the input
  gradient (4-bit: into the compute dtype; int8: into the input's dtype);
- the embedding's backward, the last op: every gradient, and for a full
  fine-tune with tied embeddings the input embedding's gradient and its sum
  with the LM head's;
- the optimizer step: every gradient, the states, and torch's foreach AdamW
  temporary (one state-sized tensor for the denominator; the fused step
  updates in place).

Gradients: with ``set_to_none`` they do not exist at the loss backward, and at
a block's backward the head's exist with those of the blocks differentiated so
far; with ``accumulate`` they are all allocated throughout.  Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckpt_core._memory.activations import Assignment, activation_bytes, head_bytes
from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention import any_math_kernel
from ckpt_core._memory.ledger import Step
from ckpt_core._memory.transient import loss_backward, widest_gradients, worst_block_backward

if TYPE_CHECKING:
    from ckpt_core._memory.step_trace import TraceRecipe


@dataclass(frozen=True, slots=True)
class Recipe:
    """What the workload says about a real step beyond the activation `Step`.

    ``logits_bytes``: bytes per element of the LM head's output (0: the
    caller drops the output before backward).  ``head_gradients``: gradient
    bytes of the embeddings / head (trained in a full fine-tune).
    ``block_gradients``: gradient bytes of the largest block.
    ``gradients_held``: every gradient is allocated all step (accumulation).
    ``optimizer_temporary``: bytes of the optimizer step's temporaries.
    ``dequantized``: bytes of the widest quantized weight as bitsandbytes dequantizes it
    for the input's gradient.
    """

    logits_bytes: int = 0
    gradients: int = 0
    head_gradients: int = 0
    block_gradients: int = 0
    gradients_held: bool = False
    optimizer_temporary: int = 0
    dequantized: int = 0
    trace: TraceRecipe | None = None  # the replay through the caching allocator


def allocated_moments(
    arch: Arch, step: Step, tier: Assignment, resident: int, recipe: Recipe
) -> dict[str, int]:
    """Allocated bytes at each competing moment; ``resident`` = weights + optimizer states."""
    activations = activation_bytes(arch, step, tier)
    held = recipe.logits_bytes * step.tokens * arch.vocab + _dropped_leaf(arch, step)
    loss = resident + activations + held + loss_backward(arch, step)
    # The head's gradients exist at every block's backward; the blocks' are made one block
    # at a time (`worst_block_backward`), unless all are allocated all step.
    head_grads, block_grads = recipe.head_gradients, recipe.block_gradients
    if recipe.gradients_held:
        loss += recipe.gradients
        head_grads, block_grads = recipe.gradients, 0
    # Accumulating, a tied LM head's new gradient waits for the embedding's (the input
    # buffer of their AccumulateGrad) from the head's backward to the embedding's.
    tied = recipe.head_gradients if arch.tied else 0
    waiting = tied if recipe.gradients_held else 0
    block = (
        resident
        + activations
        - head_bytes(arch, step)
        + held
        + head_grads
        + waiting
        + worst_block_backward(arch, step, tier, block_grads)
        + widest_gradients(arch, step)
        + _eager_extra(arch, step, recipe)
        + recipe.dequantized
    )
    optimizer = resident + recipe.gradients + held + recipe.optimizer_temporary
    # The backward's last op: a tied embedding's second gradient is summed with the LM
    # head's out of place (the engine's input buffer) while every other gradient exists;
    # accumulating, the new gradients (the sum too) are added into .grad in place.
    if recipe.gradients_held:
        new_gradients = 3 * tied if arch.tied else recipe.head_gradients // 2
    else:
        new_gradients = 2 * tied
    embedding = resident + recipe.gradients + held + new_gradients
    return {
        "loss_backward": loss,
        "block_backward": block,
        "embedding_backward": embedding,
        "optimizer_step": optimizer,
    }


def _dropped_leaf(arch: Arch, step: Step) -> int:
    """The embeddings' output when an op follows it before the first block, with adapters.

    PEFT's ``enable_input_require_grads`` makes the frozen embeddings' output a leaf
    that the step's graph holds to its end; when it is the first block's input, it is
    what that block keeps (an activation).  Dropout after it (StarCoder2, Phi, GPT-NeoX,
    GPT-2, BERT, T5) or learned positions added to it (GPT-2, BERT, OPT) make the
    block's input a new tensor, and the leaf is held besides."""
    if step.trainable_weights or (arch.embed_dropout <= 0 and not arch.positions):
        return 0
    return step.residual_bytes * step.tokens * arch.hidden


def _eager_extra(arch: Arch, step: Step, recipe: Recipe) -> int:
    """The score-sized gradient CUDA's eager backward holds beyond the meta trace (with
    sdpa's math backend: the fp32 softmax's).

    Scores in another half dtype than fp16 (bf16) reach an fp32 softmax through
    an fp32 copy, so the softmax's input gradient is fp32 rather than the
    dtype's; without a replay recipe the copy is assumed.  A softmax in the
    dtype (`Arch.softmax_in_dtype`) makes no copy.
    """
    scores = step.batch * arch.heads * step.seq * step.seq
    if any_math_kernel(arch, step):  # sdpa's math backend: an fp32 softmax, its fp32 gradient
        return 4 * scores
    if step.attention != "eager":
        return 0
    fp16 = recipe.trace is not None and recipe.trace.fp16
    copied = step.dtype_bytes < 4 and not fp16 and not arch.softmax_in_dtype
    return (step.dtype_bytes + (4 - step.dtype_bytes if copied else 0)) * scores
