"""Command R's decoder layer (Cohere, Cohere2), for the step replay.

CohereDecoderLayer normalizes its input once (CohereLayerNorm, written out in
fp32: ``x - mean`` twice, the variance, rstd, the weight's fp32 copy, the cast
back) and runs the attention and the MLP in parallel on it:
``residual + attention + mlp``.  Its RoPE upcasts q and k to fp32
(``q.float()``), rotates there against the model's cos / sin, and casts the
result back.  Embeddings, masks, the linears, the attention kernels and the MLP
are the shared ones.  Per-head q / k norms (``use_qk_norm``) are not replayed
here: such a model is replayed as Llama's block (`Family.replayed_exactly`).
Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention_trace import attend
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import fp32_scaled_norm, mlp, rope
from ckpt_core._memory.layer_trace import projections
from ckpt_core._memory.linear_trace import TraceRecipe
from ckpt_core._memory.model_trace import Inputs, TraceModel, llama_prepare


def cohere_norm(
    sim: Sim, x: int, rows: int, width: int, recipe: TraceRecipe, *, dtype: int | None = None
) -> int:
    """CohereLayerNorm.forward on ``x`` (``dtype``: its bytes per element, the residual
    stream's unless given): `_centered`, then ``weight.float() * ...``,
    whose rebinding frees the normalized value, then ``.to(input_dtype)``.  The
    weight's fp32 copy (width x 4 B, kept for the input's gradient) is left out: a
    small-pool block."""
    dtype = recipe.residual if dtype is None else dtype
    return fp32_scaled_norm(
        sim, x, rows, width, recipe, dtype=dtype, normed_is_local=False, normalize=_centered
    )


def _centered(sim: Sim, x: int, rows: int, width: int, *, dtype: int) -> int:
    """``x.to(float32)``, its mean, ``(x - mean).pow(2).mean()``, ``rsqrt(variance +
    eps)``, then ``(x - mean) * rstd``: ``x - mean`` is made twice, each kept by its
    product; each rebinding of ``hidden_states`` frees the value before."""
    n = rows * width
    upcast = sim.op([x], 4 * n) if dtype != 4 else x
    mean = sim.op([upcast], 4 * rows)
    centered = sim.op([upcast, mean], 4 * n)  # SubBackward0 saves nothing
    square = sim.op([centered], 4 * n, save=[centered])
    sim.drop(centered)
    variance = sim.op([square], 4 * rows)
    sim.drop(square)
    shifted = sim.op([variance], 4 * rows)
    sim.drop(variance)
    rstd = sim.op([shifted], 4 * rows, save_out=True)
    sim.drop(shifted)
    centered = sim.op([upcast, mean], 4 * n)
    normed = sim.op([centered, rstd], 4 * n, save=[centered, rstd])
    sim.drop(centered, rstd, mean)
    if upcast != x:
        sim.drop(upcast)
    return normed


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
    """CohereAttention.forward (Cohere2Attention's, RoPE on sliding layers only): q, k
    and v projected, RoPE (`_rope`), then attention and o_proj."""
    query, key, value = projections(sim, x, arch, recipe)
    query_r, key_r = _rope(sim, query, key, arch=arch, recipe=recipe) if rotary else (query, key)
    out = attend(sim, query_r, key_r, value, arch=arch, recipe=recipe, mask=mask, held=held)
    sim.drop(query_r, key_r, value)
    return out


def _rope(sim: Sim, query: int, key: int, *, arch: Arch, recipe: TraceRecipe) -> tuple[int, int]:
    """Cohere's apply_rotary_pos_emb: ``q.float()`` and ``k.float()``, both rotated in
    fp32, both cast back on return, when its locals (the fp32 q / k, then the fp32
    results) die; the caller's q / k die as it rebinds them."""
    tokens, act = recipe.batch * recipe.seq, recipe.act
    widths = (arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim)
    if act == 4:  # fp32 activations: nothing to upcast or cast back
        rotated = [rope(sim, x, 4 * tokens * w) for x, w in zip((query, key), widths, strict=True)]
        sim.drop(query, key)
        return rotated[0], rotated[1]
    wide = [sim.op([x], 4 * tokens * w) for x, w in zip((query, key), widths, strict=True)]
    embedded = [rope(sim, x, 4 * tokens * w) for x, w in zip(wide, widths, strict=True)]
    cast = [sim.op([x], act * tokens * w) for x, w in zip(embedded, widths, strict=True)]
    sim.drop(*wide, *embedded, query, key)
    return cast[0], cast[1]


def cohere_layer(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    inputs: Inputs,
    index: int,
    selective: bool = False,
) -> int:
    """CohereDecoderLayer.forward: input_layernorm, self_attn and the MLP on its output,
    then ``residual + attention + mlp``; the normed input lives until that sum."""
    tokens, h = recipe.batch * recipe.seq, arch.hidden
    mask = inputs.layer_mask(arch, index)
    rotary = inputs.layer_rotary(arch, index)
    weights: list[int] = []  # `hidden_states_attention, _ = self.self_attn(...)`
    normed = cohere_norm(sim, x, tokens, h, recipe)

    def self_attn(s: Sim, y: int, held: list[int] | None = None) -> int:
        return _attention(s, y, arch=arch, recipe=recipe, mask=mask, held=held, rotary=rotary)

    attention = (
        sim.checkpoint(self_attn, normed, weights) if selective else self_attn(sim, normed, weights)
    )
    mlp_out = mlp(sim, normed, arch=arch, recipe=recipe)
    size = recipe.residual * tokens * h
    partial = sim.op([x, attention], size, alias=True)
    out = sim.op([partial, mlp_out], size, alias=True)
    sim.drop(partial, normed, attention, mlp_out, *weights)
    return out


COHERE = TraceModel(prepare=llama_prepare, block=cohere_layer, norm=cohere_norm)
