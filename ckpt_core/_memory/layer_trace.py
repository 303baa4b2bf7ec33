"""Decoder layers other than Llama's, built from the shared pieces, for the step replay.

A post-normed layer normalizes each branch's output before its residual add:
Gemma's sandwich (norms before the attention and the MLP too), OLMo-2's,
EXAONE 4's and GLM-4's.  Gemma's and EXAONE 4's self-attention projects q, k
and v before normalizing q and k per head.  The families' modules
(`ckpt_core._memory.gemma_trace`, `olmo2_trace`, `exaone4_trace`,
`glm4_trace`) give their norms and attention.  Sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Callable

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention_trace import attend
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import mlp, rope
from ckpt_core._memory.linear_trace import TraceRecipe, linear
from ckpt_core._memory.model_trace import Inputs


def post_normed_layer(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    attention: Callable[..., int],
    layer_norm: Callable[[Sim, int], int],
    pre_norms: bool,
    selective: bool,
) -> int:
    """A decoder layer that normalizes each branch's output before its residual add:
    Gemma's sandwich (``pre_norms``: input_layernorm and pre_feedforward_layernorm
    too) and OLMo-2's post-norms (the attention and the MLP read the residual
    stream).  ``attention(sim, y, held)`` is the layer's self_attn, checkpointed
    alone when ``selective``; ``layer_norm(sim, y)`` one of its hidden-size norms.
    Each norm's input dies where ``hidden_states`` is rebound."""
    tokens, res, h = recipe.batch * recipe.seq, recipe.residual, arch.hidden
    # `hidden_states, _ = self.self_attn(...)` keeps eager attention's weights
    # referenced until the layer returns.
    weights: list[int] = []
    attn_in = layer_norm(sim, x) if pre_norms else x
    out = (
        sim.checkpoint(attention, attn_in, weights)
        if selective
        else attention(sim, attn_in, weights)
    )
    if attn_in != x:
        sim.drop(attn_in)
    post = layer_norm(sim, out)
    sim.drop(out)
    mid = sim.op([x, post], res * tokens * h, alias=True)  # `residual + hidden_states`
    sim.drop(post)
    mlp_in = layer_norm(sim, mid) if pre_norms else mid
    down = mlp(sim, mlp_in, arch=arch, recipe=recipe)
    if mlp_in != mid:
        sim.drop(mlp_in)
    post = layer_norm(sim, down)
    sim.drop(down)
    out = sim.op([mid, post], res * tokens * h, alias=True)
    sim.drop(post, mid, *weights)  # rebinding, then the locals `residual` and `_`
    return out


# ``layer_norm(sim, x, rows, width, recipe)``: a norm on the residual stream's dtype.
LayerNorm = Callable[[Sim, int, int, int, TraceRecipe], int]


def post_normed_block(
    attention: Callable[..., int], layer_norm: LayerNorm, *, pre_norms: bool
) -> Callable[..., int]:
    """A `TraceModel.block` for a layer that normalizes each branch's output before its
    residual add (`post_normed_layer`: Gemma's sandwich with ``pre_norms``, OLMo-2's
    post-norms without).  ``attention(sim, x, arch=, recipe=, mask=, held=, rotary=)``
    is its self_attn on the layer's mask, applying RoPE unless the layer uses no
    positions (`Arch.nope_layers`); ``layer_norm`` each of its hidden-size norms."""

    def layer(
        sim: Sim,
        x: int,
        *,
        arch: Arch,
        recipe: TraceRecipe,
        inputs: Inputs,
        index: int,
        selective: bool = False,
    ) -> int:
        tokens = recipe.batch * recipe.seq
        mask = inputs.layer_mask(arch, index)
        rotary = inputs.layer_rotary(arch, index)

        def self_attn(s: Sim, y: int, held: list[int] | None = None) -> int:
            return attention(s, y, arch=arch, recipe=recipe, mask=mask, held=held, rotary=rotary)

        def hidden_norm(s: Sim, y: int) -> int:
            return layer_norm(s, y, tokens, arch.hidden, recipe)

        return post_normed_layer(
            sim,
            x,
            arch=arch,
            recipe=recipe,
            attention=self_attn,
            layer_norm=hidden_norm,
            pre_norms=pre_norms,
            selective=selective,
        )

    return layer


def projections(sim: Sim, x: int, arch: Arch, recipe: TraceRecipe) -> tuple[int, int, int]:
    """``q_proj(x)``, ``k_proj(x)`` and ``v_proj(x)``, in that order."""
    h, d = arch.hidden, arch.head_dim
    return tuple(  # type: ignore[return-value]
        linear(sim, x, f"self_attn.{name}_proj", (h, heads * d), recipe, bias=arch.qkv_bias)
        for name, heads in (("q", arch.heads), ("k", arch.kv_heads), ("v", arch.kv_heads))
    )


def projected_attention(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    held: list[int] | None = None,
    rotary: bool = True,
    head_norm: Callable[..., int],
) -> int:
    """Self-attention that projects q, k and v first (Gemma's, EXAONE 4's): with q / k
    norms over each head (`Arch.qk_norm`), ``head_norm(sim, x, rows, width, recipe,
    dtype=)``, each projection dies as its norm returns; RoPE unless the layer uses no
    positions; then the kernel (`attend`), which puts eager's weights in ``held``."""
    tokens, act, d = recipe.batch * recipe.seq, recipe.act, arch.head_dim
    query, key, value = projections(sim, x, arch, recipe)
    if arch.qk_norm == "head":
        normed = []
        for raw, heads in ((query, arch.heads), (key, arch.kv_heads)):
            normed.append(head_norm(sim, raw, tokens * heads, d, recipe, dtype=act))
            sim.drop(raw)
        query, key = normed
    if rotary:
        query_r = rope(sim, query, act * tokens * arch.heads * d)
        key_r = rope(sim, key, act * tokens * arch.kv_heads * d)
        sim.drop(query, key)
        query, key = query_r, key_r
    out = attend(sim, query, key, value, arch=arch, recipe=recipe, mask=mask, held=held)
    sim.drop(query, key, value)
    return out
