"""Closed-form activation bytes per checkpointing tier (DESIGN section 5).

Same definition as the meta measurement (`ckpt_core._measure`): the unique
storages autograd keeps at the end of one training forward with labels,
parameters excluded.  Each family's forward is written down op by op as a
`Ledger` of kept storages (see `ckpt_core._ledger`), per block kind and per
mode:

- ``plain``: the block runs normally and keeps what its ops keep;
- ``selective``: the attention module is checkpointed - it keeps only its
  tensor inputs (hidden states, cos / sin, mask, position ids);
- ``ckpt``: the whole block is checkpointed - it keeps only its tensor inputs.

A tier assigns a mode to every block: off -> plain; selective -> selective;
full -> ckpt; medium -> ckpt for every other block counted across stacks from
0 (HF's ``every_n_layers=2``), plain otherwise.  The total is the embedding and
head scopes, plus each block's own storages, plus the storages shared by all
blocks (cos / sin, masks, ids) once.

What transformers 5.24 runs on a GPU is what is written down: fused attention
(sdpa without a mask, flash) keeps q, k, v, output and log-sum-exp; sdpa with a
materialized mask (sliding windows longer than the window, Falcon) keeps a
float copy of the mask per layer and repeats GQA heads; eager keeps the fp32
softmax, its cast to the dtype, and full-head copies of q, k, v.  Dropout
masks are CUDA's 1-byte masks.

Pure arithmetic; `ckpt_core._activations_classic` holds GPT-2, Falcon, BERT
and T5.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

from ckpt_core._arch import Arch
from ckpt_core._ledger import GLOBAL, Ledger, Step, activation, dropout, linear, norm

TIERS: Final[tuple[str, ...]] = ("off", "selective", "medium", "full")

BlockFn = Callable[[Arch, Step, str, int], Ledger]


def activation_bytes(arch: Arch, step: Step, tier: str) -> int:
    """Bytes autograd keeps at the end of the forward for ``tier`` (closed form)."""
    if arch.family == "decoder":
        scopes = (_decoder_embed(arch, step), _decoder_head(arch, step))
    else:
        from ckpt_core._activations_classic import family_parts

        _, embed, head, _ = family_parts(arch, step)
        scopes = (embed, head)
    shared: dict[str, int] = {}
    total = 0
    for scope in scopes:
        total += scope.local_bytes()
        shared.update(scope.globals())
    for (mode, kind), count in _block_counts(arch, tier):
        local, globals_ = block_bytes(arch, step, mode, kind)
        total += count * local
        shared.update(globals_)
    return total + sum(shared.values())


@functools.lru_cache(maxsize=4096)
def block_bytes(
    arch: Arch, step: Step, mode: str, kind: int
) -> tuple[int, tuple[tuple[str, int], ...]]:
    """One block's own bytes and the shared storages it keeps (cached: pure function)."""
    if arch.family == "decoder":
        block: BlockFn = _decoder_block
    else:
        from ckpt_core._activations_classic import family_parts

        block = family_parts(arch, step)[3]
    ledger = block(arch, step, mode, kind)
    return ledger.local_bytes(), tuple(ledger.globals().items())


def head_bytes(arch: Arch, step: Step) -> int:
    """What the embedding and head scopes keep (freed once the loss backward has run)."""
    if arch.family == "decoder":
        return _decoder_head(arch, step).local_bytes()
    from ckpt_core._activations_classic import family_parts

    return family_parts(arch, step)[2].local_bytes()


def largest_block(arch: Arch, step: Step, mode: str) -> int:
    """The local bytes of the largest block in ``mode`` (for the backward working set)."""
    kinds = {kind for _, kind in _block_counts(arch, "off")}
    return max(block_bytes(arch, step, mode, kind)[0] for kind in kinds)


def block_modes(arch: Arch, tier: str) -> list[tuple[int, int, str]]:
    """(stack, index in stack, mode) of every block under ``tier``.

    HF's ``every_n_layers`` counts blocks across stacks in module order; a
    vision tower comes first (its blocks are hooked too, but text-only
    training never runs them).
    """
    stacks = [arch.encoder_layers, arch.layers] if arch.family == "t5" else [arch.layers]
    counter = arch.vision.layers if arch.vision is not None else 0
    modes = []
    for stack, layers in enumerate(stacks):
        for index in range(layers):
            modes.append((stack, index, _mode(tier, counter)))
            counter += 1
    return modes


