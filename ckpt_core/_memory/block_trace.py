"""One decoder block's allocations, op by op, in the order the real code makes and frees them.

The buffers and their lifetimes are those of transformers' Llama-style block
(``LlamaDecoderLayer`` / ``LlamaAttention`` / ``eager_attention_forward`` /
``LlamaMLP`` / ``LlamaRMSNorm``), with Phi-3's fused projections, Qwen3's
q / k norms and Granite's residual multiplier where the architecture has them,
and the pieces other families' layers share (`ckpt_core._memory.layer_trace`):
RMSNorms, RoPE, the MLP.  The attention kernels are
`ckpt_core._memory.attention_trace`, the linears with their adapters
`ckpt_core._memory.linear_trace`, pointwise chains written out in Python (softcapping,
``gelu_new``) `ckpt_core._memory.pointwise_trace`, LayerNorm and dropout
`ckpt_core._memory.fused_trace`.  A tensor is freed where the last Python
name or autograd node holding it lets go, which decides what the caching
allocator can reuse.  Each "why" names the source it follows.  What a model
runs around its blocks is `ckpt_core._memory.model_trace`.  Sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Callable

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention_trace import attend
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.fused_trace import dropout, dropped_out
from ckpt_core._memory.linear_trace import TraceRecipe, linear
from ckpt_core._memory.pointwise_trace import gelu_new


def rms_normalized(sim: Sim, x: int, rows: int, width: int, *, dtype: int) -> int:
    """What every RMSNorm here computes first: ``x.float()`` (``dtype``: x's bytes per
    element; an fp32 input is not copied), ``pow(2).mean(-1)``, ``rsqrt(... + eps)``,
    then ``x * rstd``, in fp32; returns the normalized value.  The upcast dies as the
    name holding it is rebound to the product (saved for backward meanwhile).

    The backward's full-width temporaries: PowBackward0's ``grad * (2 * x.pow(1))``
    makes two before its gradient; MulBackward0 computes rstd's gradient as
    ``grad * x`` at full width, summed down to rstd's shape by the engine after both
    gradients are made (``validate_outputs``)."""
    full = 4 * rows * width
    upcast = sim.op([x], full) if dtype != 4 else x
    square = sim.op([upcast], full, save=[upcast], backward_temps=[full, full])
    mean = sim.op([square], 4 * rows)
    sim.drop(square)
    rstd = sim.op([mean], 4 * rows, save_out=True)
    sim.drop(mean)
    normed = sim.op([upcast, rstd], full, save=[upcast, rstd], backward_temps=[full])
    sim.drop(rstd)
    if upcast != x:
        sim.drop(upcast)
    return normed


def norm(
    sim: Sim, x: int, rows: int, width: int, recipe: TraceRecipe, *, dtype: int | None = None
) -> int:
    """LlamaRMSNorm.forward: `rms_normalized`, cast back, times weight.

    ``dtype``: the input's bytes per element (the residual stream's unless given)."""
    dtype = recipe.residual if dtype is None else dtype
    normed = rms_normalized(sim, x, rows, width, dtype=dtype)
    cast = sim.op([normed], dtype * rows * width) if dtype != 4 else normed
    out_bytes = max(recipe.kept if recipe.quantized else recipe.weights, dtype)
    # A trained weight's gradient is ``grad * x`` at full width, summed to its shape.
    trained = [out_bytes * rows * width] if recipe.full else []
    out = sim.op(
        [cast],
        out_bytes * rows * width,
        save=[cast] if recipe.full else [],
        saves_other=True,
        backward_scratch=trained,
    )
    # `return self.weight * hidden_states.to(input_dtype)`: the cast dies after the
    # product, the fp32 normalized tensor (a local) on return.
    if cast != normed:
        sim.drop(cast)
    sim.drop(normed)
    return out


def fp32_scaled_norm(
    sim: Sim,
    x: int,
    rows: int,
    width: int,
    recipe: TraceRecipe,
    *,
    dtype: int,
    normed_is_local: bool,
    normalize: Callable[..., int] = rms_normalized,
) -> int:
    """A norm that scales by its weight in fp32, then casts back to x's ``dtype``;
    ``normalize(sim, x, rows, width, dtype=)`` makes the fp32 normalized value (an
    RMSNorm's unless given: Cohere's LayerNorm passes its own).

    Gemma's ``output = output * (1.0 + self.weight.float()); return
    output.type_as(x)``: the rebinding frees the normalized value before the cast.
    OLMo-2's ``return (self.weight * hidden_states).to(input_dtype)``
    (``normed_is_local``): the normalized value lives until the return.  The fp32
    product dies after the cast.  The product saves the weight for the input's
    gradient, and the normalized value only for the weight's (full fine-tunes)."""
    normed = normalize(sim, x, rows, width, dtype=dtype)
    scaled = sim.op(
        [normed], 4 * rows * width, save=[normed] if recipe.full else [], saves_other=True
    )
    if not normed_is_local:
        sim.drop(normed)
    out = sim.op([scaled], dtype * rows * width) if dtype != 4 else scaled
    if out != scaled:
        sim.drop(scaled)
    if normed_is_local:
        sim.drop(normed)
    return out


