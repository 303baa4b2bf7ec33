"""T5 and mT5: an encoder and a decoder stack, relative position bias, RMS norms, (gated) MLPs.

Everything the memory model knows about T5, in one place.  The first block
of each stack computes the relative position bias and hands it to the
others; decoder blocks add cross-attention over the encoder's output.  The
loss takes the logits in the dtype.  A padded batch is what a seq2seq
collator feeds: a padding mask for the encoder, which its self-attention and
the decoder's cross-attention read, and none for the decoder (its padded
labels are -100).  sdpa then folds each layer's bias into that mask, one per
sample (transformers' ``create_position_bias_mask``).  Loaded in fp16,
transformers keeps each ``wo`` in fp32 (``_keep_in_fp32_modules``): its input
is cast to fp32 and its output is fp32, so from the first feed-forward on
the residual stream is fp32, and only the first block of each stack clamps
its fp16 residual (`_wide`).  The step replay runs its own forward
(`ckpt_core._memory.t5_trace`).  Pure arithmetic.
"""

from __future__ import annotations

from typing import Any

from ckpt_core._memory.arch import Arch, BlockKind, read_activation, read_int
from ckpt_core._memory.attention import mask_bytes
from ckpt_core._memory.costs import (
    BlockFlops,
    core_flops,
    dense_mlp_flops,
    lm_head_flops,
)
from ckpt_core._memory.families.common import (
    hidden_elements,
)
from ckpt_core._memory.family import Family
from ckpt_core._memory.ledger import (
    GLOBAL,
    BlockMode,
    Ledger,
    Step,
    activation,
    dropout,
    linear,
    norm,
)
from ckpt_core._memory.param_layout import Linear, ParamLayout, embedding_parameters
from ckpt_core._memory.t5_trace import T5, norm_count


def _read_arch(config: Any, model_type: str) -> Arch:
    hidden = read_int(config, "d_model")
    heads = read_int(config, "num_heads")
    gated = bool(getattr(config, "is_gated_act", False))
    layers = read_int(config, "num_layers")
    return Arch(
        model_type=model_type,
        family="t5",
        softmax_in_dtype=True,
        hidden=hidden,
        layers=read_int(config, "num_decoder_layers", default=layers),
        encoder_layers=layers,
        heads=heads,
        kv_heads=heads,
        head_dim=read_int(config, "d_kv"),
        intermediate=read_int(config, "d_ff"),
        vocab=read_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", True)),
        act=read_activation(config, "dense_act_fn"),
        glu=gated,
        norm="t5",
        attn_dropout=float(config.dropout_rate or 0.0),
        hidden_dropout=float(config.dropout_rate or 0.0),
        embed_dropout=float(config.dropout_rate or 0.0),
        relative_buckets=read_int(config, "relative_attention_num_buckets"),
    )


def _param_layout(arch: Arch) -> ParamLayout:
    h, inner, ff = arch.hidden, arch.heads * arch.head_dim, arch.intermediate
    enc, dec = arch.encoder_layers, arch.layers
    attention = [
        Linear(f"{module}.{name}", h, inner, count)
        if name != "o"
        else Linear(f"{module}.o", inner, h, count)
        for module, count in (("SelfAttention", enc + dec), ("EncDecAttention", dec))
        for name in ("q", "k", "v", "o")
    ]
    feed = (
        [
            Linear("DenseReluDense.wi_0", h, ff, enc + dec),
            Linear("DenseReluDense.wi_1", h, ff, enc + dec),
        ]
        if arch.glu
        else [Linear("DenseReluDense.wi", h, ff, enc + dec)]
    )
    feed.append(Linear("DenseReluDense.wo", ff, h, enc + dec))
    norms = norm_count(arch) * h  # RMS norms, no bias
    relative = 2 * arch.relative_buckets * arch.heads  # first block of each stack
    return ParamLayout((*attention, *feed), 0, embedding_parameters(arch), norms + relative)


def _stacks(arch: Arch) -> tuple[int, ...]:
    return (arch.encoder_layers, arch.layers)


