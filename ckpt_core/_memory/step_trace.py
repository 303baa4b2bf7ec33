"""The allocations of a real training step, replayed through the caching allocator.

`simulate` loads the model (bitsandbytes quantizes each block linear from a
compute-dtype copy; PEFT's kbit preparation re-allocates every other
parameter in fp32; adapters in fp32), allocates the optimizer states of the
warm-up step, then replays the measured step: forward (checkpointed blocks
keep their input only), the loss, backward (recompute, then each op's
gradients), the optimizer step (torch's foreach AdamW holds one temporary per
parameter for the denominator); gradients are freed by
``zero_grad(set_to_none=True)`` or kept (``accumulate``).
Op by op, the buffers are those of transformers' Llama-style decoder block,
the same forward `ckpt_core._memory.activations` writes down (norms upcast to fp32,
q / k / v / o and the MLP projections with their LoRA adapters, RoPE, eager
attention's scores and fp32 softmax or a fused kernel, SwiGLU), so the
reserved pool (`CachingAllocator`) follows from the mechanism.  Other
families are replayed with the same block at their sizes.

Pure Python; results cached per (architecture, step, tier, recipe).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ckpt_core._memory.activations import block_modes
from ckpt_core._memory.arch import Arch
from ckpt_core._memory.autograd_sim import Sim


@dataclass(frozen=True, slots=True)
class TraceRecipe:
    """What the replay needs beyond the architecture (bytes per element unless said)."""

    batch: int
    seq: int
    act: int  # activations (4 after kbit preparation)
    compute: int  # the compute dtype (bitsandbytes' matmuls)
    residual: int  # the residual stream between blocks
    attention: str  # eager | fused | flash
    weights: int  # bytes of a non-quantized parameter as loaded
    kept: int  # bytes of a non-quantized parameter after preparation
    quantized: bool
    double_quant: bool
    full: bool  # full fine-tune: every parameter trained
    lora_rank: int
    adapted: frozenset[str]
    logits: int  # LM head output bytes, 0 when the output is dropped before backward
    state_bytes: float  # optimizer state bytes (both states) per byte of trainable parameter
    foreach_temp: bool  # torch AdamW's foreach temporary
    accumulate: bool
    eager_extra: bool = True  # CUDA eager backward's extra fp32 score-sized buffer


@functools.lru_cache(maxsize=512)
def simulate(arch: Arch, tier: str, recipe: TraceRecipe) -> tuple[int, int]:
    """(peak allocated, peak reserved) of a step after a warm-up step, in bytes.

    One step is replayed after the load, with the optimizer states the
    warm-up step created already allocated: on the shared GPU rows this gives
    the same peaks as replaying the warm-up step too (the allocator's cache is
    in its steady state after one step).
    """
    sim = Sim()
    trainable = _load(sim, arch, recipe)
    sim.accumulate = recipe.accumulate
    if recipe.accumulate:
        sim.param_grads = [sim.new(size) for size in trainable]
    state = recipe.state_bytes / 2
    for size in trainable:
        if state:
            sim.new(int(size * state))
            sim.new(int(size * state))
    sim.allocator.peak_allocated = sim.allocator.allocated
    _step(sim, arch, tier, recipe)
    if recipe.foreach_temp:
        sim.drop(*[sim.new(size) for size in trainable])
    return sim.allocator.peak_allocated, sim.allocator.peak_reserved


def _linears(arch: Arch) -> list[tuple[str, int, int]]:
    h, q, kv, inter = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, 0
    inter = arch.intermediate or arch.moe_intermediate * max(1, arch.top_k)
    names = [
        ("self_attn.q_proj", h, q),
        ("self_attn.k_proj", h, kv),
        ("self_attn.v_proj", h, kv),
        ("self_attn.o_proj", q, h),
        ("mlp.gate_proj", h, inter),
        ("mlp.up_proj", h, inter),
        ("mlp.down_proj", inter, h),
    ]
    return names if arch.glu else [item for item in names if item[0] != "mlp.gate_proj"]


def _adapted(recipe: TraceRecipe, name: str) -> bool:
    return any(name == target or name.endswith("." + target) for target in recipe.adapted) or (
        name in recipe.adapted
    )


def _load(sim: Sim, arch: Arch, recipe: TraceRecipe) -> list[int]:
    """Allocate the model as loaded and prepared; returns the trainable tensors' sizes."""
    trainable: list[int] = []
    heads = 1 if arch.tied else 2
    embeddings = [sim.new(recipe.weights * arch.vocab * arch.hidden) for _ in range(heads)]
    norms = [sim.new(recipe.weights * arch.hidden) for _ in range(2 * arch.layers + 1)]
    for _ in range(arch.layers):
        for _, fan_in, fan_out in _linears(arch):
            n = fan_in * fan_out
            if recipe.quantized:
                copy = sim.new(recipe.compute * n)
                sim.new(n // 2)
                sim.new(n // 64 if recipe.double_quant else n // 16)
                sim.drop(copy)
            else:
                sim.new(recipe.weights * n)
                if recipe.full:
                    trainable.append(recipe.weights * n)
    if recipe.quantized and recipe.kept != recipe.weights:
        for tensor in embeddings + norms:
            sim.new(sim.size(tensor) // recipe.weights * recipe.kept)
            sim.drop(tensor)
    if recipe.full:
        trainable += [recipe.weights * arch.vocab * arch.hidden] * heads
    for _ in range(arch.layers):
        for name, fan_in, fan_out in _linears(arch):
            if recipe.lora_rank and _adapted(recipe, name):
                for size in (4 * recipe.lora_rank * fan_in, 4 * recipe.lora_rank * fan_out):
                    sim.new(size)
                    trainable.append(size)
    return trainable


def _step(sim: Sim, arch: Arch, tier: str, recipe: TraceRecipe) -> None:
    tokens = recipe.batch * recipe.seq
    ids = sim.new(8 * tokens)
    hidden = sim.new(recipe.residual * tokens * arch.hidden, grad=True)
    mask = (
        sim.new(recipe.act * recipe.batch * recipe.seq * recipe.seq)
        if (recipe.attention == "eager")
        else sim.new(4)
    )
    block = functools.partial(_block, arch=arch, recipe=recipe, mask=mask)
    for mode in block_modes(arch, tier):
        if mode == "full":
            out = sim.checkpoint(block, hidden)
        else:
            out = block(sim, hidden, selective=mode == "selective")
        sim.drop(hidden)
        hidden = out
    normed = _norm(sim, hidden, tokens, arch.hidden, recipe)
    sim.drop(hidden)
    vocab = tokens * arch.vocab
    head_bytes = recipe.logits or recipe.act
    logits = sim.op(
        [normed],
        head_bytes * vocab,
        save=[normed] if recipe.full else [],
        param_grad=recipe.weights * arch.vocab * arch.hidden
        if recipe.full and not arch.tied
        else 0,
    )
    sim.drop(normed)
    upcast = sim.op([logits], 4 * vocab) if head_bytes != 4 else logits
    log_softmax = sim.op([upcast], 4 * vocab, save_out=True)
    if upcast != logits:
        sim.drop(upcast)
    loss = sim.op([log_softmax], 4, save=[log_softmax])
    sim.drop(log_softmax)
    if not recipe.logits:
        sim.drop(logits)
    sim.backward(loss)
    sim.drop(loss, ids, mask)
    if recipe.logits:
        sim.drop(logits)


def _linear(sim: Sim, x: int, name: str, shape: tuple[int, int], recipe: TraceRecipe) -> int:
    """A block linear (bitsandbytes' when quantized) and its LoRA adapter."""
    fan_in, fan_out = shape
    tokens = recipe.batch * recipe.seq
    act, compute = recipe.act, recipe.compute
    if recipe.quantized:  # bitsandbytes: cast to the compute dtype, dequantize, cast back
        cast = sim.op([x], compute * tokens * fan_in) if act != compute else x
        out = sim.op(
            [cast],
            compute * tokens * fan_out,
            temps=[compute * fan_in * fan_out],
            backward_temps=[compute * fan_in * fan_out],
        )
        if cast != x:
            sim.drop(cast)
        if act != compute:
            base = sim.op([out], act * tokens * fan_out)
            sim.drop(out)
        else:
            base = out
    else:
        trained = recipe.weights * fan_in * fan_out if recipe.full else 0
        base = sim.op([x], act * tokens * fan_out, save=[x] if trained else [], param_grad=trained)
    if not (recipe.lora_rank and _adapted(recipe, name)):
        return base
    rank = recipe.lora_rank
    lora_in = sim.op([x], 4 * tokens * fan_in) if act != 4 else x
    mid = sim.op([lora_in], 4 * tokens * rank, save=[lora_in], param_grad=4 * rank * fan_in)
    up = sim.op([mid], 4 * tokens * fan_out, save=[mid], param_grad=4 * rank * fan_out)
    scaled = sim.op([up], 4 * tokens * fan_out)
    sim.drop(up, mid)
    if lora_in != x:
        sim.drop(lora_in)
    total = sim.op([base, scaled], 4 * tokens * fan_out, alias=True)
    sim.drop(base, scaled)
    if act == 4:
        return total
    out = sim.op([total], act * tokens * fan_out)
    sim.drop(total)
    return out


def _norm(sim: Sim, x: int, rows: int, width: int, recipe: TraceRecipe) -> int:
    """Llama's RMSNorm: fp32 upcast, variance, rstd, normalized, cast back, times weight."""
    upcast = sim.op([x], 4 * rows * width) if recipe.residual != 4 else x
    square = sim.op([upcast], 4 * rows * width, save=[upcast])
    mean = sim.op([square], 4 * rows)
    sim.drop(square)
    rstd = sim.op([mean], 4 * rows, save_out=True)
    sim.drop(mean)
    normed = sim.op([upcast, rstd], 4 * rows * width, save=[upcast, rstd])
    sim.drop(rstd)
    if upcast != x:
        sim.drop(upcast)
    if recipe.residual != 4:
        cast = sim.op([normed], recipe.residual * rows * width)
        sim.drop(normed)
        normed = cast
    out_bytes = max(recipe.kept if recipe.quantized else recipe.weights, recipe.residual)
    out = sim.op([normed], out_bytes * rows * width, save=[normed] if recipe.full else [])
    sim.drop(normed)
    return out


def _rope(sim: Sim, x: int, size: int) -> int:
    cos = sim.op([x], size)
    neg = sim.op([x], size // 2)
    rotated = sim.op([neg, x], size, alias=True)
    sim.drop(neg)
    sin = sim.op([rotated], size)
    sim.drop(rotated)
    out = sim.op([cos, sin], size, alias=True)
    sim.drop(cos, sin)
    return out


def _block(
    sim: Sim, x: int, *, arch: Arch, recipe: TraceRecipe, mask: int, selective: bool = False
) -> int:
    tokens, act = recipe.batch * recipe.seq, recipe.act
    h = arch.hidden
    inter = arch.intermediate or arch.moe_intermediate * max(1, arch.top_k)
    attention = functools.partial(_attention, arch=arch, recipe=recipe, mask=mask)
    out = sim.checkpoint(attention, x) if selective else attention(sim, x)
    mid = sim.op([x, out], recipe.residual * tokens * h, alias=True)
    sim.drop(out)
    normed = _norm(sim, mid, tokens, h, recipe)
    up = _linear(sim, normed, "mlp.up_proj", (h, inter), recipe)
    if arch.glu:
        gate = _linear(sim, normed, "mlp.gate_proj", (h, inter), recipe)
        activated = sim.op([gate], act * tokens * inter, save=[gate])
        sim.drop(gate)
        product = sim.op([activated, up], act * tokens * inter, save=[activated, up])
        sim.drop(activated, up)
    else:
        product = sim.op([up], act * tokens * inter, save=[up])
        sim.drop(up)
    sim.drop(normed)
    down = _linear(sim, product, "mlp.down_proj", (inter, h), recipe)
    sim.drop(product)
    out = sim.op([mid, down], recipe.residual * tokens * h, alias=True)
    sim.drop(mid, down)
    return out


def _attention(sim: Sim, x: int, *, arch: Arch, recipe: TraceRecipe, mask: int) -> int:
    tokens, act, batch, seq = recipe.batch * recipe.seq, recipe.act, recipe.batch, recipe.seq
    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    normed = _norm(sim, x, tokens, h, recipe)
    query = _linear(sim, normed, "self_attn.q_proj", (h, q), recipe)
    key = _linear(sim, normed, "self_attn.k_proj", (h, kv), recipe)
    value = _linear(sim, normed, "self_attn.v_proj", (h, kv), recipe)
    sim.drop(normed)
    query_r, key_r = _rope(sim, query, act * tokens * q), _rope(sim, key, act * tokens * kv)
    sim.drop(query, key)
    if recipe.attention == "eager":
        scores = batch * arch.heads * seq * seq
        if arch.kv_heads < arch.heads:
            key_f = sim.op([key_r], act * tokens * q)
            value_f = sim.op([value], act * tokens * q)
            sim.drop(key_r, value)
        else:
            key_f, value_f = key_r, value
        raw = sim.op([query_r, key_f], act * scores, save=[query_r, key_f])
        sim.drop(query_r, key_f)
        scaled = sim.op([raw], act * scores)
        sim.drop(raw)
        masked = sim.op([scaled, mask], act * scores, alias=True)
        sim.drop(scaled)
        # The allocated peaks of the shared T4 rows' eager steps hold one more fp32
        # score-sized buffer during the softmax backward than the op-by-op count.
        extra = [4 * scores] if recipe.eager_extra else []
        softmax = sim.op([masked], 4 * scores, save_out=True, backward_temps=extra)
        sim.drop(masked)
        probs = sim.op([softmax], act * scores) if act != 4 else softmax
        out = sim.op([probs, value_f], act * tokens * q, save=[probs, value_f])
        sim.drop(probs, value_f)
        if probs != softmax:
            sim.drop(softmax)
        flat = sim.op([out], act * tokens * q, alias=True)
        sim.drop(out)
    else:
        lse = sim.new(4 * batch * arch.heads * seq)
        flat = sim.op(
            [query_r, key_r, value],
            act * tokens * q,
            save=[query_r, key_r, value, lse],
            save_out=True,
        )
        sim.drop(query_r, key_r, value, lse)
    out = _linear(sim, flat, "self_attn.o_proj", (q, h), recipe)
    sim.drop(flat)
    return out
