"""EXAONE 4's decoder layer, for the step replay.

Exaone4DecoderLayer normalizes each branch's output before its residual add
(post-norms, as OLMo-2's, but with Llama's RMSNorm), normalizes q and k per
head once all three projections are made, and, when the model has a sliding
window, applies RoPE on its sliding layers only (its global layers use no
positions).  Embeddings, masks, the linears, the attention kernels and the MLP
are the shared ones.  Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import attend, norm, post_normed_layer, rope
from ckpt_core._memory.linear_trace import TraceRecipe, linear
from ckpt_core._memory.model_trace import Inputs, TraceModel, llama_prepare


def exaone4_block(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    inputs: Inputs,
    index: int,
    selective: bool = False,
) -> int:
    """Exaone4DecoderLayer.forward: self_attn on the block input, post_attention_layernorm,
    the residual add, the MLP, post_feedforward_layernorm, the residual add."""
    tokens = recipe.batch * recipe.seq
    mask = inputs.layer_mask(arch, index)
    rotary = not (arch.nope_layers and arch.nope_layers[index])

    def attention(s: Sim, y: int, held: list[int] | None = None) -> int:
        return _attention(s, y, arch=arch, recipe=recipe, mask=mask, held=held, rotary=rotary)

    def layer_norm(s: Sim, y: int) -> int:
        return norm(s, y, tokens, arch.hidden, recipe)

    return post_normed_layer(
        sim,
        x,
        arch=arch,
        recipe=recipe,
        attention=attention,
        layer_norm=layer_norm,
        pre_norms=False,
        selective=selective,
    )


def _attention(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    held: list[int] | None,
    rotary: bool,
) -> int:
    """Exaone4Attention.forward: q, k and v projected, then ``q_norm`` and ``k_norm`` over
    each head (a projection dies as its name is rebound to the norm's output), RoPE
    unless the layer uses no positions, then attention."""
    tokens, act, d = recipe.batch * recipe.seq, recipe.act, arch.head_dim
    h, q, kv = arch.hidden, arch.heads * d, arch.kv_heads * d
    query = linear(sim, x, "self_attn.q_proj", (h, q), recipe)
    key = linear(sim, x, "self_attn.k_proj", (h, kv), recipe)
    value = linear(sim, x, "self_attn.v_proj", (h, kv), recipe)
    normed = []
    for raw, heads in ((query, arch.heads), (key, arch.kv_heads)):
        normed.append(norm(sim, raw, tokens * heads, d, recipe, dtype=act))
        sim.drop(raw)
    query, key = normed
    if rotary:
        query_r, key_r = rope(sim, query, act * tokens * q), rope(sim, key, act * tokens * kv)
        sim.drop(query, key)
        query, key = query_r, key_r
    out = attend(sim, query, key, value, arch=arch, recipe=recipe, mask=mask, held=held)
    sim.drop(query, key, value)
    return out


EXAONE4 = TraceModel(prepare=llama_prepare, block=exaone4_block, norm=norm)
