"""EXAONE 4's decoder layer, for the step replay.

Exaone4DecoderLayer normalizes each branch's output before its residual add
(post-norms, as OLMo-2's, but with Llama's RMSNorm), normalizes q and k per
head once all three projections are made, and, when the model has a sliding
window, applies RoPE on its sliding layers only (its global layers use no
positions).  Embeddings, masks, the linears, the attention kernels and the MLP
are the shared ones.  Sizes in bytes.
"""

from __future__ import annotations

import functools

from ckpt_core._memory.block_trace import norm
from ckpt_core._memory.layer_trace import post_normed_block, projected_attention
from ckpt_core._memory.model_trace import TraceModel, llama_prepare

# Exaone4Attention.forward: q, k and v projected, then q_norm and k_norm over each head.
_ATTENTION = functools.partial(projected_attention, head_norm=norm)
# Exaone4DecoderLayer.forward: self_attn on the block input, post_attention_layernorm,
# the residual add, the MLP, post_feedforward_layernorm, the residual add.
EXAONE4 = TraceModel(
    prepare=llama_prepare,
    block=post_normed_block(_ATTENTION, norm, pre_norms=False),
    norm=norm,
)