@functools.lru_cache(maxsize=1024)
def _block_counts(arch: Arch, tier: str) -> tuple[tuple[tuple[str, int], int], ...]:
    """How many blocks of each (mode, kind) the tier has (cached per architecture)."""
    counts: dict[tuple[str, int], int] = {}
    for stack, index, mode in block_modes(arch, tier):
        key = (mode, _block_kind(arch, stack, index))
        counts[key] = counts.get(key, 0) + 1
    return tuple(counts.items())


def _mode(tier: str, counter: int) -> str:
    if tier == "off":
        return "plain"
    if tier == "selective":
        return "selective"
    if tier == "full" or counter % 2 == 0:
        return "ckpt"
    return "plain"


def _block_kind(arch: Arch, stack: int, index: int) -> int:
    """A small int telling blocks apart that keep different storages.

    Decoder: bit 0 = sliding-window layer, bit 1 = MoE layer.  T5: the stack
    (0 encoder, 1 decoder) and whether the block owns the relative bias.
    """
    if arch.family == "t5":
        return stack * 2 + (index == 0)
    sliding = bool(arch.sliding_layers) and arch.sliding_layers[index]
    moe = bool(arch.moe_layers) and arch.moe_layers[index]
    return int(sliding) + 2 * int(moe)


# --- the decoder family (Llama, Mistral, Mixtral, Qwen2/3, Phi-3, OLMo-2, Gemma 2/3) ---


def _decoder_embed(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)  # the embedding keeps its indices
    return led


def _decoder_head(arch: Arch, step: Step) -> Ledger:
    """Final norm, LM head, (softcapping), fp32 log-softmax of the loss, shifted labels."""
    led = Ledger()
    tokens, e, vocab = step.tokens, step.dtype_bytes, arch.vocab
    out = norm(led, step, "in", "final_norm", kind=arch.norm, rows=tokens, width=arch.hidden)
    linear(led, step, out, arch.hidden, "lm_head")
    if arch.final_softcap:
        led.keep("softcap.tanh", e * tokens * vocab)
    causal_loss(led, tokens, vocab)
    return led


def causal_loss(led: Ledger, tokens: int, vocab: int) -> None:
    """transformers' ForCausalLMLoss: logits upcast to fp32, shifted labels, log-softmax kept."""
    led.keep("loss.log_softmax", 4 * tokens * vocab)
    led.keep("loss.labels", 8 * tokens)
    led.keep("loss.weight", 4)


def _decoder_block(arch: Arch, step: Step, mode: str, kind: int) -> Ledger:
    led = Ledger()
    e, tokens, h = step.dtype_bytes, step.tokens, arch.hidden
    sliding, moe = bool(kind & 1), bool(kind & 2)
    if mode == "ckpt":
        led.keep("in", step.residual_bytes * tokens * h)
        _block_inputs(led, arch, step, sliding)
        return led
    olmo = arch.sandwich == "olmo2"
    attn_in = "in" if olmo else norm(led, step, "in", "ln_in", kind=arch.norm, rows=tokens, width=h)
    if mode == "selective":
        led.keep(attn_in, e * tokens * h)
        _block_inputs(led, arch, step, sliding)
    else:
        _decoder_attention(led, arch, step, attn_in, sliding)
    if arch.sandwich:
        norm(led, step, "attn.out", "ln_post_attn", kind=arch.norm, rows=tokens, width=h)
    if arch.sandwich == "gemma":
        mlp_in = norm(led, step, "mid", "ln_pre_mlp", kind=arch.norm, rows=tokens, width=h)
    elif olmo:
        mlp_in = "mid"
    else:
        mlp_in = norm(led, step, "mid", "ln_post", kind=arch.norm, rows=tokens, width=h)
    if moe:
        _moe(led, arch, step, mlp_in)
    else:
        glu_mlp(led, arch, step, mlp_in)
    if arch.sandwich:
        norm(led, step, "mlp.out", "ln_post_mlp", kind=arch.norm, rows=tokens, width=h)
    return led


