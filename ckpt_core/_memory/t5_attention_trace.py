"""T5's attention for the step replay: the relative position bias and sdpa's float mask.

``T5Attention.forward``: q, k and v (k and v of the encoder's output in
cross-attention), the bias when the stack's first block makes it
(``compute_bias``: the buckets' sequence x sequence int64, bool and fp32
temporaries, then the table's lookup; the decoder's cross-attention bias is
zeros), the kernel, then ``o``.  sdpa gets each layer's bias as a float mask of
its own (``create_position_bias_mask``), which the kernel saves; eager adds the
bias to its scores.  Sizes in bytes.
"""

from __future__ import annotations

from typing import Final

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.gpt2_trace import eager_attention_in_dtype, head_view
from ckpt_core._memory.linear_trace import TraceRecipe, linear
from ckpt_core._memory.model_trace import Inputs

__all__ = ["CROSS", "SELF", "attention", "shared_names"]

SELF: Final = "SelfAttention"
CROSS: Final = "EncDecAttention"


def shared_names(stack: str, *, cross: bool) -> tuple[str, str]:
    """The names in `Inputs.shared` of the mask and the bias a sub-layer reads."""
    kind = "cross_" if cross else ""
    return f"{stack}.{kind}mask", f"{stack}.{kind}bias"


def attention(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    inputs: Inputs,
    stack: str,
    first: bool,
    cross: bool,
    held: list[int] | None,
) -> int:
    """T5Attention.forward: q, k and v (k and v of the encoder's output in
    cross-attention), the bias when the stack's first block makes it, the kernel, then o."""
    module = CROSS if cross else SELF
    h, inner = arch.hidden, arch.heads * arch.head_dim
    source = inputs.shared["encoder_out"] if cross else x
    eager = recipe.attention == "eager"
    query = head_view(sim, linear(sim, x, f"{module}.q", (h, inner), recipe), recipe)
    key = linear(sim, source, f"{module}.k", (h, inner), recipe, strided_grad=eager)
    value = head_view(sim, linear(sim, source, f"{module}.v", (h, inner), recipe), recipe)
    mask_name, name = shared_names(stack, cross=cross)
    if first:
        bias = (
            _zero_bias(sim, arch, recipe)
            if cross
            else _relative_bias(sim, arch, recipe, bidirectional=stack == "encoder")
        )
        if not sim.recomputing:  # the stack's loop hands it to the later blocks
            inputs.shared[name] = bias
    else:
        bias = inputs.shared[name]
    mask = inputs.shared.get(mask_name)
    if eager:
        attn, weights = eager_attention_in_dtype(
            sim, query, key, value, arch=arch, recipe=recipe, mask=mask, bias=bias
        )
        if held is None:
            sim.drop(weights)
        else:
            held.append(weights)
    else:
        causal = stack == "decoder" and not cross
        attn = _fused(
            sim,
            query,
            key,
            value,
            arch=arch,
            recipe=recipe,
            bias=bias,
            mask=mask,
            causal=causal,
            contiguous=cross,
        )
    out = linear(sim, attn, f"{module}.o", (inner, h), recipe)
    # T5Attention.forward returns: its locals query/key/value_states die after o.
    sim.drop(attn, query, key, value)
    return out


