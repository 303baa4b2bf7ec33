"""BERT (masked LM): post-LayerNorm blocks, bidirectional, learned positions and types.

Everything the memory model knows about BERT, in one place.  Without padding
transformers passes no mask (with it, a mask per sample); the loss takes the
logits in the dtype.
Pure arithmetic.
"""

from __future__ import annotations

from typing import Any

from ckpt_core._memory.arch import Arch, BlockKind, read_activation, read_int
from ckpt_core._memory.attention import attention_core, mask_kind
from ckpt_core._memory.bert_trace import BERT
from ckpt_core._memory.costs import (
    BlockFlops,
    attention_block_flops,
    dense_mlp_flops,
    lm_head_flops,
)
from ckpt_core._memory.families.common import (
    hidden_elements,
    keep_mask,
    two_matrix_mlp,
)
from ckpt_core._memory.family import Family, single_stack, uniform_blocks
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


def _read_arch(config: Any, model_type: str) -> Arch:
    hidden = read_int(config, "hidden_size")
    heads = read_int(config, "num_attention_heads")
    return Arch(
        model_type=model_type,
        family="bert",
        softmax_in_dtype=True,
        hidden=hidden,
        layers=read_int(config, "num_hidden_layers"),
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        intermediate=read_int(config, "intermediate_size"),
        vocab=read_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", True)),
        act=read_activation(config, "hidden_act"),
        glu=False,
        norm="layer",
        attn_dropout=float(config.attention_probs_dropout_prob or 0.0),
        hidden_dropout=float(config.hidden_dropout_prob or 0.0),
        embed_dropout=float(config.hidden_dropout_prob or 0.0),
        positions=read_int(config, "max_position_embeddings"),
        type_vocab=read_int(config, "type_vocab_size", default=0),
        bias=True,
        head_bias=True,  # the decoder's, tied to `cls.predictions.bias`
    )


def _param_layout(arch: Arch) -> ParamLayout:
    h, inter, n = arch.hidden, arch.intermediate, arch.layers
    linears = (
        Linear("attention.self.query", h, h, n, bias=True),
        Linear("attention.self.key", h, h, n, bias=True),
        Linear("attention.self.value", h, h, n, bias=True),
        Linear("attention.output.dense", h, h, n, bias=True),
        Linear("intermediate.dense", h, inter, n, bias=True),
        Linear("output.dense", inter, h, n, bias=True),
        # The MLM head's dense: PEFT's all-linear (and a "dense" target) adapts it, and
        # bitsandbytes quantizes it, as the blocks' linears.
        Linear("cls.predictions.transform.dense", h, h, 1, bias=True),
    )
    embeddings = (arch.positions + arch.type_vocab) * h + 2 * h  # tables + LayerNorm
    blocks = n * 4 * h  # two LayerNorms per block
    head = 2 * h + arch.vocab  # the transform's LayerNorm, the decoder's bias
    return ParamLayout(linears, 0, embedding_parameters(arch), embeddings + blocks + head)


def _embed(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)
        led.keep("token_type_ids", 8 * step.seq)  # gathered from the buffer, batch-expanded
    x = norm(led, step, "embeddings", "embed.ln", kind="layer", rows=step.tokens, width=arch.hidden)
    dropout(
        led, step, x, tag="embed.drop", p=arch.embed_dropout, elements=hidden_elements(arch, step)
    )
    return led


def _block(arch: Arch, step: Step, mode: BlockMode, kind: BlockKind) -> Ledger:
    """Post-LN: attention (+ output dense, dropout, LayerNorm), then the MLP likewise."""
    led = Ledger()
    elem_bytes, n, rows, h = step.dtype_bytes, hidden_elements(arch, step), step.tokens, arch.hidden
    if mode != "off":  # a checkpointed block or attention keeps its input and the mask
        led.keep("in", elem_bytes * n)
        keep_mask(led, step, _mask(arch, step))
    if mode == "full":
        return led
    if mode == "off":
        for name in ("query", "key", "value"):
            linear(led, step, "in", h, f"attention.self.{name}")
        qkv = ("attn.q", "attn.k", "attn.v", elem_bytes * n)
        out = attention_core(led, arch, step, qkv, mask=_mask(arch, step))
        linear(led, step, out, h, "attention.output.dense")
        dropout(led, step, "attn.dense", tag="attn.drop", p=arch.hidden_dropout, elements=n)
        norm(led, step, "attn.sum", "attn.ln", kind="layer", rows=rows, width=h)
    two_matrix_mlp(led, arch, step, "attn.ln.out", ("intermediate.dense", "output.dense"))
    dropout(led, step, "mlp.out", tag="mlp.drop", p=arch.hidden_dropout, elements=n)
    norm(led, step, "mlp.sum", "out.ln", kind="layer", rows=rows, width=h)
    return led


def _head(arch: Arch, step: Step) -> Ledger:
    """Transform (dense, GELU, LayerNorm), decoder, cross-entropy in the dtype."""
    led = Ledger()
    elem_bytes, rows, h = step.dtype_bytes, step.tokens, arch.hidden
    linear(led, step, "in", h, "cls.predictions.transform.dense")
    act = activation(led, step, "head.dense", tag="head.act", kind=arch.act, elements=rows * h)
    out = norm(led, step, act, "head.ln", kind="layer", rows=rows, width=h)
    linear(led, step, out, h, "cls.predictions.decoder")
    led.keep(
        "loss.log_softmax", elem_bytes * rows * arch.vocab
    )  # CrossEntropyLoss on the dtype logits
    led.keep("loss.weight", 4)
    return led


def _mask(arch: Arch, step: Step) -> str | None:
    """Bidirectional attention: a mask only for a padded batch."""
    return mask_kind(arch, step, sliding=False) if step.padded else None


def _block_flops(arch: Arch, step: Step, kind: BlockKind) -> BlockFlops:
    """Post-LayerNorms keep both projections' outputs."""
    return attention_block_flops(
        arch,
        step,
        mlp=dense_mlp_flops(arch, step),
        attention_kept_after=True,
        mlp_kept_after=True,
    )


def _head_flops(arch: Arch, step: Step) -> int:
    return lm_head_flops(arch, step, transform=arch.hidden * arch.hidden)


FAMILY = Family(
    name="bert",
    model_types=("bert",),
    read_arch=_read_arch,
    param_layout=_param_layout,
    stacks=single_stack,
    block_kind=uniform_blocks,
    embed_ledger=_embed,
    head_ledger=_head,
    block_ledger=_block,
    block_flops=_block_flops,
    head_flops=_head_flops,
    loss_in_fp32=False,
    trace=lambda arch: BERT,
    replayed_exactly=lambda arch: True,
)
