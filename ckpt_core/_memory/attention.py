"""Attention in the closed form: masks, RoPE tables and the kernel, shared by families.

What transformers 5.24 runs on a GPU is what is written down: fused attention
(sdpa without a mask, flash) keeps q, k, v, output and log-sum-exp; sdpa with a
materialized mask (a padded batch, sliding windows shorter than the sequence,
Falcon) keeps a float copy of the mask per layer and repeats GQA heads; eager
keeps the fp32 softmax, its cast to the dtype, and full-head copies of q, k, v.

Pure arithmetic.
"""

from __future__ import annotations

from typing import Final

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.ledger import GLOBAL, Ledger, Step, dropout
from ckpt_core._planning.gpus import flash_sdpa


def mask_kind(arch: Arch, step: Step, sliding: bool, *, sdpa_always: bool = False) -> str | None:
    """The attention mask transformers materializes for this layer, if any.

    Eager always gets a float mask in the dtype.  sdpa gets a boolean mask
    when the batch is padded, when a sliding window is shorter than the
    sequence, or always with ``sdpa_always`` (Falcon); otherwise None and the
    kernel's causal flag.  Flash: never (padding unpads the tokens instead).
    Bidirectional models ask only for a padded batch: without padding they get
    no mask at all.
    """
    window = sliding and arch.sliding_window is not None and step.seq >= arch.sliding_window
    suffix = "sliding" if sliding else "full"
    if step.attention == "eager":  # a mask per layer type, whatever the length
        return f"eager.{suffix}"
    if step.attention == "fused" and (window or sdpa_always or step.padded):
        return f"bool.{suffix}"
    return None


def mask_bytes(step: Step, mask: str) -> int:
    """Eager's float mask exists per sample; sdpa's boolean one is a batch-expanded view,
    unless the padding makes it per sample."""
    if mask.startswith("eager"):
        return step.dtype_bytes * step.batch * step.seq * step.seq
    return (step.batch if step.padded else 1) * step.seq * step.seq


def eager_softmax_bytes(arch: Arch, elem_bytes: int) -> int:
    """Bytes per score of eager attention's softmax: an fp32 copy of the scores
    (Llama-style), or the dtype's (`Arch.softmax_in_dtype`)."""
    return elem_bytes if arch.softmax_in_dtype else 4


def rope_tables(led: Ledger, arch: Arch, step: Step, sliding: bool) -> None:
    """The model's cos and sin tables (shared by every layer), kept by RoPE's products or
    by a checkpoint, whose recompute reads them."""
    width = arch.head_dim // 2 if arch.rope_halves else arch.rope_dim
    size = (4 if arch.rope_fp32 else step.dtype_bytes) * step.seq * width
    rope = "local" if sliding and arch.rope_per_kind else "global"
    if arch.rope_complex:  # one complex64 table: a pair of fp32 per rotated pair
        led.keep(f"{GLOBAL}freqs.{rope}", 4 * step.seq * width)
        return
    led.keep(f"{GLOBAL}cos.{rope}", size)
    led.keep(f"{GLOBAL}sin.{rope}", size)


def rope_products(led: Ledger, arch: Arch, step: Step, sliding: bool) -> None:
    """What RoPE's products keep: the tables, or (GLM-4, ERNIE 4.5 in fp32) the layer's
    own interleaved copies of them (``cos[..., : d // 2].repeat_interleave(2, dim=-1)``,
    and sin's)."""
    if not arch.rope_interleaved:
        rope_tables(led, arch, step, sliding)
        return
    size = (4 if arch.rope_fp32 else step.dtype_bytes) * step.seq * arch.rope_dim
    led.keep("rope.cos", size)
    led.keep("rope.sin", size)