def _block_inputs(led: Ledger, arch: Arch, step: Step, sliding: bool) -> None:
    """Tensors a checkpointed block or attention keeps besides its hidden states."""
    rope_tables(led, arch, step, sliding)
    led.keep(f"{GLOBAL}position_ids", 8 * step.seq)
    mask = mask_kind(arch, step, sliding)
    if mask is not None:
        led.keep(f"{GLOBAL}mask.{mask}", mask_bytes(step, mask))


def mask_kind(arch: Arch, step: Step, sliding: bool) -> str | None:
    """The attention mask transformers materializes for this layer, if any.

    Eager always gets a float mask in the dtype.  sdpa gets a boolean mask
    when a sliding window is shorter than the sequence (or always, for
    Falcon); otherwise None and the kernel's causal flag.  Flash: never.
    """
    window = sliding and arch.sliding_window is not None and step.seq >= arch.sliding_window
    suffix = "sliding" if window else "full"
    if arch.family == "bert":  # bidirectional without padding: no mask at all
        return None
    if step.attention == "eager":  # a mask per layer type, whatever the length
        return f"eager.{'sliding' if sliding else 'full'}"
    if step.attention == "fused" and (window or arch.family == "falcon"):
        return f"bool.{suffix}"
    return None


def mask_bytes(step: Step, mask: str) -> int:
    """Eager's float mask exists per sample; sdpa's boolean one is a batch-expanded view."""
    if mask.startswith("eager"):
        return step.dtype_bytes * step.batch * step.seq * step.seq
    return step.seq * step.seq


def _decoder_attention(led: Ledger, arch: Arch, step: Step, x: str, sliding: bool) -> None:
    e, tokens, h, d = step.dtype_bytes, step.tokens, arch.hidden, arch.head_dim
    q, kv = arch.heads * d, arch.kv_heads * d
    if arch.fused_qkv:
        linear(led, step, x, h, "self_attn.qkv_proj")
        q_raw = k_raw = v = "qkv"
        v_bytes = e * tokens * (q + 2 * kv)
    else:
        for name in ("q_proj", "k_proj", "v_proj"):
            linear(led, step, x, h, f"self_attn.{name}")
        q_raw, k_raw, v, v_bytes = "q_raw", "k_raw", "v", e * tokens * kv
    if arch.qk_norm == "head":
        norm(led, step, q_raw, "q_norm", kind=arch.norm, rows=tokens * arch.heads, width=d)
        norm(led, step, k_raw, "k_norm", kind=arch.norm, rows=tokens * arch.kv_heads, width=d)
    elif arch.sandwich == "olmo2":  # OLMo-2 normalizes the whole projections
        norm(led, step, q_raw, "q_norm", kind=arch.norm, rows=tokens, width=q)
        norm(led, step, k_raw, "k_norm", kind=arch.norm, rows=tokens, width=kv)
    rope_tables(led, arch, step, sliding)
    mask = mask_kind(arch, step, sliding)
    out = attention_core(led, arch, step, ("q_rope", "k_rope", v, v_bytes), mask=mask)
    linear(led, step, out, q, "self_attn.o_proj")


def rope_tables(led: Ledger, arch: Arch, step: Step, sliding: bool) -> None:
    """RoPE multiplies by cos and sin: both kept (shared by every layer)."""
    e, seq = 4 if arch.rope_fp32 else step.dtype_bytes, step.seq
    rope = "local" if sliding and arch.model_type.startswith("gemma3") else "global"
    led.keep(f"{GLOBAL}cos.{rope}", e * seq * arch.head_dim)
    led.keep(f"{GLOBAL}sin.{rope}", e * seq * arch.head_dim)