def _relative_bias(sim: Sim, arch: Arch, recipe: TraceRecipe, *, bidirectional: bool) -> int:
    """T5Attention.compute_bias: the relative positions, their buckets
    (``_relative_position_bucket``: int64, bool and fp32 sequence x sequence
    temporaries, freed as its names are rebound), the bias table's lookup; the
    positions and buckets die as it returns (a trained table's lookup keeps the
    buckets)."""
    seq = recipe.seq
    n = seq * seq
    context = sim.new(8 * seq)
    shifted = sim.new(8 * seq)  # `[:, None] + past_seen_tokens`
    sim.drop(context)
    memory = sim.new(8 * seq)
    relative = sim.new(8 * n)
    if bidirectional:  # `(relative_position > 0).to(long) * num_buckets`, then `0 + that`
        positive = sim.new(n)
        as_long = sim.new(8 * n)
        sim.drop(positive)
        times = sim.new(8 * n)
        sim.drop(as_long)
        buckets = sim.new(8 * n)
        sim.drop(times)
        distance = sim.new(8 * n)  # abs
    else:  # `-torch.min(relative_position, torch.zeros_like(...))`
        zeros = sim.new(8 * n)
        smaller = sim.new(8 * n)
        sim.drop(zeros)
        distance = sim.new(8 * n)
        sim.drop(smaller)
    is_small = sim.new(n)
    value = sim.new(4 * n)  # `.float()`, then / max_exact, log, / log(...), * (...)
    for _ in range(4):
        step = sim.new(4 * n)
        sim.drop(value)
        value = step
    large = sim.new(8 * n)  # `.to(torch.long)`
    sim.drop(value)
    shifted_large = sim.new(8 * n)  # `max_exact + ...`
    sim.drop(large)
    full = sim.new(8 * n)  # torch.full_like
    capped = sim.new(8 * n)  # torch.min
    sim.drop(shifted_large, full)
    chosen = sim.new(8 * n)  # torch.where
    if bidirectional:  # `relative_buckets += ...`, in place
        sim.drop(distance, is_small, capped, chosen)
    else:  # `relative_buckets` was the int 0: a new tensor
        buckets = sim.new(8 * n)
        sim.drop(distance, is_small, capped, chosen)
    size = recipe.act * arch.heads * n
    if recipe.full:  # the trained table's lookup keeps its indices
        table = recipe.weights * arch.relative_buckets * arch.heads
        bias = sim.op([buckets], size, save=[buckets], param_grad=table)
    else:
        bias = sim.new(size)
    sim.drop(shifted, memory, relative, buckets)
    return bias


def _zero_bias(sim: Sim, arch: Arch, recipe: TraceRecipe) -> int:
    """Cross-attention's first block: ``torch.zeros`` of the bias's shape."""
    return sim.new(recipe.act * arch.heads * recipe.seq * recipe.seq)


def _fused(
    sim: Sim,
    query: int,
    key: int,
    value: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    bias: int,
    mask: int | None,
    causal: bool,
    contiguous: bool,
) -> int:
    """sdpa with the bias as its float mask (``create_position_bias_mask``): the bias
    through ``torch.where`` with the padding's or (made here) the causal mask, else the
    bias itself; its ``.contiguous()`` copies what is laid out as the relative bias, a
    permuted view (``contiguous``: the zero cross bias is not).  The kernel saves the
    mask with q, k, v, its output and the log-sum-exp."""
    batch, seq = recipe.batch, recipe.seq
    size = recipe.act * arch.heads * seq * seq
    made: list[int] = []
    source = bias
    if mask is not None or causal:
        condition = mask
        if mask is None:  # `arange(q)[:, None] >= arange(k)[None, :]`
            condition = sim.new(seq * seq)
            made.append(condition)
        # WhereBackward keeps the condition for a trained bias's gradient.
        source = sim.op([bias], size * (batch if mask is not None else 1), save=[condition])
    # `where` lays its output out as the bias: a permuted relative bias needs the copy.
    float_mask = source if contiguous else sim.op([source], sim.size(source), alias=True)
    sim.drop(*made, *([] if source in (bias, float_mask) else [source]))
    q_bytes = recipe.act * batch * seq * arch.heads * arch.head_dim
    out = sim.op(
        [query, key, value, float_mask],
        q_bytes,
        save=[query, key, value, float_mask],
        save_out=True,
        saved_outputs=(4 * batch * arch.heads * seq,),
        grads_in_order=True,
    )
    if float_mask != bias:
        sim.drop(float_mask)
    return out
