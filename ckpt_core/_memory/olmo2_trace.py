"""OLMo-2's decoder layer, for the step replay.

Olmo2DecoderLayer differs from the Llama-style block of
`ckpt_core._memory.block_trace` in what it keeps: no norm before attention or
MLP, a norm after each (post-norms), q / k norms over the whole projections,
Olmo2RMSNorm scaling in fp32 before the cast back, and RoPE computed against
fp32 cos / sin (its products are fp32, cast back on return).  Embeddings,
masks, the linears, the attention kernels and the MLP are the shared ones.
Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention_trace import attend
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import fp32_scaled_norm, rope
from ckpt_core._memory.layer_trace import post_normed_block
from ckpt_core._memory.linear_trace import TraceRecipe, linear
from ckpt_core._memory.model_trace import TraceModel, llama_prepare


def olmo_norm(
    sim: Sim, x: int, rows: int, width: int, recipe: TraceRecipe, *, dtype: int | None = None
) -> int:
    """Olmo2RMSNorm.forward: ``hidden_states.to(float32)``, normalized, then
    ``(self.weight * hidden_states).to(input_dtype)`` (``dtype``: the input's bytes
    per element, the residual stream's unless given)."""
    dtype = recipe.residual if dtype is None else dtype
    return fp32_scaled_norm(sim, x, rows, width, recipe, dtype=dtype, normed_is_local=True)


def olmo2_attention(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    held: list[int] | None = None,
    rotary: bool = True,
) -> int:
    """Olmo2Attention.forward: ``q_norm(q_proj(x))`` (the projection dies as the norm
    returns), then k's, v; apply_rotary_pos_emb against fp32 cos / sin, whose fp32
    results live until both ``.to(q_type)`` casts are made (unless the layer uses no
    positions); then attention."""
    tokens, act = recipe.batch * recipe.seq, recipe.act
    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    normed = []
    for name, width in (("q", q), ("k", kv)):
        raw = linear(sim, x, f"self_attn.{name}_proj", (h, width), recipe, bias=arch.qkv_bias)
        normed.append(olmo_norm(sim, raw, tokens, width, recipe, dtype=act))
        sim.drop(raw)
    value = linear(sim, x, "self_attn.v_proj", (h, kv), recipe, bias=arch.qkv_bias)
    query, key = normed
    if not rotary:
        query_r, key_r = query, key
    elif act == 4:  # fp32 activations (kbit preparation): RoPE promotes nothing, casts nothing
        query_r, key_r = rope(sim, query, 4 * tokens * q), rope(sim, key, 4 * tokens * kv)
        sim.drop(query, key)
    else:
        query_w = rope(sim, query, act * tokens * q, wide=4 * tokens * q)
        key_w = rope(sim, key, act * tokens * kv, wide=4 * tokens * kv)
        query_r, key_r = sim.op([query_w], act * tokens * q), sim.op([key_w], act * tokens * kv)
        sim.drop(query_w, key_w, query, key)
    out = attend(sim, query_r, key_r, value, arch=arch, recipe=recipe, mask=mask, held=held)
    sim.drop(query_r, key_r, value)
    return out


# Olmo2DecoderLayer.forward: self_attn on the block input, post_attention_layernorm, the
# residual add, the MLP, post_feedforward_layernorm, the residual add.
OLMO2 = TraceModel(
    prepare=llama_prepare,
    block=post_normed_block(olmo2_attention, olmo_norm, pre_norms=False),
    norm=olmo_norm,
)
