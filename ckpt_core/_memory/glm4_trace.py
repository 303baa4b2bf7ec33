"""GLM-4's and GLM's decoder layers, for the step replay.

Glm4DecoderLayer is Gemma's sandwich of four norms (before and after the
attention and the MLP) with Llama's RMSNorm, q / k / v with biases, Phi-3's
fused gate / up projection, and a RoPE of its own: each layer interleaves the
first half of cos and sin into copies (``repeat_interleave``), which its
products keep, and rotates only the leading ``partial_rotary_factor`` of each
head, concatenating the rest back.  Embeddings, masks, the linears, the
attention kernels and the MLP are the shared ones.  GlmDecoderLayer (GLM-4-9B's
first release) is Llama's layer around the same attention and MLP.  Sizes in bytes.
"""

from __future__ import annotations

import functools

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention_trace import attend
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import norm
from ckpt_core._memory.layer_trace import post_normed_block, projections
from ckpt_core._memory.linear_trace import TraceRecipe
from ckpt_core._memory.model_trace import TraceModel, llama_layer, llama_prepare


def _attention(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    held: list[int] | None = None,
    rotary: bool = True,
) -> int:
    """Glm4Attention.forward (GlmAttention's is the same): q, k and v projected, RoPE
    (`_rope`), then attention; the rebinding frees the projections."""
    query, key, value = projections(sim, x, arch, recipe)
    query_r, key_r = query, key
    if rotary:
        query_r, key_r = _rope(sim, query, key, arch=arch, recipe=recipe)
        sim.drop(query, key)
    out = attend(sim, query_r, key_r, value, arch=arch, recipe=recipe, mask=mask, held=held)
    sim.drop(query_r, key_r, value)
    return out


def _rope(sim: Sim, query: int, key: int, *, arch: Arch, recipe: TraceRecipe) -> list[int]:
    """GLM-4's apply_rotary_pos_emb: ``cos[..., : d // 2].repeat_interleave(2)`` (and
    sin's), the layer's copies, which ``q_rot * cos`` and ``rotate_half(q_rot) * sin``
    keep; q and k sliced into the rotated part and the rest; both rotated parts made,
    then each concatenated with its rest."""
    tokens, act, rot, d = recipe.batch * recipe.seq, recipe.act, arch.rope_dim, arch.head_dim
    cos, sin = sim.new(act * recipe.seq * rot), sim.new(act * recipe.seq * rot)
    parts = []
    for x, heads in ((query, arch.heads), (key, arch.kv_heads)):
        size = act * tokens * heads * rot
        (rotated_part,) = sim.views(x, [size])
        (rest,) = sim.views(x, [act * tokens * heads * (d - rot)])
        times_cos = sim.op([rotated_part], size, save=[cos])
        negated = sim.op([rotated_part], size // 2)  # -x2 of rotate_half's stack((-x2, x1))
        rotated = sim.op([negated, rotated_part], size, alias=True)
        sim.drop(negated)
        times_sin = sim.op([rotated], size, save=[sin])
        sim.drop(rotated)
        parts.append((sim.op([times_cos, times_sin], size, alias=True), rest))
        sim.drop(times_cos, times_sin, rotated_part)
    out = []
    for (embed, rest), heads in zip(parts, (arch.heads, arch.kv_heads), strict=True):
        out.append(sim.op([embed, rest], act * tokens * heads * d, alias=True))  # torch.cat
        sim.drop(embed, rest)
    sim.drop(cos, sin)  # apply_rotary_pos_emb returns: its locals die
    return out


# Glm4DecoderLayer.forward: input_layernorm, self_attn, post_self_attn_layernorm, the
# residual add, post_attention_layernorm, the MLP, post_mlp_layernorm, the residual add.
GLM4 = TraceModel(
    prepare=llama_prepare,
    block=post_normed_block(_attention, norm, pre_norms=True),
    norm=norm,
)

# GlmDecoderLayer.forward: Llama's, around GLM-4's attention.
GLM = TraceModel(
    prepare=llama_prepare,
    block=functools.partial(llama_layer, self_attention=_attention),
    norm=norm,
)
