"""The architecture facts the memory model needs, read once from an HF config.

An `Arch` is plain numbers and flags (sizes, GQA, MLP kind, norms, MoE routing,
dropout), so that the ledgers and parameter layouts of `ckpt_core._memory.families`
are pure arithmetic and never build a model.  Each family reads its own configs
(`Family.read_arch`) with the readers below; a `BlockKind` names what tells one
model's blocks apart in what they keep.

Pure Python: reads attributes of the config object it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Final

from ckpt_core._errors import ModelConfigError

# Activation functions by what their backward keeps (see `ledger.activation`).
_ACTIVATIONS: Final[dict[str, str]] = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_python_tanh": "gelu",
    "gelu_fast": "gelu",
    "relu": "relu",
    "gelu_new": "gelu_new",
}


@dataclass(frozen=True, slots=True)
class Vision:
    """A vision tower's sizes (weights only: text-only training never runs it).

    ``kind``: ``siglip`` (Gemma 3: learned positions, biased linears, LayerNorms) or
    ``pixtral`` (Mistral 3: rotary positions, a gated MLP, RMS norms, no biases).
    """

    kind: str
    hidden: int
    layers: int
    intermediate: int
    patches: int  # position-embedding rows (SigLIP)
    patch_pixels: int  # channels x patch x patch
    # The projector's parameter tensors in module order: (elements, a linear's rows or 0).
    projector: tuple[tuple[int, int], ...]
    projector_linears: tuple[tuple[str, int, int], ...] = ()  # (name, fan in, fan out)


@dataclass(frozen=True, slots=True)
class Arch:
    """One model's architecture facts, in the names the memory model uses."""

    model_type: str
    family: str
    hidden: int
    layers: int  # blocks of the (decoder) stack
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    act: str  # silu | gelu | gelu_new | relu
    glu: bool
    encoder_layers: int = 0  # T5's encoder stack
    fused_qkv: bool = False  # one projection makes q, k and v (Phi-3)
    fused_gate_up: bool = False
    qkv_bias: bool = False
    o_bias: bool = False  # o_proj's (some models bias q / k / v only)
    o_name: str = "o_proj"  # the attention's output projection (Phi's ``dense``)
    norm: str = "rms"  # rms | rms_gemma | rms_olmo | layer | t5 | cohere
    qk_norm: str = ""  # "" | head | full
    # DeepSeek-V3's multi-head latent attention (MLA) when ``kv_lora_rank``: k and v are
    # projected up from a compressed latent, q too when ``q_lora_rank``; ``head_dim`` is
    # q's and k's (the unrotated part + ``rotary_dim``), ``v_head_dim`` v's.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    v_head_dim: int = 0
    # OLMoE's ``clip_qkv``: q, k and v clamped in place, each clamp keeping a copy.
    clip_qkv: bool = False
    # Hunyuan normalizes the rotated q and k (the same bytes kept, in another order).
    qk_norm_after_rope: bool = False
    sandwich: str = ""  # "" | gemma (4 norms per block) | olmo2 (post-norms only)
    rope_fp32: bool = False  # cos / sin kept in fp32 (OLMo-2 and OLMo-3 apply RoPE in fp32)
    # Sliding and full layers read rotary tables of their own (Gemma 3, OLMo-3).
    rope_per_kind: bool = False
    # apply_rotary_pos_emb rotates a leading slice of each head and concatenates the rest
    # back (Phi-3, even when the slice is the whole head; GLM-4; gpt-oss cats its two
    # rotated halves): one more copy of q and k.
    rope_concat: bool = False
    rotary_dim: int = 0  # the slice RoPE rotates (``partial_rotary_factor``); 0: the head
    # GLM-4 interleaves half of cos / sin into copies in every layer, which its products keep.
    rope_interleaved: bool = False
    # DeepSeek-V2 rotates by a complex multiply with one complex64 table (``freqs_cis``).
    rope_complex: bool = False
    # gpt-oss rotates the two halves of each head (``chunk``) by half-width cos / sin tables.
    rope_halves: bool = False
    # gpt-oss: a learned sink logit per head joins eager attention's scores (one more
    # column), whose max is subtracted before a softmax in the dtype.
    attn_sinks: bool = False
    attn_softcap: bool = False
    # Eager attention's softmax runs in the dtype (GPT-2, BERT, Falcon, T5, gpt-oss), not
    # on an fp32 copy of the scores as Llama-style models' does.
    softmax_in_dtype: bool = False
    # GPT-2's reorder_and_upcast_attn: eager's scores are a baddbmm of fp32 copies of q and
    # k, which its backward keeps; the softmax runs in fp32.
    upcast_attention: bool = False
    # Falcon's multi-query attention hands sdpa one key head without ``enable_gqa``: no
    # fused kernel accepts that, so CUDA runs the math backend (fp32 scores, kept).
    sdpa_math: bool = False
    final_softcap: bool = False
    # Layers that apply no RoPE (SmolLM3's every fourth, EXAONE 4's global ones).
    nope_layers: tuple[bool, ...] = ()
    # Ministral 3 multiplies the rotated q by a per-position scale (Llama 4's attention
    # temperature): a q-sized product, whose backward keeps the scale.
    query_scaling: bool = False
    # Granite: the embeddings, each residual branch and the logits are multiplied by a
    # Python float, each product a new tensor that nothing saves.
    scalar_multipliers: bool = False
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    # The model makes the full and the sliding mask whatever its layers read (Ministral;
    # EXAONE 4 once a layer slides).
    both_masks: bool = False
    moe_layers: tuple[bool, ...] = ()
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    router_in_dtype: bool = False  # routing weights cast to the activation dtype (Qwen3-MoE)
    # The top-k routing weights are divided by their sum (Mixtral always; the Qwen MoEs by
    # ``norm_topk_prob``), which keeps the sum and the weights for backward.
    norm_topk: bool = True
    # A gated MLP of this width runs on every token beside the routed experts (Qwen2-MoE's
    # ``shared_expert``, its output scaled by ``sigmoid(shared_expert_gate(x))``; GLM-4.5's
    # ``shared_experts``, added as it is).
    shared_expert_intermediate: int = 0
    # Qwen2-MoE's: ``mlp.shared_expert``, scaled by its gate (GLM-4.5's ``shared_experts``
    # are not).
    shared_expert_gate: bool = False
    # GLM-4.5's and DeepSeek's router: its weight kept in fp32 whatever the load, its input
    # copied to fp32; the scores it keeps (a sigmoid, DeepSeek-V2's softmax) are fp32.
    fp32_router: bool = False
    # DeepSeek-V2's group_limited_greedy: the scores outside the chosen groups are zeroed
    # by a masked_fill on the gradient's path, which keeps its mask.
    router_group_mask: bool = False
    # gpt-oss: the router and the experts have biases, and its experts gate with a clamped
    # SwiGLU (``(up + 1) * gate * sigmoid(alpha * gate)``).
    clamped_swiglu: bool = False
    attn_dropout: float = 0.0
    hidden_dropout: float = 0.0
    # Seed-OSS and StarCoder2 drop out each branch's output inside self_attn and the MLP
    # (Phi-3 in the layer).
    dropout_in_attention: bool = False
    embed_dropout: float = 0.0
    positions: int = 0  # learned absolute position rows
    type_vocab: int = 0
    relative_buckets: int = 0
    parallel_attn: bool = False  # Falcon: attention and MLP side by side
    falcon_norms: int = 0  # LayerNorms per Falcon block (1 or 2)
    # Falcon's new architecture: k and v broadcast to every head and flattened with q into
    # copies, so its attention runs at ``heads`` everywhere.
    falcon_grouped: bool = False
    bias: bool = False  # every linear has a bias (GPT-2, BERT, Falcon with bias=True)
    mlp_bias: bool = False  # Llama-style ``mlp_bias``
    # Cohere: the attention and the MLP both read the one normed input, summed with the
    # residual (one norm per block).
    parallel_block: bool = False
    logit_scale: bool = False  # the LM head's output is scaled (Cohere: `logits * logit_scale`)
    head_bias: bool = False  # the LM head has a bias (Phi, BERT)
    # The MLP's input (without a gate) and output projections: StarCoder2's c_fc / c_proj.
    mlp_names: tuple[str, str] = ("up_proj", "down_proj")
    vision: Vision | None = None
    # The memory model's caches are keyed by the Arch; ``auto``'s search asks them
    # hundreds of times per answer, so the hash of its ~50 fields is computed once.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        values = tuple(getattr(self, f.name) for f in fields(self) if f.compare)
        object.__setattr__(self, "_hash", hash(values))

    def __hash__(self) -> int:
        return self._hash

    @property
    def is_moe(self) -> bool:
        return any(self.moe_layers)

    @property
    def rope_dim(self) -> int:
        """The elements of each head that RoPE rotates."""
        return self.rotary_dim or self.head_dim

    @property
    def value_dim(self) -> int:
        """Each head's width in v and in the attention's output (MLA's differs from q's)."""
        return self.v_head_dim or self.head_dim


