"""Recompute cost per tier: (forward + backward FLOPs with the tier's recompute) / (without).

FLOPs are counted the way ``torch.utils.flop_counter.FlopCounterMode`` counts
them, so the ratio can be checked against it: matrix multiplications only,
2 FLOPs per multiply-add, attention over the full s x s (causal masking not
discounted; fused kernels' internal recomputation not counted).  Backward:
each matmul's input gradient and, for trained weights, its weight gradient
(each as many FLOPs as the forward); attention's backward is twice its forward.

Recompute adds the forward of what the tier checkpoints: every block (full),
every other block (medium), the attention modules (selective) - except a
region's last projection when nothing after it inside the region keeps a
tensor: non-reentrant checkpoint stops recomputing once every kept tensor is
back (``down_proj`` of a Llama block, ``o_proj`` of its attention).
FlopCounterMode does not count ``grouped_mm``, so for MoE experts the ratio
is this model's own.  Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_core._activations import block_modes
from ckpt_core._arch import Arch
from ckpt_core._ledger import Step


@dataclass(frozen=True, slots=True)
class BlockFlops:
    """Forward FLOPs of one block: its attention module(s) and the whole block."""

    attention_linear: int
    attention_core: int
    other_linear: int
    attention_tail: int = 0  # not recomputed when the attention module is the region
    block_tail: int = 0  # not recomputed when the block is the region

    @property
    def attention(self) -> int:
        return self.attention_linear + self.attention_core

    @property
    def total(self) -> int:
        return self.attention + self.other_linear

    def recomputed(self, mode: str) -> int:
        if mode == "ckpt":
            return self.total - self.block_tail
        if mode == "selective":
            return self.attention - self.attention_tail
        return 0


def recompute_ratio(arch: Arch, step: Step, tier: str) -> float:
    """FLOPs of a training step with ``tier``'s recompute over those without."""
    blocks = [
        (mode, _block(arch, step, stack, index)) for stack, index, mode in block_modes(arch, tier)
    ]
    linear = sum(b.attention_linear + b.other_linear for _, b in blocks) + _head(arch, step)
    core = sum(b.attention_core for _, b in blocks)
    weight_grads = linear if step.trainable_weights else 0
    base = (linear + core) + (linear + weight_grads + 2 * core)
    recompute = sum(b.recomputed(mode) for mode, b in blocks)
    return (base + recompute) / base


def _head(arch: Arch, step: Step) -> int:
    transform = arch.hidden * arch.hidden if arch.family == "bert" else 0
    return 2 * step.tokens * (arch.hidden * arch.vocab + transform)


def _core(arch: Arch, step: Step) -> int:
    """q @ k^T and probabilities @ v over the full s x s."""
    return 4 * step.batch * arch.heads * step.seq * step.seq * arch.head_dim


def _block(arch: Arch, step: Step, stack: int, index: int) -> BlockFlops:
    t, h, d = step.tokens, arch.hidden, arch.head_dim
    q, kv, inter = arch.heads * d, arch.kv_heads * d, arch.intermediate
    out_proj, down = 2 * t * q * h, 2 * t * inter * h
    no_dropout = arch.hidden_dropout <= 0  # a dropout after the projection keeps a mask
    if arch.family == "t5":
        attention = 2 * t * 4 * h * q  # q, k, v, o
        count = 2 if stack == 1 else 1  # the decoder adds cross-attention
        feed = 2 * t * h * inter * (3 if arch.glu else 2)
        return BlockFlops(
            count * attention,
            count * _core(arch, step),
            feed,
            attention_tail=count * out_proj if no_dropout else 0,
            block_tail=down if no_dropout else 0,
        )
    projections = 2 * t * (h * (q + 2 * kv) + q * h)
    if arch.family == "decoder" and arch.moe_layers[index]:
        mlp = 2 * t * (h * arch.experts + arch.top_k * 3 * h * arch.moe_intermediate)
        block_tail = 0  # the routing weights' multiply keeps the experts' output
    else:
        mlp = 2 * t * h * inter * (3 if arch.glu else 2)
        # post-norms (Gemma, OLMo-2) and BERT's LayerNorm keep the projection's output
        kept_after = arch.sandwich or arch.family == "bert" or not no_dropout
        block_tail = 0 if kept_after else down
    attention_kept_after = arch.family == "bert" or (arch.family == "gpt2" and not no_dropout)
    return BlockFlops(
        projections,
        _core(arch, step),
        mlp,
        attention_tail=0 if attention_kept_after else out_proj,
        block_tail=block_tail,
    )