def attention_core(
    led: Ledger,
    arch: Arch,
    step: Step,
    qkv: tuple[str, str, str, int],
    *,
    mask: str | None,
) -> str:
    """The attention kernel on q, k, v storages; returns the output storage (o_proj's input).

    ``qkv`` = (q name, k name, v storage name, v storage bytes); q and k are
    storages of ``heads`` and ``kv_heads`` width, the output ``heads`` of v's.  ``mask``: the mask
    transformers passes (`mask_kind`).  Eager upcasts the scores to fp32
    (Llama-style) unless the model's softmax runs in the dtype
    (`Arch.softmax_in_dtype`).
    """
    if step.attention == "flash" and step.padded:
        return _unpadded_flash(led, arch, step)
    if math_kernel(arch, step.attention, step.gqa, mask is not None):
        return _math_attention(led, arch, step)
    q_name, k_name, v_name, v_bytes = qkv
    elem_bytes, tokens, batch, seq = step.dtype_bytes, step.tokens, step.batch, step.seq
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    out = arch.heads * arch.value_dim  # the output's width, and v's repeated per head
    scores = batch * arch.heads * seq * seq
    upcast = step.attention == "eager" and arch.upcast_attention
    if upcast:  # baddbmm keeps fp32 copies of q and k, not them
        led.keep("attn.q_fp32", 4 * tokens * q)
        led.keep("attn.k_fp32", 4 * tokens * q)
    else:
        led.keep(q_name, elem_bytes * tokens * q)
    if step.attention == "eager":
        if 1 < arch.kv_heads < arch.heads or batch > 1:
            # repeat_kv copies, or matmul's reshape of (batch, heads) copies the views
            if not upcast:
                led.keep("attn.k_full", elem_bytes * tokens * q)
            led.keep("attn.v_full", elem_bytes * tokens * out)
        else:  # batch 1: matmul reshapes the views (one kv head: a stride-0 expand) as they are
            led.keep(k_name, elem_bytes * tokens * kv)
            led.keep(v_name, v_bytes)
        if arch.attn_sinks:
            _sink_softmax(led, arch, step)
            return "attn.o_in"
        if arch.attn_softcap:
            led.keep("attn.tanh", elem_bytes * scores)
        softmax_bytes = eager_softmax_bytes(arch, elem_bytes)
        led.keep("attn.softmax", softmax_bytes * scores)
        probs = "attn.softmax" if softmax_bytes == elem_bytes else "attn.probs"
        probs = dropout(led, step, probs, tag="attn.dropout", p=arch.attn_dropout, elements=scores)
        led.keep(probs, elem_bytes * scores)
        # The output's transpose(1, 2).contiguous() copy is o_proj's input, kept by o_proj
        # only when it is trained (an adapter keeps its own fp32 copy).
        return "attn.o_in"
    if (mask is not None or step.gqa == "repeated") and 1 < arch.kv_heads < arch.heads:
        # a mask turns off sdpa's native GQA: repeat_kv copies (one kv head: a stride-0 view)
        led.keep("attn.k_rep", elem_bytes * tokens * q)
        led.keep("attn.v_rep", elem_bytes * tokens * out)
    else:
        led.keep(k_name, elem_bytes * tokens * kv)
        led.keep(v_name, v_bytes)
    if mask is not None:  # the kernel keeps a float copy of the boolean mask, per layer
        led.keep("attn.bias", elem_bytes * batch * seq * seq)
    led.keep("attn.lse", 4 * batch * arch.heads * seq)
    if step.attention == "flash" and (arch.rope_concat or arch.kv_lora_rank):
        # RoPE's cat (MLA's too) leaves q contiguous per head, and flash's output takes
        # q's strides (MLA's v may be padded to q's head dim, the output cropped to v's):
        # the caller's reshape copies it into o_proj's input (kept by o_proj if trained).
        led.keep("attn.kernel_out", elem_bytes * tokens * q)
    else:  # fused kernels write (b, s, h, d): o_proj reads the output itself
        led.keep("attn.o_in", elem_bytes * tokens * out)
    return "attn.o_in"


HEAD_DIM_GQA: Final = 256  # transformers' use_gqa_in_sdpa: larger heads are repeated


def gqa_kind(arch: Arch, kernel: str, backend: str, query_bytes: int, gpu: str | None) -> str:
    """How sdpa (``kernel`` "fused") runs a layer's grouped kv heads without a mask
    (`Step.gqa`): transformers' sdpa_attention_forward then passes them as they are with
    ``enable_gqa`` (``use_gqa_in_sdpa``: heads up to 256 wide), which among the fused
    kernels only flash takes, and only in fp16 / bf16 from compute capability 8.0: else
    torch's math backend runs ("math"; ``query_bytes``: q is fp32 in a fp32 step and
    after PEFT's kbit preparation, unless autocast casts it).  Pinned to the
    memory-efficient kernel (``backend``), K and V are repeated to every head for it
    ("repeated").  With a mask they are always repeated (`attention_core`).  Falcon's
    grouped heads are copied to every head by the model."""
    grouped = kernel == "fused" and arch.kv_heads < arch.heads
    if not grouped or arch.falcon_grouped or arch.sdpa_math:
        return "native"
    if backend == "efficient":
        return "repeated"
    no_flash = query_bytes == 4 or not flash_sdpa(gpu)
    return "math" if no_flash and max(arch.head_dim, arch.value_dim) <= HEAD_DIM_GQA else "native"


