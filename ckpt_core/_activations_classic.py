"""Closed-form activation ledgers of GPT-2, Falcon, BERT and T5 (see `_activations`).

These families predate the Llama layout: LayerNorm (or T5's RMS norm) instead
of RMSNorm, GELU / ReLU MLPs, learned or relative positions, dropout on by
default, and for T5 an encoder and a decoder with cross-attention whose
relative position bias is computed in the first block and handed to the others.

`family_parts` returns what `_activations._compose` needs: the block counts
per stack, the embedding and head scopes, and the block-ledger function.

Pure arithmetic.
"""

from __future__ import annotations

from typing import Any

from ckpt_core._activations import (
    BlockFn,
    attention_core,
    causal_loss,
    mask_bytes,
    mask_kind,
    rope_tables,
)
from ckpt_core._arch import Arch
from ckpt_core._ledger import GLOBAL, Ledger, Step, activation, dropout, linear, norm


def family_parts(arch: Arch, step: Step) -> tuple[list[int], Ledger, Ledger, BlockFn]:
    """Stacks, embedding scope, head scope and block function of a classic family."""
    parts: dict[str, Any] = {
        "gpt2": ([arch.layers], _gpt2_embed, _layer_norm_head, _gpt2_block),
        "falcon": ([arch.layers], _falcon_embed, _layer_norm_head, _falcon_block),
        "bert": ([arch.layers], _bert_embed, _bert_head, _bert_block),
        "t5": ([arch.encoder_layers, arch.layers], _t5_embed, _t5_head, _t5_block),
    }
    stacks, embed, head, block = parts[arch.family]
    return stacks, embed(arch, step), head(arch, step), block


def _mlp(led: Ledger, arch: Arch, step: Step, x: str, names: tuple[str, str]) -> str:
    """fc2(act(fc1(x))): returns the storage of fc2's output."""
    elements = step.tokens * arch.intermediate
    linear(led, step, x, arch.hidden, names[0])
    act = activation(led, step, "mlp.fc1", tag="mlp.act", kind=arch.act, elements=elements)
    linear(led, step, act, arch.intermediate, names[1])
    return "mlp.out"


def _layer_norm_head(arch: Arch, step: Step) -> Ledger:
    """Final LayerNorm, LM head, fp32 causal-LM loss (GPT-2, Falcon)."""
    led = Ledger()
    out = norm(led, step, "in", "ln_f", kind="layer", rows=step.tokens, width=arch.hidden)
    linear(led, step, out, arch.hidden, "lm_head")
    causal_loss(led, step.tokens, arch.vocab)
    return led


# --- GPT-2 ---------------------------------------------------------------------


def _gpt2_embed(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)
        led.keep(f"{GLOBAL}position_ids", 8 * step.seq)
    dropout(
        led, step, "embeddings", tag="embed.drop", p=arch.embed_dropout, elements=_n(arch, step)
    )
    return led


def _n(arch: Arch, step: Step) -> int:
    return step.tokens * arch.hidden


def _gpt2_block(arch: Arch, step: Step, mode: str, kind: int) -> Ledger:
    led = Ledger()
    e, n = step.dtype_bytes, _n(arch, step)
    if mode == "ckpt":
        led.keep("in", e * n)
        _classic_mask(led, arch, step)
        return led
    x = norm(led, step, "in", "ln_1", kind="layer", rows=step.tokens, width=arch.hidden)
    if mode == "selective":
        led.keep(x, e * n)
        _classic_mask(led, arch, step)
    else:
        linear(led, step, x, arch.hidden, "attn.c_attn")
        qkv = ("attn.qkv", "attn.qkv", "attn.qkv", 3 * e * n)  # q, k, v: views of one storage
        out = attention_core(led, arch, step, qkv, mask=_mask(arch, step), softmax_fp32=False)
        linear(led, step, out, arch.hidden, "attn.c_proj")
        # the residual dropout is inside GPT2Attention (checkpointed with it)
        dropout(led, step, "attn.proj", tag="attn.resid_drop", p=arch.hidden_dropout, elements=n)
    x = norm(led, step, "mid", "ln_2", kind="layer", rows=step.tokens, width=arch.hidden)
    _mlp(led, arch, step, x, ("mlp.c_fc", "mlp.c_proj"))
    dropout(led, step, "mlp.out", tag="mlp.drop", p=arch.hidden_dropout, elements=n)
    return led