def attention_core(
    led: Ledger,
    arch: Arch,
    step: Step,
    qkv: tuple[str, str, str, int],
    *,
    mask: str | None,
    softmax_fp32: bool = True,
) -> str:
    """The attention kernel on q, k, v storages; returns the output storage (o_proj's input).

    ``qkv`` = (q name, k name, v storage name, v storage bytes); q and k are
    storages of ``heads`` and ``kv_heads`` width.  ``mask``: the mask
    transformers passes (`mask_kind`).  ``softmax_fp32``: eager upcasts the
    scores to fp32 (Llama-style) rather than keeping them in the dtype
    (GPT-2, BERT, Falcon).
    """
    q_name, k_name, v_name, v_bytes = qkv
    e, tokens, batch, seq = step.dtype_bytes, step.tokens, step.batch, step.seq
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    scores = batch * arch.heads * seq * seq
    led.keep(q_name, e * tokens * q)
    if step.attention == "eager":
        if 1 < arch.kv_heads < arch.heads or batch > 1:
            # repeat_kv copies, or matmul's reshape of (batch, heads) copies the views
            led.keep("attn.k_full", e * tokens * q)
            led.keep("attn.v_full", e * tokens * q)
        else:  # batch 1: matmul reshapes the views (one kv head: a stride-0 expand) as they are
            led.keep(k_name, e * tokens * kv)
            led.keep(v_name, v_bytes)
        if arch.attn_softcap:
            led.keep("attn.tanh", e * scores)
        softmax_bytes = 4 if softmax_fp32 else e
        led.keep("attn.softmax", softmax_bytes * scores)
        probs = "attn.softmax" if softmax_bytes == e else "attn.probs"
        probs = dropout(led, step, probs, tag="attn.dropout", p=arch.attn_dropout, elements=scores)
        led.keep(probs, e * scores)
        led.keep("attn.o_in", e * tokens * q)  # transpose(1, 2).contiguous() copies
        return "attn.o_in"
    if mask is not None and 1 < arch.kv_heads < arch.heads:
        # a mask turns off sdpa's native GQA: repeat_kv copies (one kv head: a stride-0 view)
        led.keep("attn.k_rep", e * tokens * q)
        led.keep("attn.v_rep", e * tokens * q)
    else:
        led.keep(k_name, e * tokens * kv)
        led.keep(v_name, v_bytes)
    if mask is not None:  # the kernel keeps a float copy of the boolean mask, per layer
        led.keep("attn.bias", e * batch * seq * seq)
    led.keep("attn.lse", 4 * batch * arch.heads * seq)
    led.keep("attn.o_in", e * tokens * q)  # fused kernels write (b, s, h, d): no copy
    return "attn.o_in"


def glu_mlp(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    """down(act(gate(x)) * up(x)); Phi-3 fuses gate and up into one projection."""
    e, tokens, h, inter = step.dtype_bytes, step.tokens, arch.hidden, arch.intermediate
    elements = tokens * inter
    if arch.fused_gate_up:
        linear(led, step, x, h, "mlp.gate_up_proj")
        led.keep("mlp.gate_up", 2 * e * elements)  # gate and up are views of it
        gate, up = "mlp.gate_up", "mlp.gate_up"
    else:
        linear(led, step, x, h, "mlp.gate_proj")
        linear(led, step, x, h, "mlp.up_proj")
        gate, up = "mlp.gate", "mlp.up"
    act = activation(led, step, gate, tag="mlp.act", kind=arch.act, elements=elements)
    led.keep(act, e * elements)  # the product keeps both factors
    led.keep(up, e * elements)
    linear(led, step, "mlp.product", inter, "mlp.down_proj")


def _moe(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    """Router + transformers' grouped_mm experts over tokens x top_k rows."""
    e, tokens, h = step.dtype_bytes, step.tokens, arch.hidden
    rows, inter, experts = tokens * arch.top_k, arch.moe_intermediate, arch.experts
    trained = step.trainable_weights
    if trained:
        led.keep(x, e * tokens * h)  # the router's weight gradient
    led.keep("router.softmax", 4 * tokens * experts)
    led.keep("router.top_index", 8 * rows)
    led.keep("router.top_sum", 4 * tokens)
    led.keep("router.top_value", 4 * rows)
    for name in ("experts.perm", "experts.token_index", "experts.inverse_perm"):
        led.keep(name, 8 * rows)
    led.keep("experts.offsets", 4 * experts)
    if trained:
        led.keep("experts.selected", e * rows * h)
    led.keep("experts.gate_up", 2 * e * rows * inter)
    led.keep("experts.act", e * rows * inter)
    if trained:
        led.keep("experts.product", e * rows * inter)
    led.keep("experts.down", e * rows * h)
    led.keep("experts.weights", (e if arch.router_in_dtype else 4) * rows)