def math_kernel(arch: Arch, attention: str, gqa: str, masked: bool) -> bool:
    """Whether a layer's sdpa (``attention``: the kernel kind) runs torch's math backend:
    Falcon-7B's one key head (`Arch.sdpa_math`), or grouped heads without a mask
    (``masked`` False) that no fused kernel takes (`gqa_kind`)."""
    return attention == "fused" and (arch.sdpa_math or (gqa == "math" and not masked))


def any_math_kernel(arch: Arch, step: Step) -> bool:
    """Whether some layer's sdpa runs torch's math backend, by the mask its kind of layer
    (full attention, sliding window) gets."""
    kinds = set(arch.sliding_layers) or {False}
    return any(
        math_kernel(arch, step.attention, step.gqa, mask_kind(arch, step, sliding) is not None)
        for sliding in kinds
    )


def _math_attention(led: Ledger, arch: Arch, step: Step) -> str:
    """sdpa's math backend (``_scaled_dot_product_attention_math``): q, k and v are upcast
    to fp32 (``allow_fp16_bf16_reduction_math_sdp`` is off by default); its matmuls keep
    the scaled q, the scaled k^T and v, and the fp32 softmax (the mask is added in place).
    k and v are repeated to every head: with ``enable_gqa`` by ``repeat_interleave`` (a
    copy), else by ``matmul``'s expand, a copy unless the batch is 1 (a stride-0 view).
    The output is cast back to the dtype: o_proj's input, kept by o_proj only when it is
    trained."""
    tokens, q = step.tokens, arch.heads * arch.head_dim
    scores = step.batch * arch.heads * step.seq * step.seq
    expanded = arch.sdpa_math and step.batch == 1
    kv_heads = arch.kv_heads if expanded else arch.heads
    led.keep("attn.q_fp32", 4 * tokens * q)
    led.keep("attn.k_fp32", 4 * tokens * kv_heads * arch.head_dim)
    led.keep("attn.v_fp32", 4 * tokens * kv_heads * arch.value_dim)
    led.keep("attn.softmax", 4 * scores)
    probs = dropout(
        led, step, "attn.softmax", tag="attn.dropout", p=arch.attn_dropout, elements=scores
    )
    if probs != "attn.softmax":
        led.keep(probs, 4 * scores)
    return "attn.o_in"


def _sink_softmax(led: Ledger, arch: Arch, step: Step) -> None:
    """gpt-oss's eager softmax: the scores with a sink column, minus their max (whose
    indices are kept), softmaxed in the dtype; the weights are a slice of it."""
    rows = step.batch * arch.heads * step.seq
    led.keep("attn.max_index", 8 * rows)
    led.keep("attn.softmax", step.dtype_bytes * rows * (step.seq + 1))
    probs = dropout(
        led, step, "attn.softmax", tag="attn.dropout", p=arch.attn_dropout, elements=rows * step.seq
    )
    if probs != "attn.softmax":
        led.keep(probs, step.dtype_bytes * rows * step.seq)


def _unpadded_flash(led: Ledger, arch: Arch, step: Step) -> str:
    """Flash with a padding mask (modeling_flash_attention_utils ``_upad_input``): q, k
    and v are gathered into copies of the real tokens, which the varlen kernel keeps
    with its output and log-sum-exp; the gathers keep their indices (int64, per layer);
    the output is scattered back into a new padded tensor, o_proj's input, kept by it
    only when o_proj is trained.  Real tokens are counted as the whole batch (the
    estimate does not know the padding's share): an upper bound."""
    elem_bytes, tokens = step.dtype_bytes, step.tokens
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    for name, width in (("q", q), ("k", kv), ("v", kv), ("out", q)):
        led.keep(f"attn.unpadded_{name}", elem_bytes * tokens * width)
    led.keep("attn.lse", 4 * step.batch * arch.heads * step.seq)
    led.keep("attn.unpad_indices", 8 * tokens)
    return "attn.o_in"