def _mask(arch: Arch, step: Step) -> str | None:
    return mask_kind(arch, step, sliding=False)


def _classic_mask(led: Ledger, arch: Arch, step: Step) -> None:
    """The mask a checkpointed region keeps as an input (eager, or Falcon's sdpa)."""
    mask = _mask(arch, step)
    if mask is not None:
        led.keep(f"{GLOBAL}mask.{mask}", mask_bytes(step, mask))


# --- Falcon --------------------------------------------------------------------


def _falcon_embed(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)
    return led


def _falcon_block(arch: Arch, step: Step, mode: str, kind: int) -> Ledger:
    """Falcon: parallel attention and MLP from one (7B) or two (new architecture) norms."""
    led = Ledger()
    e, n, rows, h = step.dtype_bytes, _n(arch, step), step.tokens, arch.hidden
    if mode == "ckpt":
        led.keep("in", e * n)
        _falcon_inputs(led, arch, step)
        return led
    attn_in = norm(led, step, "in", "ln_attn", kind="layer", rows=rows, width=h)
    if mode == "selective":
        led.keep(attn_in, e * n)
        _falcon_inputs(led, arch, step)
    else:
        _falcon_attention(led, arch, step, attn_in)
    if not arch.parallel_attn:
        mlp_in = norm(led, step, "mid", "ln_mlp", kind="layer", rows=rows, width=h)
    elif arch.falcon_norms == 2:
        mlp_in = norm(led, step, "in", "ln_mlp", kind="layer", rows=rows, width=h)
    else:
        mlp_in = attn_in  # one norm feeds both branches
    _mlp(led, arch, step, mlp_in, ("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"))
    return led


def _falcon_inputs(led: Ledger, arch: Arch, step: Step) -> None:
    rope_tables(led, arch, step, sliding=False)
    led.keep(f"{GLOBAL}position_ids", 8 * step.seq)
    _classic_mask(led, arch, step)


def _falcon_attention(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    """Fused qkv split into heads with reshape copies; rotary on q and k."""
    e, tokens, d = step.dtype_bytes, step.tokens, arch.head_dim
    linear(led, step, x, arch.hidden, "self_attention.query_key_value")
    rope_tables(led, arch, step, sliding=False)
    v = ("attn.v", e * tokens * arch.kv_heads * d)  # transpose + reshape copies v
    out = attention_core(
        led, arch, step, ("q_rope", "k_rope", *v), mask=_mask(arch, step), softmax_fp32=False
    )
    linear(led, step, out, arch.hidden, "self_attention.dense")


# --- BERT (masked LM) ----------------------------------------------------------


def _bert_embed(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)
        led.keep("token_type_ids", 8 * step.seq)  # gathered from the buffer, batch-expanded
    x = norm(led, step, "embeddings", "embed.ln", kind="layer", rows=step.tokens, width=arch.hidden)
    dropout(led, step, x, tag="embed.drop", p=arch.embed_dropout, elements=_n(arch, step))
    return led


def _bert_block(arch: Arch, step: Step, mode: str, kind: int) -> Ledger:
    """Post-LN: attention (+ output dense, dropout, LayerNorm), then the MLP likewise."""
    led = Ledger()
    e, n, rows, h = step.dtype_bytes, _n(arch, step), step.tokens, arch.hidden
    if mode != "plain":  # a checkpointed block or attention keeps its input and the mask
        led.keep("in", e * n)
        _classic_mask(led, arch, step)
    if mode == "ckpt":
        return led
    if mode == "plain":
        for name in ("query", "key", "value"):
            linear(led, step, "in", h, f"attention.self.{name}")
        qkv = ("attn.q", "attn.k", "attn.v", e * n)
        out = attention_core(led, arch, step, qkv, mask=_mask(arch, step), softmax_fp32=False)
        linear(led, step, out, h, "attention.output.dense")
        dropout(led, step, "attn.dense", tag="attn.drop", p=arch.hidden_dropout, elements=n)
        norm(led, step, "attn.sum", "attn.ln", kind="layer", rows=rows, width=h)
    _mlp(led, arch, step, "attn.ln.out", ("intermediate.dense", "output.dense"))
    dropout(led, step, "mlp.out", tag="mlp.drop", p=arch.hidden_dropout, elements=n)
    norm(led, step, "mlp.sum", "out.ln", kind="layer", rows=rows, width=h)
    return led


def _bert_head(arch: Arch, step: Step) -> Ledger:
    """Transform (dense, GELU, LayerNorm), decoder, cross-entropy in the dtype."""
    led = Ledger()
    e, rows, h = step.dtype_bytes, step.tokens, arch.hidden
    linear(led, step, "in", h, "cls.predictions.transform.dense")
    act = activation(led, step, "head.dense", tag="head.act", kind=arch.act, elements=rows * h)
    out = norm(led, step, act, "head.ln", kind="layer", rows=rows, width=h)
    linear(led, step, out, h, "cls.predictions.decoder")
    led.keep("loss.log_softmax", e * rows * arch.vocab)  # CrossEntropyLoss on the dtype logits
    led.keep("loss.weight", 4)
    return led


# --- T5 --------------------------------------------------------------------------


def _t5_embed(arch: Arch, step: Step) -> Ledger:
    """Both stacks' embeddings: ids, shifted decoder ids, dropout masks."""
    led = Ledger()
    n = _n(arch, step)
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)
        led.keep("decoder_ids", 8 * step.tokens)  # labels shifted right
    for stack in ("encoder", "decoder"):
        dropout(led, step, f"{stack}.embed", tag=f"{stack}.drop", p=arch.embed_dropout, elements=n)
    # the encoder's final norm and dropout: its output feeds every cross-attention
    out = norm(
        led, step, "encoder.last", "encoder.ln_f", kind="t5", rows=step.tokens, width=arch.hidden
    )
    dropout(led, step, out, tag="encoder.out_drop", p=arch.hidden_dropout, elements=n)
    return led


