"""The attention kernels' allocations for the step replay, and the output projection.

transformers' ``eager_attention_forward`` (Llama's: scores, the float mask, the
softmax on an fp32 copy unless fp16, dropout on the weights, Gemma's logit
softcapping), sdpa's fused kernels (what they save; grouped heads repeated
with a mask) and flash attention's unpadding of a padded batch.  Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention import math_kernel
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.fused_trace import dropout
from ckpt_core._memory.linear_trace import TraceRecipe, linear
from ckpt_core._memory.pointwise_trace import softcap

__all__ = ["attend", "bmm_operand", "eager_attention", "fused_attention", "math_attention"]


def attend(
    sim: Sim,
    query: int,
    key: int,
    value: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    held: list[int] | None,
    output: str = "",
) -> int:
    """The attention kernel on RoPE'd q / k and v, then o_proj (``output``: its module
    name when not ``self_attn.`` + `Arch.o_name`).  Eager's weights go to ``held`` when
    given (the layer's `_` keeps them), else die at once."""
    if recipe.attention == "eager" and mask is not None:
        attn, weights = eager_attention(sim, query, key, value, arch=arch, recipe=recipe, mask=mask)
        if held is None:
            sim.drop(weights)
        else:
            held.append(weights)
    elif math_kernel(arch, recipe.attention, recipe.gqa, mask is not None):
        attn = math_attention(sim, query, key, value, arch=arch, recipe=recipe, mask=mask)
    else:
        attn = fused_attention(sim, query, key, value, arch=arch, recipe=recipe, mask=mask)
    name = output or f"self_attn.{arch.o_name}"
    width = arch.heads * arch.head_dim
    out = linear(sim, attn, name, (width, arch.hidden), recipe, bias=arch.o_bias or arch.bias)
    sim.drop(attn)
    return out


def fused_attention(
    sim: Sim, query: int, key: int, value: int, *, arch: Arch, recipe: TraceRecipe, mask: int | None
) -> int:
    """A fused sdpa kernel: it saves q, k, v, its output, the log-sum-exp and, for a
    boolean ``mask``, the additive mask it converts it to.

    transformers' sdpa_attention_forward leaves grouped heads to the kernel
    (``enable_gqa``) only without a mask (use_gqa_in_sdpa): with one, repeat_kv
    copies K and V to every head (one kv head: a stride-0 view, no copy), the
    kernel saves the copies, and their names die as it returns."""
    if recipe.attention == "flash" and recipe.padded:
        return _unpadded_flash(sim, query, key, value, arch=arch, recipe=recipe)
    batch, seq = recipe.batch, recipe.seq
    q_bytes = recipe.act * batch * seq * arch.heads * arch.head_dim
    copies: tuple[int, ...] = ()
    repeated = mask is not None or recipe.gqa == "repeated"
    if repeated and recipe.attention == "fused" and 1 < arch.kv_heads < arch.heads:
        key, value = copies = (sim.op([key], q_bytes), sim.op([value], q_bytes))
    bias = [sim.new(recipe.act * batch * seq * seq)] if mask is not None else []
    lse = sim.new(4 * batch * arch.heads * seq)
    attn = sim.op(
        [query, key, value],
        q_bytes,
        save=[query, key, value, lse, *bias],
        save_out=True,
        grads_in_order=True,
    )
    sim.drop(lse, *bias, *copies)
    if recipe.attention == "flash" and arch.rope_concat:
        # RoPE's cat leaves q contiguous per head and flash's output takes q's strides:
        # the attention's `reshape(...).contiguous()` copies it.
        flat = sim.op([attn], q_bytes, alias=True)
        sim.drop(attn)
        return flat
    return attn


def math_attention(
    sim: Sim, query: int, key: int, value: int, *, arch: Arch, recipe: TraceRecipe, mask: int | None
) -> int:
    """sdpa's math backend (``_scaled_dot_product_attention_math``), then the caller's
    ``transpose(1, 2)`` copy of its output.

    sdpa turns a boolean mask into a float one (``where``), held to its return; without
    one the backend makes the causal mask itself (``ones``, ``tril``, then the float one
    in q's fp32).  q, k and v are upcast to fp32 (locals to the return), q scaled; with
    ``enable_gqa`` k and v are repeated to every head (``repeat_interleave``, a copy whose
    backward sums it), else ``matmul`` repeats them (`bmm_operand`); k^T is scaled; the
    bmm keeps both operands.  The mask is added in place; ``_safe_softmax`` makes the
    softmax, a -inf test and the ``where`` it returns (kept); the weights it returns
    beside the output are cast to the dtype and dropped; the output is cast back (an
    fp32 step casts nothing)."""
    tokens, act, batch, seq = recipe.batch * recipe.seq, recipe.act, recipe.batch, recipe.seq
    q_bytes, kv_bytes = (4 * tokens * n * arch.head_dim for n in (arch.heads, arch.kv_heads))
    scores = batch * arch.heads * seq * seq
    bias = []
    if mask is not None:  # `where(mask.logical_not(), -inf, 0)`
        bias.append(sim.op([mask], act * batch * seq * seq, temps=[batch * seq * seq]))
    cast = act != 4  # `.to(float)` and `.to(origin_dtype)` copy only half precision
    query_f, key_f, value_f = (
        sim.op([x], n) if cast else x
        for x, n in ((query, q_bytes), (key, kv_bytes), (value, kv_bytes))
    )
    scaled_q = sim.op([query_f], q_bytes)
    if mask is None:  # is_causal: `ones(L, S).tril()`, then the float mask
        ones = sim.new(seq * seq)
        lower = sim.new(seq * seq)
        sim.drop(ones)
        bias.append(sim.op([lower], 4 * seq * seq, temps=[seq * seq]))
        sim.drop(lower)
    made = [query_f, key_f, value_f] if cast else []  # locals to the return, as repeats are
    # pre_process_group_query_attention_input: copies, per head, that bmm reads as views
    grouped = recipe.gqa == "math" and not arch.sdpa_math
    if grouped:
        key_f, value_f = sim.op([key_f], q_bytes), sim.op([value_f], q_bytes)
        made += [key_f, value_f]
    scaled_k = sim.op([key_f], sim.size(key_f))  # k^T * sqrt(scale)
    query_m = bmm_operand(sim, scaled_q, q_bytes, batch)
    key_m = scaled_k if grouped else bmm_operand(sim, scaled_k, q_bytes, batch)
    raw = sim.op([query_m, key_m], 4 * scores, save=[query_m, key_m], matmul=True)
    sim.drop(*(m for m, x in ((query_m, scaled_q), (key_m, scaled_k)) if m != x), scaled_k)
    extra = [4 * scores] if recipe.eager_extra else []  # CUDA softmax backward's temporary
    probs = sim.op(
        [raw], 4 * scores, save_out=True, temps=[4 * scores, scores], backward_scratch=extra
    )
    sim.drop(raw)
    dropped = dropout(sim, probs, 4 * scores, scores, arch.attn_dropout)
    if dropped != probs:
        sim.drop(probs)
        probs = dropped
    if cast:  # the weights, returned beside the output in the dtype: sdpa drops them
        made.append(sim.new(act * scores))
    value_m = value_f if grouped else bmm_operand(sim, value_f, q_bytes, batch)
    out_f = sim.op([probs, value_m], q_bytes, save=[probs, value_m], matmul=True)
    if value_m != value_f:
        sim.drop(value_m)
    out = out_f
    if cast:
        out = sim.op([out_f], act * tokens * arch.heads * arch.head_dim)
        sim.drop(out_f)
    sim.drop(probs, scaled_q, *made, *bias)
    flat = sim.op([out], sim.size(out), alias=True)  # transpose(1, 2).contiguous()
    sim.drop(out)
    return flat


def bmm_operand(sim: Sim, x: int, full: int, batch: int) -> int:
    """What ``matmul`` hands bmm for a 4-D operand: with batch 1, ``x`` or its kv heads
    expanded to every head (a view, whose gradient bmm makes at full size); otherwise a
    copy (of the expansion: its backward sums it)."""
    if batch == 1:
        return x if sim.size(x) == full else sim.views(x, [full])[0]
    return sim.op([x], full, alias=sim.size(x) == full)


def _unpadded_flash(
    sim: Sim, query: int, key: int, value: int, *, arch: Arch, recipe: TraceRecipe
) -> int:
    """Flash with a padding mask (modeling_flash_attention_utils ``_flash_attention_forward``):
    ``_get_unpad_data`` (per call: the lengths, the real tokens' indices, their cumulative
    sum), k, v and q gathered (each gather keeps the indices), the varlen kernel (it saves
    the gathered q, k, v, its output and log-sum-exp), then ``_pad_input`` scatters the
    output into a new zero tensor, o_proj's input.  Real tokens are counted as the whole
    batch: an upper bound."""
    tokens, act, batch = recipe.batch * recipe.seq, recipe.act, recipe.batch
    q_bytes, kv_bytes = (act * tokens * n * arch.head_dim for n in (arch.heads, arch.kv_heads))
    lengths = sim.new(4 * batch)  # attention_mask.sum(-1, dtype=int32)
    indices = sim.new(8 * tokens)  # nonzero(mask.flatten()).flatten()
    summed = sim.new(4 * batch)  # cumsum, then F.pad
    cumulative = sim.new(4 * (batch + 1))
    sim.drop(summed, lengths)
    key_u, value_u, query_u = (
        sim.op([x], n, save=[indices])
        for x, n in ((key, kv_bytes), (value, kv_bytes), (query, q_bytes))
    )
    lse = sim.new(4 * batch * arch.heads * recipe.seq)
    out = sim.op(
        [query_u, key_u, value_u],
        q_bytes,
        save=[query_u, key_u, value_u, lse],
        save_out=True,
        grads_in_order=True,
    )
    sim.drop(lse, query_u, key_u, value_u)
    # `output = torch.zeros(...); output[indices] = hidden_states`: the in-place scatter
    # keeps the indices, and its backward gathers the output's gradient.
    scattered = sim.op([out], q_bytes, save=[indices])
    sim.drop(out, indices, cumulative)
    return scattered


def eager_attention(
    sim: Sim, query: int, key: int, value: int, *, arch: Arch, recipe: TraceRecipe, mask: int
) -> tuple[int, int]:
    """eager_attention_forward (with Gemma's logit softcapping when the config sets
    it); returns (attention output, attention weights)."""
    tokens, act, batch, seq = recipe.batch * recipe.seq, recipe.act, recipe.batch, recipe.seq
    q = arch.heads * arch.head_dim
    scores = batch * arch.heads * seq * seq
    # repeat_kv: expand + reshape copies grouped K and V to every head; one kv head's
    # expand reshapes to a view of stride 0 over the heads, no copy.
    grouped = 1 < arch.kv_heads < arch.heads
    key_f = sim.op([key], act * tokens * q) if grouped else key
    value_f = sim.op([value], act * tokens * q) if grouped else value
    # torch.matmul folds 4-D operands to bmm by reshape, which copies an operand whose
    # (batch, heads) dims cannot merge: RoPE keeps q / k in the projection's (B, S, H, D)
    # layout, as is an unrepeated V (a transposed view), and one kv head repeated has
    # stride 0 over the heads; with batch 1 they merge.
    # One kv head's gradient is made per head, then summed over them (ExpandBackward):
    # from its copy, or with batch 1 from the bmm's per-head gradient.
    expanded = arch.kv_heads == 1 < arch.heads
    per_head = [act * tokens * q] if expanded and batch == 1 else []
    query_c = sim.op([query], act * tokens * q, alias=True) if batch > 1 else query
    copied = batch > 1 and not grouped
    key_c = sim.op([key_f], act * tokens * q, alias=not expanded) if copied else key_f
    raw = sim.op([query_c, key_c], act * scores, save=[query_c, key_c], backward_temps=per_head)
    if query_c != query:
        sim.drop(query_c)
    if key_c != key_f:
        sim.drop(key_c)
    scaled = sim.op([raw], act * scores)
    sim.drop(raw)
    if arch.attn_softcap:
        scaled = softcap(sim, scaled, act * scores)
    masked = sim.op([scaled, mask], act * scores, alias=True)
    sim.drop(scaled)
    # SoftMax.cu softmax_backward_cuda_out: `tmp = grad * output` (fp32) is made
    # after the structured kernel allocated grad_input, and freed on return.
    extra = [4 * scores] if recipe.eager_extra else []
    # SoftMax.cpp `softmax(x, dim, dtype=float32)`: on CUDA an fp16 input is read by the
    # half_to_float kernel; any other (bf16) is first converted, a copy that dies once
    # the softmax returns, and whose backward casts the fp32 gradient back.
    upcast = masked if act == 4 or recipe.fp16 else sim.op([masked], 4 * scores)
    softmax = sim.op([upcast], 4 * scores, save_out=True, backward_scratch=extra)
    if upcast != masked:
        sim.drop(upcast)
    probs = sim.op([softmax], act * scores) if act != 4 else softmax
    # `attn_weights = softmax(attn_weights, ...).to(dtype)` frees the fp32 result after
    # `.to`, the masked scores only when the name is rebound.
    if probs != softmax:
        sim.drop(softmax)
    sim.drop(masked)
    dropped = dropout(sim, probs, act * scores, scores, arch.attn_dropout)
    if dropped != probs:  # `attn_weights = dropout(attn_weights, ...)`
        sim.drop(probs)
        probs = dropped
    value_c = sim.op([value_f], act * tokens * q, alias=not expanded) if copied else value_f
    out = sim.op([probs, value_c], act * tokens * q, save=[probs, value_c], backward_temps=per_head)
    if value_c != value_f:
        sim.drop(value_c)
    flat = sim.op([out], act * tokens * q, alias=True)  # transpose(1, 2).contiguous()
    sim.drop(out)
    if grouped:  # eager_attention_forward returns: repeat_kv's copies die
        sim.drop(key_f, value_f)
    return flat, probs
