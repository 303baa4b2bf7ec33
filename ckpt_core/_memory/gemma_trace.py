"""Gemma's decoder layers and what their models run around them, for the replay.

GemmaDecoderLayer (Gemma 1) is Llama's layer with Gemma's norms (computed in
fp32, scaled by ``1 + weight``) and the scaled word embeddings.
Gemma2DecoderLayer and Gemma3DecoderLayer differ from the Llama-style block of
`ckpt_core._memory.block_trace` in what they keep: four sandwich norms
(Gemma2RMSNorm / Gemma3RMSNorm compute in fp32 and scale by ``1 + weight``),
the scaled word embeddings, full and sliding-window masks on alternate layers;
Gemma 3 adds q / k norms and a second rotary table (its local layers').  The
linears, RoPE, the attention kernels (eager's logit softcapping included) and
the LM head (with its final softcapping) are the shared ones.  Sizes in bytes.
"""

from __future__ import annotations

import functools

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import fp32_scaled_norm
from ckpt_core._memory.layer_trace import post_normed_block, projected_attention
from ckpt_core._memory.linear_trace import TraceRecipe
from ckpt_core._memory.model_trace import (
    Inputs,
    TraceModel,
    causal_mask,
    eager_mask,
    embedding,
    llama_layer,
    rotary_workspace,
    sliding_mask,
    window_masked,
)


def gemma_norm(sim: Sim, x: int, rows: int, width: int, recipe: TraceRecipe, *, dtype: int) -> int:
    """Gemma2RMSNorm.forward / Gemma3RMSNorm.forward: ``output = self._norm(x.float())``,
    ``output = output * (1.0 + self.weight.float())`` in fp32, ``return
    output.type_as(x)`` (``dtype``: the input's bytes per element)."""
    return fp32_scaled_norm(sim, x, rows, width, recipe, dtype=dtype, normed_is_local=False)


def _residual_gemma_norm(sim: Sim, x: int, rows: int, width: int, recipe: TraceRecipe) -> int:
    return gemma_norm(sim, x, rows, width, recipe, dtype=recipe.residual)


def _gemma_prepare(
    sim: Sim,
    arch: Arch,
    recipe: TraceRecipe,
    workspace: int,
    *,
    rotary_tables: int,
    sliding_layers: bool = True,
) -> Inputs:
    """GemmaModel.forward / Gemma2Model.forward / Gemma3TextModel.forward before the layers.

    The scaled word embeddings: ``embedding(ids) * embed_scale`` (the lookup dies
    at once; the product is the leaf `step_trace` holds for adapters).  The masks
    (`_gemma_masks`), then the rotary embeddings (``rotary_tables``: Gemma and Gemma 2
    have one, Gemma 3 a global and a local one; each: fp32 ``freqs``,
    ``emb = cat(freqs, freqs)``, ``cos() * attention_scaling`` and
    ``sin() * ...``, cast to the hidden dtype), referenced by every layer's RoPE; the
    position ids are one row (``cache_position.unsqueeze(0)``), broadcast over the batch.
    """
    batch, seq, h, d = recipe.batch, recipe.seq, arch.hidden, arch.head_dim
    if recipe.full:
        lookup = embedding(sim, arch, recipe)
        hidden = sim.op([lookup], recipe.residual * batch * seq * h, saves_other=True)
    else:
        lookup = sim.new(recipe.residual * batch * seq * h)
        hidden = sim.new(recipe.residual * batch * seq * h, grad=True)
    sim.drop(lookup)
    full, sliding = _gemma_masks(sim, arch, recipe, sliding_layers=sliding_layers)
    rotary_workspace(sim, recipe, workspace)
    tables: list[int] = []
    for _ in range(rotary_tables):  # for position ids of one row: `cache_position[None]`
        freqs = sim.new(4 * seq * d // 2)
        emb = sim.new(4 * seq * d)
        cos = sim.new(4 * seq * d)
        cos_scaled = sim.new(4 * seq * d)
        sim.drop(cos)
        sin = sim.new(4 * seq * d)
        sin_scaled = sim.new(4 * seq * d)
        sim.drop(sin)
        tables += [sim.new(recipe.residual * seq * d) for _ in ("cos", "sin")]
        sim.drop(freqs, emb, cos_scaled, sin_scaled)
    masks = tuple(mask for mask in dict.fromkeys((full, sliding)) if mask is not None)
    return Inputs(
        hidden,
        full,
        step_held=tuple(tables),
        forward_held=masks,
        sliding_mask=sliding,
    )


def _gemma_masks(
    sim: Sim, arch: Arch, recipe: TraceRecipe, *, sliding_layers: bool
) -> tuple[int | None, int | None]:
    """``create_causal_mask``, then ``create_sliding_window_causal_mask`` when the model
    has ``sliding_layers`` (Gemma 2 and 3; not Gemma (1)): (full, sliding).

    sdpa: no mask for the full-attention layers (``is_causal``), a boolean one for the
    sliding layers once the window is no longer than the sequence (masking_utils.sdpa_mask:
    two comparisons and two ``&``); a padded batch: both, per sample.  Eager
    (masking_utils.eager_mask): both made, the boolean one turned into a float mask per
    sample (``torch.where``).  Flash: none (it reads the 2-D padding mask and the window).
    """
    seq, eager = recipe.seq, recipe.attention == "eager"
    full = None
    if recipe.attention == "flash":  # the 2-D padding mask and the window, as they are
        return None, None
    if eager or recipe.padded:
        full = causal_mask(sim, recipe) if recipe.padded else sim.new(seq * seq)  # kv <= q
        full = eager_mask(sim, recipe, full) if eager else full
    if not (sliding_layers and (eager or recipe.padded or window_masked(arch, recipe))):
        return full, None
    return full, sliding_mask(sim, recipe)


# Gemma2Attention.forward / Gemma3Attention.forward: q / k / v, Gemma 3's q_norm and
# k_norm over each head.  sdpa: a sliding layer's boolean mask becomes a new additive one
# in the activation dtype (attention.cpp convert_boolean_attn_mask), which the fused
# kernel saves; eager (`attend`) softcaps the logits when the config asks.
_ATTENTION = functools.partial(projected_attention, head_norm=gemma_norm)


# GemmaDecoderLayer.forward: Llama's layer with Gemma's norms.
GEMMA = TraceModel(
    prepare=functools.partial(_gemma_prepare, rotary_tables=1, sliding_layers=False),
    block=functools.partial(llama_layer, layer_norm=_residual_gemma_norm),
    norm=_residual_gemma_norm,
)

# Gemma2DecoderLayer.forward / Gemma3DecoderLayer.forward: input_layernorm, self_attn,
# post_attention_layernorm, the residual add, pre_feedforward_layernorm, the MLP,
# post_feedforward_layernorm, the residual add.
_GEMMA_LAYER = post_normed_block(_ATTENTION, _residual_gemma_norm, pre_norms=True)
GEMMA2 = TraceModel(
    prepare=functools.partial(_gemma_prepare, rotary_tables=1),
    block=_GEMMA_LAYER,
    norm=_residual_gemma_norm,
)
GEMMA3 = TraceModel(
    prepare=functools.partial(_gemma_prepare, rotary_tables=2),
    block=_GEMMA_LAYER,
    norm=_residual_gemma_norm,
)