def _block_kind(arch: Arch, stack: int, index: int) -> BlockKind:
    return BlockKind(decoder_stack=stack == 1, first_in_stack=index == 0)


def _embed(arch: Arch, step: Step) -> Ledger:
    """Both stacks' embeddings: ids, shifted decoder ids, dropout masks."""
    led = Ledger()
    n = hidden_elements(arch, step)
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)
        led.keep("decoder_ids", 8 * step.tokens)  # labels shifted right
    for stack in ("encoder", "decoder"):
        dropout(led, step, f"{stack}.embed", tag=f"{stack}.drop", p=arch.embed_dropout, elements=n)
    # the encoder's final norm and dropout: its output feeds every cross-attention
    out = norm(
        led,
        step,
        "encoder.last",
        "encoder.ln_f",
        kind="t5",
        rows=step.tokens,
        width=arch.hidden,
        in_bytes=_residual_bytes(step, first=False),
    )
    dropout(led, step, out, tag="encoder.out_drop", p=arch.hidden_dropout, elements=n)
    return led


def _head(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    elem_bytes, rows, h = step.dtype_bytes, step.tokens, arch.hidden
    out = norm(
        led,
        step,
        "in",
        "decoder.ln_f",
        kind="t5",
        rows=rows,
        width=h,
        in_bytes=_residual_bytes(step, first=False),
    )
    dropout(led, step, out, tag="decoder.out_drop", p=arch.hidden_dropout, elements=rows * h)
    linear(led, step, "scaled", h, "lm_head")  # tied head: the output times d_model ** -0.5
    # CrossEntropyLoss on the dtype logits: nll_loss keeps the labels (a seq2seq
    # collator's own tensor) and its total weight, a scalar in the logits' dtype.
    led.keep("loss.log_softmax", elem_bytes * rows * arch.vocab)
    led.keep("loss.labels", 8 * rows)
    led.keep("loss.weight", elem_bytes)
    return led


def _block(arch: Arch, step: Step, mode: BlockMode, kind: BlockKind) -> Ledger:
    """kind = 2 * stack + first: stack 0 encoder, 1 decoder; first computes the bias."""
    led = Ledger()
    decoder, first = kind.decoder_stack, kind.first_in_stack
    n, rows, h = hidden_elements(arch, step), step.tokens, arch.hidden
    residual = _residual_bytes(step, first=first)
    if mode == "full":
        led.keep("in", residual * n)
        _inputs(led, arch, step, decoder=decoder, first=first, cross=True)
        return led
    if mode == "selective":
        led.keep("in", residual * n)
        _inputs(led, arch, step, decoder=decoder, first=first, cross=False)
    else:
        # norm, attention and dropout: T5LayerSelfAttention, checkpointed as one
        x = norm(led, step, "in", "sa.ln", kind="t5", rows=rows, width=h, in_bytes=residual)
        _attention(led, arch, step, x, "sa", decoder=decoder, first=first)
        dropout(led, step, "sa.o", tag="sa.drop", p=arch.hidden_dropout, elements=n)
    _clamp(led, step, "sa", residual, n)
    ff_in = "mid"
    if decoder:
        if mode == "selective":
            led.keep("mid", residual * n)
            _cross_inputs(led, arch, step, first=first)
        else:
            x = norm(led, step, "mid", "ca.ln", kind="t5", rows=rows, width=h, in_bytes=residual)
            _attention(led, arch, step, x, "ca", decoder=True, first=False, cross=True)
            dropout(led, step, "ca.o", tag="ca.drop", p=arch.hidden_dropout, elements=n)
        _clamp(led, step, "ca", residual, n)
        ff_in = "mid2"
    x = norm(led, step, ff_in, "ff.ln", kind="t5", rows=rows, width=h, in_bytes=residual)
    _feed_forward(led, arch, step, x)
    dropout(led, step, "ff.o", tag="ff.drop", p=arch.hidden_dropout, elements=n)
    return led


def _wide(step: Step) -> bool:
    """``wo`` runs in fp32 among half-precision weights (`Step.fp32_linears`)."""
    return "wo" in step.fp32_linears and step.dtype_bytes < 4


def _residual_bytes(step: Step, *, first: bool) -> int:
    """Bytes per element of a block's residual stream: fp32 after a wide ``wo`` (every
    block but the first of its stack, and the stack's final norm)."""
    return 4 if _wide(step) and not first else step.dtype_bytes


def _clamp(led: Ledger, step: Step, tag: str, residual: int, elements: int) -> None:
    """T5Block clamps an fp16 residual after each sub-layer (``torch.clamp`` with tensor
    bounds keeps its input and both bounds); the fp32 stream after a wide ``wo`` is not."""
    if _wide(step) and residual == 2:
        led.keep(f"{tag}.sum", residual * elements)
        led.keep(f"{tag}.clamp_min", 4)
        led.keep(f"{tag}.clamp_max", 4)


def _inputs(
    led: Ledger, arch: Arch, step: Step, *, decoder: bool, first: bool, cross: bool
) -> None:
    """A checkpointed T5 block (or its attention) keeps the bias handed from block 0 and
    the masks it is called with."""
    bias = arch.heads * step.seq * step.seq * step.dtype_bytes
    if decoder and step.attention == "eager":  # the causal mask, a float tensor
        led.keep(f"{GLOBAL}mask.eager.full", mask_bytes(step, "eager.full"))
    if not decoder:
        _padding_mask(led, step, "encoder")
    if not first:
        led.keep(f"{GLOBAL}{'decoder' if decoder else 'encoder'}.position_bias", bias)
    if decoder and cross:
        _cross_inputs(led, arch, step, first=first)


def _cross_inputs(led: Ledger, arch: Arch, step: Step, *, first: bool) -> None:
    """What a checkpointed cross-attention reads besides its input: the encoder's
    output, its padding mask, and the (zero) bias handed from block 0."""
    led.keep(f"{GLOBAL}encoder_out", step.dtype_bytes * hidden_elements(arch, step))
    _padding_mask(led, step, "cross")
    if not first:
        led.keep(f"{GLOBAL}cross_bias", arch.heads * step.seq * step.seq * step.dtype_bytes)


def _padding_mask(led: Ledger, step: Step, which: str) -> None:
    """A padded batch's encoder mask, as the encoder (``which="encoder"``) or the
    cross-attention (``"cross"``, a mask of its own) gets it: boolean for sdpa, a
    float per sample for eager (T5 has no flash attention)."""
    if step.padded:
        kind = "eager.full" if step.attention == "eager" else "bool.full"
        led.keep(f"{GLOBAL}mask.t5.{which}", mask_bytes(step, kind))


def _attention(
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
    """Attention with T5's relative position bias (sdpa: a float mask; eager: an added bias).

    sdpa's mask is the bias itself (the encoder), ``torch.where`` of a mask and
    the bias (the causal decoder; the padded encoder and cross-attention, per
    sample) or the zero bias block 0 makes (unpadded cross-attention).
    ``torch.where`` keeps its condition when the bias is trained.
    """
    elem_bytes, rows, h = step.dtype_bytes, step.tokens, arch.hidden
    inner = arch.heads * arch.head_dim
    module = "EncDecAttention" if cross else "SelfAttention"
    linear(led, step, x, h, f"{module}.q")
    kv_source = f"{GLOBAL}encoder_out" if cross else x
    linear(led, step, kv_source, h, f"{module}.k")
    linear(led, step, kv_source, h, f"{module}.v")
    if first and not cross and step.trainable_weights:  # the trained bias embedding's indices
        led.keep(f"{tag}.buckets", 8 * step.seq * step.seq)
    if step.attention == "eager":
        _eager(led, arch, step, tag)
        linear(led, step, f"{tag}.out", inner, f"{module}.o")
        return
    for name in ("q", "k", "v", "out"):
        led.keep(f"{tag}.{name}", elem_bytes * rows * inner)
    led.keep(f"{tag}.lse", 4 * step.batch * arch.heads * step.seq)
    bias = elem_bytes * arch.heads * step.seq * step.seq
    padded = step.padded and (cross or not decoder)  # the decoder's own tokens: no mask
    if padded:  # the zero cross bias needs no gradient: its condition is not kept
        led.keep(f"{tag}.bias", step.batch * bias)
        if not cross and step.trainable_weights:
            _padding_mask(led, step, "encoder")
    elif cross:
        led.keep(f"{GLOBAL}cross_bias", bias)  # zeros made in block 0, kept by all
    else:
        if decoder and step.trainable_weights:  # causal: torch.where's condition
            led.keep(f"{tag}.causal", step.seq * step.seq)
        led.keep(f"{tag}.bias", bias)  # a contiguous copy of the bias, per layer
    linear(led, step, f"{tag}.out", inner, f"{module}.o")


def _eager(led: Ledger, arch: Arch, step: Step, tag: str) -> None:
    """Eager T5: copies of q, k, v for matmul; softmax and dropout in the dtype."""
    elem_bytes, rows = step.dtype_bytes, step.tokens
    inner = arch.heads * arch.head_dim
    scores = step.batch * arch.heads * step.seq * step.seq
    for name in ("q_copy", "k_copy", "v_copy"):
        led.keep(f"{tag}.{name}", elem_bytes * rows * inner)
    led.keep(f"{tag}.softmax", elem_bytes * scores)
    probs = dropout(
        led, step, f"{tag}.softmax", tag=f"{tag}.probs_drop", p=arch.attn_dropout, elements=scores
    )
    led.keep(probs, elem_bytes * scores)


def _feed_forward(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    elem_bytes, elements = step.dtype_bytes, step.tokens * arch.intermediate
    if arch.glu:
        linear(led, step, x, arch.hidden, "DenseReluDense.wi_0")
        act = activation(led, step, "ff.gate", tag="ff.act", kind=arch.act, elements=elements)
        led.keep(act, elem_bytes * elements)
        led.keep("ff.up", elem_bytes * elements)
    else:
        linear(led, step, x, arch.hidden, "DenseReluDense.wi")
        activation(led, step, "ff.wi", tag="ff.act", kind=arch.act, elements=elements)
    hidden = dropout(
        led, step, "ff.act.out", tag="ff.inner_drop", p=arch.hidden_dropout, elements=elements
    )
    if _wide(step):  # `hidden_states.to(self.wo.weight.dtype)`: an fp32 copy for the matmul
        linear(led, step, "ff.wide", arch.intermediate, "DenseReluDense.wo", in_bytes=4)
        return
    linear(led, step, hidden, arch.intermediate, "DenseReluDense.wo")


def _block_flops(arch: Arch, step: Step, kind: BlockKind) -> BlockFlops:
    """q, k, v, o per attention (the decoder adds cross-attention), then the MLP."""
    t, h, q = step.tokens, arch.hidden, arch.heads * arch.head_dim
    no_dropout = arch.hidden_dropout <= 0  # a dropout after the projection keeps a mask
    count = 2 if kind.decoder_stack else 1
    return BlockFlops(
        count * 2 * t * 4 * h * q,
        count * core_flops(arch, step),
        dense_mlp_flops(arch, step),
        attention_tail=count * 2 * t * q * h if no_dropout else 0,
        block_tail=2 * t * arch.intermediate * h if no_dropout else 0,
    )


FAMILY = Family(
    name="t5",
    model_types=("t5", "mt5"),  # mT5's modules are T5's, copied
    read_arch=_read_arch,
    param_layout=_param_layout,
    stacks=_stacks,
    block_kind=_block_kind,
    embed_ledger=_embed,
    head_ledger=_head,
    block_ledger=_block,
    block_flops=_block_flops,
    head_flops=lm_head_flops,
    loss_in_fp32=False,
    no_flash=frozenset({"t5", "mt5"}),
    keep_in_fp32=frozenset({"wo"}),
    trace=lambda arch: T5,
    replayed_exactly=lambda arch: True,
)
