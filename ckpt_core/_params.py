"""Exact parameter counts from an `Arch`, without building a model.

`param_layout` splits a model's parameters the way the memory model needs
them: the linear layers inside the transformer blocks (what LoRA targets and
bitsandbytes quantizes), MoE expert tensors (3-D parameters in transformers
5.24: bitsandbytes leaves them unquantized), embeddings / LM head, and the
rest (norms, biases, routers, position tables).  The total equals
``sum(p.numel() for p in model.parameters())`` of the meta-built model (tied
weights once) - a test checks it for every bundled preset.

Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_core._arch import Arch, Vision


@dataclass(frozen=True, slots=True)
class Linear:
    """A group of identical linear layers: ``count`` copies of ``fan_in`` x ``fan_out``.

    ``name`` is the module path inside a block (``"self_attn.q_proj"``); LoRA
    targets match it by suffix, as PEFT's ``target_modules`` do.
    """

    name: str
    fan_in: int
    fan_out: int
    count: int
    bias: bool = False

    @property
    def weights(self) -> int:
        return self.fan_in * self.fan_out * self.count

    @property
    def parameters(self) -> int:
        return (self.fan_in * self.fan_out + (self.fan_out if self.bias else 0)) * self.count


@dataclass(frozen=True, slots=True)
class ParamLayout:
    """Where a model's parameters are; all counts in parameters (not bytes)."""

    linears: tuple[Linear, ...]  # inside the blocks: attention and MLP projections
    experts: int  # MoE expert tensors
    embeddings: int  # input embeddings, plus the LM head when it is not tied
    other: int  # norms, biases of non-linear modules, routers, position tables, vision tower

    @property
    def linear_parameters(self) -> int:
        return sum(linear.parameters for linear in self.linears)

    @property
    def total(self) -> int:
        return self.linear_parameters + self.experts + self.embeddings + self.other


def param_layout(arch: Arch) -> ParamLayout:
    """The parameter layout of the model class transformers builds for ``arch``."""
    family = {"decoder": _decoder, "gpt2": _gpt2, "falcon": _falcon, "bert": _bert, "t5": _t5}
    layout = family[arch.family](arch)
    if arch.vision is None:
        return layout
    return ParamLayout(
        layout.linears, layout.experts, layout.embeddings, layout.other + _vision(arch.vision)
    )


def _head(arch: Arch) -> int:
    """Input embeddings plus an untied LM head."""
    return arch.vocab * arch.hidden * (1 if arch.tied else 2)


def _decoder(arch: Arch) -> ParamLayout:
    h, d, n = arch.hidden, arch.head_dim, arch.layers
    q, kv = arch.heads * d, arch.kv_heads * d
    dense = sum(1 for moe in arch.moe_layers if not moe)
    attention = (
        [Linear("self_attn.qkv_proj", h, q + 2 * kv, n)]
        if arch.fused_qkv
        else [
            Linear("self_attn.q_proj", h, q, n, arch.qkv_bias),
            Linear("self_attn.k_proj", h, kv, n, arch.qkv_bias),
            Linear("self_attn.v_proj", h, kv, n, arch.qkv_bias),
        ]
    )
    o_bias = arch.qkv_bias and arch.model_type != "qwen2"  # Qwen2: q/k/v biases only
    attention.append(Linear("self_attn.o_proj", q, h, n, o_bias))
    mlp_bias = arch.mlp_bias
    inter = arch.intermediate
    mlp = (
        [Linear("mlp.gate_up_proj", h, 2 * inter, dense), Linear("mlp.down_proj", inter, h, dense)]
        if arch.fused_gate_up
        else [
            Linear("mlp.gate_proj", h, inter, dense, mlp_bias),
            Linear("mlp.up_proj", h, inter, dense, mlp_bias),
            Linear("mlp.down_proj", inter, h, dense, mlp_bias),
        ]
    )
    moe = n - dense
    experts = moe * arch.experts * 3 * h * arch.moe_intermediate
    router = moe * arch.experts * h
    norms_per_block = {"gemma": 4, "olmo2": 2}.get(arch.sandwich, 2) * h
    qk_norm = {"head": 2 * d, "full": q + kv}.get(
        "full" if arch.model_type == "olmo2" else arch.qk_norm, 0
    )
    other = n * (norms_per_block + qk_norm) + router + h  # + final norm
    linears = tuple(item for item in (*attention, *mlp) if item.count)
    return ParamLayout(linears, experts, _head(arch), other)


def _gpt2(arch: Arch) -> ParamLayout:
    h, inter, n = arch.hidden, arch.intermediate, arch.layers
    linears = (
        Linear("attn.c_attn", h, 3 * h, n, bias=True),
        Linear("attn.c_proj", h, h, n, bias=True),
        Linear("mlp.c_fc", h, inter, n, bias=True),
        Linear("mlp.c_proj", inter, h, n, bias=True),
    )
    norms = n * 4 * h + 2 * h  # ln_1, ln_2 (weight + bias) per block, ln_f
    return ParamLayout(linears, 0, _head(arch), norms + arch.positions * h)


def _falcon(arch: Arch) -> ParamLayout:
    h, d, n, bias = arch.hidden, arch.head_dim, arch.layers, arch.bias
    qkv = (arch.heads + 2 * arch.kv_heads) * d
    linears = (
        Linear("self_attention.query_key_value", h, qkv, n, bias),
        Linear("self_attention.dense", h, h, n, bias),
        Linear("mlp.dense_h_to_4h", h, arch.intermediate, n, bias),
        Linear("mlp.dense_4h_to_h", arch.intermediate, h, n, bias),
    )
    norms = n * arch.falcon_norms * 2 * h + 2 * h  # LayerNorms with bias, ln_f
    return ParamLayout(linears, 0, _head(arch), norms)


def _bert(arch: Arch) -> ParamLayout:
    h, inter, n = arch.hidden, arch.intermediate, arch.layers
    linears = (
        Linear("attention.self.query", h, h, n, bias=True),
        Linear("attention.self.key", h, h, n, bias=True),
        Linear("attention.self.value", h, h, n, bias=True),
        Linear("attention.output.dense", h, h, n, bias=True),
        Linear("intermediate.dense", h, inter, n, bias=True),
        Linear("output.dense", inter, h, n, bias=True),
    )
    embeddings = (arch.positions + arch.type_vocab) * h + 2 * h  # tables + LayerNorm
    blocks = n * 4 * h  # two LayerNorms per block
    head = h * h + h + 2 * h + arch.vocab  # transform dense + LayerNorm, decoder bias
    return ParamLayout(linears, 0, _head(arch), embeddings + blocks + head)


def _t5(arch: Arch) -> ParamLayout:
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
    norms = (2 * enc + 3 * dec + 2) * h  # RMS norms, no bias; two final norms
    relative = 2 * arch.relative_buckets * arch.heads  # first block of each stack
    return ParamLayout((*attention, *feed), 0, _head(arch), norms + relative)


def _vision(vision: Vision) -> int:
    """A SigLIP vision tower without head, plus the projector into the text model."""
    hv, inter = vision.hidden, vision.intermediate
    block = 4 * (hv * hv + hv) + (hv * inter + inter) + (inter * hv + hv) + 4 * hv
    embeddings = vision.patch_pixels * hv + hv + vision.patches * hv
    return embeddings + vision.layers * block + 2 * hv + vision.projector