@dataclass(frozen=True, slots=True)
class BlockKind:
    """What tells one model's blocks apart in what they keep (hashable: a cache key).

    ``sliding``: a sliding-window attention layer; ``moe``: the MLP routes to
    experts; ``decoder_stack``: a block of an encoder-decoder's decoder (causal,
    with cross-attention); ``first_in_stack``: the block that computes its
    stack's relative position bias (T5) and hands it to the others.
    """

    sliding: bool = False
    moe: bool = False
    decoder_stack: bool = False
    first_in_stack: bool = False


def read_int(config: Any, *names: str, default: int | None = None) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    if default is None:
        raise ModelConfigError(
            f"the config has none of {', '.join(names)} (a positive integer)",
            field=f"model.config.{names[0]}",
        )
    return default


def read_window(config: Any) -> int | None:
    """``sliding_window``: null or a positive int (some config classes do not check it)."""
    value = getattr(config, "sliding_window", None)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ModelConfigError(
        f"sliding_window must be a positive integer or null, got {value!r}",
        field="model.config.sliding_window",
    )


def read_activation(config: Any, *names: str) -> str:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, str):
            kind = _ACTIVATIONS.get(value)
            if kind is None:
                raise ModelConfigError(
                    f"activation {value!r} is not described by the memory model; "
                    f"known: {', '.join(sorted(_ACTIVATIONS))}",
                    field=f"model.config.{name}",
                )
            return kind
    return "silu"