def rope(sim: Sim, x: int, size: int, *, concat: bool = False, wide: int = 0, part: int = 0) -> int:
    """apply_rotary_pos_emb: `(q * cos) + (rotate_half(q) * sin)` on ``x`` of ``size``
    bytes, or on its leading slice of ``part`` bytes (`Arch.rotary_dim`: a view);
    ``wide``: the products' bytes when fp32 cos / sin promote them (OLMo-2, whose caller
    casts the result back); ``concat``: then `torch.cat([rotated, q_pass])`
    (`Arch.rope_concat`), whose input dies at once."""
    part = part or size
    product, promoted = wide or part, bool(wide)
    cos = sim.op([x], product, saves_other=True, cast=promoted)  # MulBackward0 saves cos
    neg = sim.op([x], part // 2)
    rotated = sim.op([neg, x], part, alias=True)
    sim.drop(neg)
    sin = sim.op([rotated], product, saves_other=True, cast=promoted)
    sim.drop(rotated)
    out = sim.op([cos, sin], product, alias=True)
    sim.drop(cos, sin)
    if concat:
        whole = sim.op([out], size, alias=True)
        sim.drop(out)
        return whole
    return out


def block(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    selective: bool = False,
    rotary: bool = True,
    layer_norm: Callable[[Sim, int, int, int, TraceRecipe], int] = norm,
    self_attention: Callable[..., int] | None = None,
    feed_forward: Callable[..., int] | None = None,
) -> int:
    """LlamaDecoderLayer.forward on the block input ``x``; returns its output.

    ``mask``: eager's float mask, or sdpa's boolean one (None: ``is_causal``);
    ``rotary``: the layer applies RoPE (SmolLM3's NoPE layers do not);
    ``layer_norm``: its two norms (Gemma's scale in fp32); ``self_attention``: the
    layer's attention when it is not Llama's (`attention`), called as it is;
    ``feed_forward``: its MLP when it is not Llama's (`mlp`: an MoE layer's experts)."""
    self_attention = self_attention or attention
    feed_forward = feed_forward or mlp
    tokens, h = recipe.batch * recipe.seq, arch.hidden
    # `hidden_states, _ = self.self_attn(...)` keeps eager attention's weights
    # referenced until the layer returns.
    weights: list[int] = []
    # input_layernorm runs in the layer, outside the hooked self_attn: selective keeps
    # the norm's fp32 upcast and rstd, and the checkpoint keeps its normed output.
    normed_in = layer_norm(sim, x, tokens, h, recipe)
    if selective:
        out = sim.checkpoint(
            lambda s, y, held=None: self_attention(
                s, y, arch=arch, recipe=recipe, mask=mask, held=held, rotary=rotary
            ),
            normed_in,
            weights,
        )
    else:
        out = self_attention(
            sim, normed_in, arch=arch, recipe=recipe, mask=mask, held=weights, rotary=rotary
        )
    # The layer rebinds hidden_states to the attention's output: the normed input dies.
    sim.drop(normed_in)
    mid = _residual(sim, x, out, arch=arch, recipe=recipe)
    normed = layer_norm(sim, mid, tokens, h, recipe)
    down = feed_forward(sim, normed, arch=arch, recipe=recipe)
    sim.drop(normed)  # the layer rebinds hidden_states to the MLP's output
    out = _residual(sim, mid, down, arch=arch, recipe=recipe)
    sim.drop(mid, *weights)  # the locals `residual` and `_`
    return out


def _residual(sim: Sim, x: int, branch: int, *, arch: Arch, recipe: TraceRecipe) -> int:
    """``residual + hidden_states`` (Granite: ``+ hidden_states * residual_multiplier``;
    Phi-3: ``+ self.resid_attn_dropout(hidden_states)``, residual dropout in the layer:
    a temporary freed after the sum); the rebinding then frees the branch's output."""
    tokens = recipe.batch * recipe.seq
    size = recipe.residual * tokens * arch.hidden
    if arch.scalar_multipliers:
        product = sim.op([branch], recipe.act * tokens * arch.hidden)
    elif arch.hidden_dropout and not arch.dropout_in_attention:
        product = dropout(
            sim,
            branch,
            recipe.act * tokens * arch.hidden,
            tokens * arch.hidden,
            arch.hidden_dropout,
        )
    else:
        product = branch
    out = sim.op([x, product], size, alias=True)
    if product != branch:
        sim.drop(product)
    sim.drop(branch)
    return out


def mlp(
    sim: Sim, x: int, *, arch: Arch, recipe: TraceRecipe, module: str = "mlp", inter: int = 0
) -> int:
    """LlamaMLP.forward (and Gemma's): `down_proj(act_fn(gate_proj(x)) * up_proj(x))`,
    left to right; returns the down projection's output.  ``module`` and ``inter``: an
    MoE layer's shared expert's."""
    tokens, act, h = recipe.batch * recipe.seq, recipe.act, arch.hidden
    inter = inter or arch.intermediate or arch.moe_intermediate * max(1, arch.top_k)
    bias = arch.mlp_bias or arch.bias
    chunks: tuple[int, ...] = ()  # the MLP's locals that live until it returns
    if arch.fused_gate_up:
        # Phi3MLP.forward: `gate, up_states = gate_up_proj(x).chunk(2)` (views of one
        # output), `up_states * act_fn(gate)`; the local `gate` lives until the return.
        gate_up = linear(sim, x, f"{module}.gate_up_proj", (h, 2 * inter), recipe, bias=bias)
        gate, up = sim.views(gate_up, [act * tokens * inter] * 2)
        sim.drop(gate_up)
        activated = sim.op([gate], act * tokens * inter, save=[gate])
        product = sim.op([up, activated], act * tokens * inter, save=[up, activated])
        sim.drop(activated, up)
        chunks = (gate,)
    elif arch.glu:
        gate = linear(sim, x, f"{module}.gate_proj", (h, inter), recipe, bias=bias)
        activated = sim.op([gate], act * tokens * inter, save=[gate])
        sim.drop(gate)
        up = linear(sim, x, f"{module}.up_proj", (h, inter), recipe, bias=bias)
        product = sim.op([activated, up], act * tokens * inter, save=[activated, up])
        sim.drop(activated, up)
    else:  # a non-gated MLP (StarCoder2's c_fc, then c_proj)
        up = linear(sim, x, f"{module}.{arch.mlp_names[0]}", (h, inter), recipe, bias=bias)
        size = act * tokens * inter
        product = (
            gelu_new(sim, up, size) if arch.act == "gelu_new" else sim.op([up], size, save=[up])
        )
        sim.drop(up)
    down = linear(sim, product, f"{module}.{arch.mlp_names[1]}", (inter, h), recipe, bias=bias)
    sim.drop(product, *chunks)
    return _branch_dropout(sim, down, arch=arch, recipe=recipe)


def _branch_dropout(sim: Sim, x: int, *, arch: Arch, recipe: TraceRecipe) -> int:
    """Seed-OSS's and StarCoder2's residual dropout, inside self_attn and the MLP on their
    output (`Arch.dropout_in_attention`): the rebinding frees the output."""
    if not arch.dropout_in_attention:
        return x
    return dropped_out(sim, x, recipe, arch.hidden, arch.hidden_dropout)


def attention(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    held: list[int] | None = None,
    rotary: bool = True,
) -> int:
    """LlamaAttention.forward on the normed ``x``; eager's weights go to ``held`` when given;
    ``rotary``: RoPE is applied (else q and k reach the kernel as projected).

    sdpa with a boolean ``mask`` (a sliding window) makes a new additive one in the
    activation dtype (attention.cpp convert_boolean_attn_mask), which the fused
    kernel saves for backward."""
    tokens, act = recipe.batch * recipe.seq, recipe.act
    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    fused: tuple[int, ...] = ()
    bias = arch.qkv_bias or arch.bias
    if arch.fused_qkv:
        # Phi3Attention.forward: q, k and v are slices of one projection, whose local
        # `qkv` keeps the whole output until the attention returns.
        qkv = linear(sim, x, "self_attn.qkv_proj", (h, q + 2 * kv), recipe, bias=bias)
        (query,), (key,), (value,) = (sim.views(qkv, [act * tokens * n]) for n in (q, kv, kv))
        fused = (qkv,)
    else:  # q / k norms on the projections (Qwen3), unless on the rotated q / k (Hunyuan)
        early = not arch.qk_norm_after_rope
        query = linear(sim, x, "self_attn.q_proj", (h, q), recipe, bias=bias)
        query = _head_normed(sim, query, arch.heads, arch, recipe) if early else query
        key = linear(sim, x, "self_attn.k_proj", (h, kv), recipe, bias=bias)
        key = _head_normed(sim, key, arch.kv_heads, arch, recipe) if early else key
        value = linear(sim, x, "self_attn.v_proj", (h, kv), recipe, bias=bias)
    query_r, key_r = query, key
    if rotary:
        # With a cat after it (Phi's, StableLM's), RoPE rotates a slice of each head.
        rotated = arch.rope_dim if arch.rope_concat else arch.head_dim
        query_r, key_r = (
            rope(
                sim,
                states,
                act * tokens * heads * arch.head_dim,
                concat=arch.rope_concat,
                part=act * tokens * heads * rotated,
            )
            for states, heads in ((query, arch.heads), (key, arch.kv_heads))
        )
        sim.drop(query, key)
    if arch.qk_norm_after_rope:  # HunYuanDenseV1Attention: query_layernorm(rotated q)
        query_r = _head_normed(sim, query_r, arch.heads, arch, recipe)
        key_r = _head_normed(sim, key_r, arch.kv_heads, arch, recipe)
    if arch.query_scaling:
        query_r = _scaled_query(sim, query_r, act * tokens * q, recipe)
    out = attend(sim, query_r, key_r, value, arch=arch, recipe=recipe, mask=mask, held=held)
    out = _branch_dropout(sim, out, arch=arch, recipe=recipe)
    # LlamaAttention.forward returns: its locals query/key/value_states die.
    sim.drop(query_r, key_r, value, *fused)
    return out


def _scaled_query(sim: Sim, query: int, size: int, recipe: TraceRecipe) -> int:
    """Ministral3Attention: ``query_states * get_llama_4_attn_scale(...).to(dtype)``: the
    scale is made from the positions in fp32 (a few seq-long temporaries) and cast to
    the dtype; MulBackward0 keeps it, and the rebinding frees the rotated q."""
    wide = sim.new(4 * recipe.seq)
    scale = sim.new(recipe.act * recipe.seq)
    sim.drop(wide)
    out = sim.op([query], size, save=[scale])
    sim.drop(scale, query)
    return out


def _head_normed(sim: Sim, x: int, heads: int, arch: Arch, recipe: TraceRecipe) -> int:
    """Qwen3Attention.forward: `q_norm(q_proj(x).view(...))` (and k's) over each head
    (OLMoE's over the whole projection); the projection's output is a temporary that dies
    when the norm returns."""
    if not arch.qk_norm:
        return x
    rows, width = recipe.batch * recipe.seq * heads, arch.head_dim
    if arch.qk_norm == "full":
        rows, width = rows // heads, width * heads
    out = norm(sim, x, rows, width, recipe, dtype=recipe.act)
    sim.drop(x)
    return out
