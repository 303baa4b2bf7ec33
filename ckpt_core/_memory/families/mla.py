"""DeepSeek-V3's multi-head latent attention (MLA): its linears, what it keeps, its FLOPs.

k and v are projected up per head from a compressed latent (``kv_a_proj_with_mqa``
then ``kv_b_proj``, with an RMSNorm between), q from a second latent when
``q_lora_rank`` (else by one ``q_proj``); RoPE rotates the last ``rotary_dim`` of
q's and k's heads (k's rotated part is shared by every head).  q and k heads are
``head_dim`` wide, v's and the output's ``v_head_dim``
(`ckpt_core._memory.arch.Arch`).  `ckpt_core._memory.families.decoder` uses these
for models with a ``kv_lora_rank``.  Pure arithmetic.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention import attention_core, mask_kind, rope_products
from ckpt_core._memory.ledger import Ledger, Step, linear, norm
from ckpt_core._memory.param_layout import Linear


def _shapes(arch: Arch) -> list[tuple[str, int, int, bool]]:
    """(name, fan in, fan out, bias) of one layer's attention linears, in module order."""
    h, heads, rope = arch.hidden, arch.heads, arch.rope_dim
    nope, latent, bias = arch.head_dim - rope, arch.kv_lora_rank, arch.qkv_bias
    if arch.q_lora_rank:
        q = [
            ("self_attn.q_a_proj", h, arch.q_lora_rank, bias),
            ("self_attn.q_b_proj", arch.q_lora_rank, heads * arch.head_dim, False),
        ]
    else:
        q = [("self_attn.q_proj", h, heads * arch.head_dim, False)]
    return [
        *q,
        ("self_attn.kv_a_proj_with_mqa", h, latent + rope, bias),
        ("self_attn.kv_b_proj", latent, heads * (nope + arch.value_dim), False),
        ("self_attn.o_proj", heads * arch.value_dim, h, bias),
    ]


def mla_linears(arch: Arch) -> list[Linear]:
    """The attention linears of every layer."""
    return [Linear(name, i, o, arch.layers, bias) for name, i, o, bias in _shapes(arch)]


def mla_norm_parameters(arch: Arch) -> int:
    """One layer's latent norms (q's when it has one, and the kv latent's)."""
    return arch.q_lora_rank + arch.kv_lora_rank


def mla_attention(led: Ledger, arch: Arch, step: Step, x: str, sliding: bool) -> str:
    """DeepseekV3Attention.forward on the normed ``x``; returns o_proj's input.

    The latent norms keep what an RMSNorm keeps (in fp32 the kv latent's input is a
    slice of ``kv_a_proj_with_mqa``'s output, which it keeps whole); the products of
    RoPE keep the tables; q and k are new tensors (a cat, a copy into ``new_empty``);
    v is a slice of ``kv_b_proj``'s output, whose whole storage the kernel keeps, or
    for flash a copy padded to q's head dim (transformers' flash integration).
    """
    elem_bytes, tokens, h = step.dtype_bytes, step.tokens, arch.hidden
    heads, rope, latent = arch.heads, arch.rope_dim, arch.kv_lora_rank
    if arch.q_lora_rank:
        linear(led, step, x, h, "self_attn.q_a_proj")
        q_in = norm(
            led, step, "q_a", "q_a_norm", kind=arch.norm, rows=tokens, width=arch.q_lora_rank
        )
        linear(led, step, q_in, arch.q_lora_rank, "self_attn.q_b_proj")
    else:
        linear(led, step, x, h, "self_attn.q_proj")
    linear(led, step, x, h, "self_attn.kv_a_proj_with_mqa")
    if elem_bytes == 4:  # the norm's input is the latent's slice: its storage is kept whole
        led.keep("kv_a", 4 * tokens * (latent + rope))
    kv_in = norm(led, step, "kv_a", "kv_a_norm", kind=arch.norm, rows=tokens, width=latent)
    linear(led, step, kv_in, latent, "self_attn.kv_b_proj")
    rope_products(led, arch, step, sliding)
    kv_bytes = elem_bytes * tokens * heads * (arch.head_dim - rope + arch.value_dim)
    value = ("kv_b", kv_bytes)
    if step.attention == "flash" and arch.value_dim != arch.head_dim:
        # transformers pads v to q's head dim for the kernel
        value = ("v_padded", elem_bytes * tokens * heads * arch.head_dim)
    mask = mask_kind(arch, step, sliding)
    out = attention_core(led, arch, step, ("q", "k", *value), mask=mask)
    linear(led, step, out, heads * arch.value_dim, "self_attn.o_proj")
    return out


def mla_projection_flops(arch: Arch, step: Step) -> tuple[int, int]:
    """Forward FLOPs of one layer's attention linears, and of o_proj alone."""
    shapes = _shapes(arch)
    total = sum(2 * step.tokens * i * o for _, i, o, _ in shapes)
    _, i, o, _ = shapes[-1]
    return total, 2 * step.tokens * i * o