def _t5_head(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    e, rows, h = step.dtype_bytes, step.tokens, arch.hidden
    out = norm(led, step, "in", "decoder.ln_f", kind="t5", rows=rows, width=h)
    dropout(led, step, out, tag="decoder.out_drop", p=arch.hidden_dropout, elements=rows * h)
    linear(led, step, "scaled", h, "lm_head")  # tied head: the output times d_model ** -0.5
    led.keep("loss.log_softmax", e * rows * arch.vocab)  # CrossEntropyLoss on the dtype logits
    led.keep("loss.weight", 4)
    return led


def _t5_block(arch: Arch, step: Step, mode: str, kind: int) -> Ledger:
    """kind = 2 * stack + first: stack 0 encoder, 1 decoder; first computes the bias."""
    led = Ledger()
    decoder, first = kind >= 2, bool(kind & 1)
    e, n, rows, h = step.dtype_bytes, _n(arch, step), step.tokens, arch.hidden
    if mode == "ckpt":
        led.keep("in", e * n)
        _t5_inputs(led, arch, step, decoder=decoder, first=first, cross=True)
        return led
    if mode == "selective":
        led.keep("in", e * n)
        _t5_inputs(led, arch, step, decoder=decoder, first=first, cross=False)
    else:
        # norm, attention and dropout: T5LayerSelfAttention, checkpointed as one
        x = norm(led, step, "in", "sa.ln", kind="t5", rows=rows, width=h)
        _t5_attention(led, arch, step, x, "sa", decoder=decoder, first=first)
        dropout(led, step, "sa.o", tag="sa.drop", p=arch.hidden_dropout, elements=n)
    ff_in = "mid"
    if decoder:
        if mode == "selective":
            led.keep("mid", e * n)
            led.keep(f"{GLOBAL}encoder_out", e * n)
            if not first:
                led.keep(f"{GLOBAL}cross_bias", e * arch.heads * step.seq * step.seq)
        else:
            x = norm(led, step, "mid", "ca.ln", kind="t5", rows=rows, width=h)
            _t5_attention(led, arch, step, x, "ca", decoder=True, first=False, cross=True)
            dropout(led, step, "ca.o", tag="ca.drop", p=arch.hidden_dropout, elements=n)
        ff_in = "mid2"
    x = norm(led, step, ff_in, "ff.ln", kind="t5", rows=rows, width=h)
    _t5_feed_forward(led, arch, step, x)
    dropout(led, step, "ff.o", tag="ff.drop", p=arch.hidden_dropout, elements=n)
    return led


def _t5_inputs(
    led: Ledger, arch: Arch, step: Step, *, decoder: bool, first: bool, cross: bool
) -> None:
    """A checkpointed T5 block (or self-attention) keeps the bias handed from block 0."""
    bias = arch.heads * step.seq * step.seq * step.dtype_bytes
    if decoder and step.attention == "eager":  # the causal mask, a float tensor
        led.keep(f"{GLOBAL}mask.eager.full", mask_bytes(step, "eager.full"))
    if not first:
        led.keep(f"{GLOBAL}{'decoder' if decoder else 'encoder'}.position_bias", bias)
    if decoder and cross:
        led.keep(f"{GLOBAL}encoder_out", step.dtype_bytes * _n(arch, step))
        if not first:
            led.keep(f"{GLOBAL}cross_bias", bias)


def _t5_attention(
    led: Ledger,
    arch: Arch,
    step: Step,
    x: str,
    tag: str,
    *,
    decoder: bool,
    first: bool,
    cross: bool = False,
) -> None:
    """Attention with T5's relative position bias (sdpa: a float mask; eager: an added bias)."""
    e, rows, h = step.dtype_bytes, step.tokens, arch.hidden
    inner = arch.heads * arch.head_dim
    module = "EncDecAttention" if cross else "SelfAttention"
    linear(led, step, x, h, f"{module}.q")
    kv_source = f"{GLOBAL}encoder_out" if cross else x
    linear(led, step, kv_source, h, f"{module}.k")
    linear(led, step, kv_source, h, f"{module}.v")
    if first and not cross:  # the bucket indices of the relative-position embedding
        led.keep(f"{tag}.buckets", 8 * step.seq * step.seq)
    if step.attention == "eager":
        _t5_eager(led, arch, step, tag)
        linear(led, step, f"{tag}.out", inner, f"{module}.o")
        return
    for name in ("q", "k", "v", "out"):
        led.keep(f"{tag}.{name}", e * rows * inner)
    led.keep(f"{tag}.lse", 4 * step.batch * arch.heads * step.seq)
    bias = e * arch.heads * step.seq * step.seq
    if cross:
        led.keep(f"{GLOBAL}cross_bias", bias)  # zeros made in block 0, kept by all
    else:
        if decoder:  # causal: torch.where keeps its boolean condition
            led.keep(f"{tag}.causal", step.seq * step.seq)
        led.keep(f"{tag}.bias", bias)  # a contiguous copy of the bias, per layer
    linear(led, step, f"{tag}.out", inner, f"{module}.o")


def _t5_eager(led: Ledger, arch: Arch, step: Step, tag: str) -> None:
    """Eager T5: copies of q, k, v for matmul; softmax and dropout in the dtype."""
    e, rows = step.dtype_bytes, step.tokens
    inner = arch.heads * arch.head_dim
    scores = step.batch * arch.heads * step.seq * step.seq
    for name in ("q_copy", "k_copy", "v_copy", "out"):
        led.keep(f"{tag}.{name}", e * rows * inner)
    led.keep(f"{tag}.softmax", e * scores)
    probs = dropout(
        led, step, f"{tag}.softmax", tag=f"{tag}.probs_drop", p=arch.attn_dropout, elements=scores
    )
    led.keep(probs, e * scores)


def _t5_feed_forward(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    e, elements = step.dtype_bytes, step.tokens * arch.intermediate
    if arch.glu:
        linear(led, step, x, arch.hidden, "DenseReluDense.wi_0")
        act = activation(led, step, "ff.gate", tag="ff.act", kind=arch.act, elements=elements)
        led.keep(act, e * elements)
        led.keep("ff.up", e * elements)
    else:
        linear(led, step, x, arch.hidden, "DenseReluDense.wi")
        activation(led, step, "ff.wi", tag="ff.act", kind=arch.act, elements=elements)
    hidden = dropout(
        led, step, "ff.act.out", tag="ff.inner_drop", p=arch.hidden_dropout, elements=elements
    )
    linear(led, step, hidden, arch.intermediate, "DenseReluDense.wo")
