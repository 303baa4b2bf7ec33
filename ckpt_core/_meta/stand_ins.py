"""Meta-device stand-ins that make a meta forward keep what a GPU forward keeps.

Used by `ckpt_core._meta.measure` for meta tensors only; real tensors always take
the real path, so concurrent real runs are unaffected:

- ``scaled_dot_product_attention`` on meta would take the math path and keep
  the s x s scores.  Where CUDA takes it too (`_math_kernel`: grouped heads no
  fused kernel accepts), it runs; otherwise the stand-in keeps what the fused
  kernels keep: q, k, v,
  the output and the fp32 log-sum-exp, plus the additive mask when one is
  passed (the memory-efficient kernel keeps its bias; torch first converts a
  boolean mask into a new float mask).  Flash keeps no mask and no bias; its
  output takes q's strides, and a padded batch goes through transformers'
  unpadding (the real tokens gathered for the varlen kernel, the output
  scattered back), every token counted real.
- dropout on CPU / meta keeps a mask in the activation dtype; CUDA's fused
  dropout keeps a 1-byte bool mask: ``torch.native_dropout`` stands in.
- grouped_mm (MoE experts) on meta accepts only bf16: other dtypes (QLoRA's
  fp32 experts) take a stand-in for aten's fallback, which keeps each input only
  for the other's gradient.
- transformers' packed-sequence detection and sdpa's "can the mask be
  skipped" checks read tensor values (``.all()``), impossible on meta: for
  meta inputs they answer what the measurement feeds, one sequence per row,
  unpadded unless it says its batch is padded.

Importing this module loads no torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Iterator
from typing import Any, Final

# Registered once in transformers' AttentionInterface: the fused stand-in for
# models that route attention through the interface and ask for flash.
FLASH_STAND_IN: Final = "ckpt_core_meta_flash"

_PATCH_LOCK: Final = threading.Lock()
# Whether the measurement running in this context feeds a padded batch.
_PADDED: Final = contextvars.ContextVar("ckpt_core_meta_padded", default=False)
# Whether sdpa's math backend is running for a meta call (`math_backend_running`).
_IN_MATH: Final = contextvars.ContextVar("ckpt_core_meta_math", default=False)
_patch_users = 0
_originals: dict[str, Any] = {}


def _meta_shortcuts(masking_utils: Any) -> dict[str, Any]:
    """Replacements for transformers' data-dependent mask checks, by attribute name.

    Each one answers for meta tensors what the measurement feeds - one
    sequence per row, padded or not - and delegates to the original otherwise:

    - ``find_packed_sequence_indices`` ends in ``(...).all()``: meta position
      ids are one sequence per row, so there is no packed-sequence mask.
    - ``_ignore_causal_mask_sdpa`` / ``_ignore_bidirectional_mask_sdpa`` read
      the 2D padding mask (``fast_all`` / ``.all()``, i.e. ``Tensor.item()``)
      to decide whether sdpa can run with ``is_causal`` and no mask.  For a
      padded batch it cannot.  Otherwise a meta padding mask masks nothing (an
      unpadded measurement passes none, so it is one the model made itself:
      BART's decoder and its copies fill one with ones when none is given), and
      the original is asked about ``None``, which it answers as for an all-ones
      mask on real tensors when queries and keys have the same length (a
      training forward, no cache).
    """
    packed = masking_utils.find_packed_sequence_indices
    causal = masking_utils._ignore_causal_mask_sdpa
    bidirectional = masking_utils._ignore_bidirectional_mask_sdpa

    def find_packed_sequence_indices(position_ids: Any) -> Any:
        return None if position_ids.is_meta else packed(position_ids)

    return {
        "find_packed_sequence_indices": find_packed_sequence_indices,
        "_ignore_causal_mask_sdpa": functools.partial(_can_skip_mask, causal),
        "_ignore_bidirectional_mask_sdpa": functools.partial(_can_skip_mask, bidirectional),
    }


def _can_skip_mask(original: Any, padding_mask: Any, *args: Any, **kwargs: Any) -> Any:
    """``original`` (an sdpa mask-skipping check), answered for a meta padding mask as
    `_meta_shortcuts` says: never for a padded batch, else as for no padding mask."""
    if padding_mask is not None and padding_mask.is_meta:
        if _PADDED.get():
            return False
        padding_mask = None
    return original(padding_mask, *args, **kwargs)


@contextlib.contextmanager
def no_data_dependent_mask_checks(*, padded: bool = False) -> Iterator[None]:
    """Answer transformers' data-dependent mask checks for meta inputs (`_meta_shortcuts`);
    ``padded``: the batch the caller feeds in this context is padded.

    On meta there is no data, so ``bool()`` of a meta tensor raises
    (``Tensor.item() cannot be called on meta tensors``).  The replacements
    delegate for real tensors, so concurrent real runs are unaffected; they
    are installed while at least one measurement runs, and the originals are
    put back when the last one ends.
    """
    global _patch_users, _originals  # noqa: PLW0603 - one process-wide patch, reference counted
    from transformers import masking_utils

    with _PATCH_LOCK:
        if _patch_users == 0:
            replacements = _meta_shortcuts(masking_utils)
            _originals = {name: getattr(masking_utils, name) for name in replacements}
            for name, replacement in replacements.items():
                setattr(masking_utils, name, replacement)
        _patch_users += 1
    token = _PADDED.set(padded)
    try:
        yield
    finally:
        _PADDED.reset(token)
        with _PATCH_LOCK:
            _patch_users -= 1
            if _patch_users == 0:
                for name, original in _originals.items():
                    setattr(masking_utils, name, original)
                _originals = {}


def _fused_attention_class(*, flash: bool = False) -> type:
    """An autograd Function that keeps what a fused attention kernel (``flash``'s) keeps."""
    import torch

    class FusedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, query: Any, key: Any, value: Any, bias: Any) -> Any:
            batch, heads, length, _ = query.shape
            # sdpa's fused kernels write (batch, seq, heads, dim) and return a transposed
            # view, so HF's later transpose(1, 2).contiguous() copies nothing; flash's
            # output takes q's strides (Phi-3's cat-ed RoPE: contiguous per head).
            if flash:
                out = torch.empty_like(query)
            else:
                out = query.new_empty(batch, length, heads, value.shape[-1]).transpose(1, 2)
            log_sum_exp = query.new_empty(batch, heads, length, dtype=torch.float32)
            kept = (query, key, value, out, log_sum_exp)
            ctx.save_for_backward(*kept, *(() if bias is None else (bias,)))
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            # The kernel's C++ node holds every saved tensor (the output, the log-sum-exp,
            # the bias) while it makes the gradients; a checkpoint's recompute hands them
            # over to the node alone.
            saved = ctx.saved_tensors
            query, key, value = saved[:3]
            grads = (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value))
            if not ctx.needs_input_grad[3]:
                return (*grads, None)
            # A trained bias (T5's relative position bias): the memory-efficient kernel
            # writes its gradient at the shape it reads the bias, (batch, heads, q, k),
            # rows padded to 16 elements; autograd sums it to the bias's own shape.
            batch, heads, length, _ = query.shape
            keys = key.shape[2]
            bias_grad = query.new_empty(batch, heads, length, -(-keys // 16) * 16)
            return (*grads, bias_grad[..., :keys])

    return FusedAttention


def _sdpa_stand_in(flash: bool, flash_gqa: bool = True) -> Any:
    """A replacement for ``F.scaled_dot_product_attention`` on meta tensors."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fused = _fused_attention_class()
    original = torch.nn.functional.scaled_dot_product_attention

    def sdpa(
        query: Any, key: Any, value: Any, attn_mask: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        if not flash and _math_kernel(query, key, kwargs.get("enable_gqa", False), flash_gqa):
            token = _IN_MATH.set(True)
            try:
                with sdpa_kernel(SDPBackend.MATH):
                    return original(query, key, value, attn_mask, *args, **kwargs)
            finally:
                _IN_MATH.reset(token)
        # dropout_p, is_causal, scale, enable_gqa change nothing that is kept:
        # fused kernels keep only RNG seeds for dropout.
        bias = None
        if attn_mask is not None and not flash:
            bias = attn_mask
            if attn_mask.dtype == torch.bool:  # torch turns it into a new additive mask
                bias = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device)
        return fused.apply(query, key, value, bias)

    return sdpa


def _math_kernel(query: Any, key: Any, enable_gqa: bool, flash_gqa: bool) -> bool:
    """Whether CUDA runs sdpa's math backend: the fused kernels need as many key as query
    heads unless ``enable_gqa`` (``sdp_utils.cpp``, ``check_batch_size_and_num_heads_dense``),
    which only flash takes, in fp16 / bf16, on a GPU that has it (``flash_gqa``).
    Falcon's multi-query attention passes one key head without it; transformers passes
    grouped heads with it, fp32 ones in a step that is fp32 or after PEFT's kbit
    preparation."""
    import torch

    if query.shape[-3] == key.shape[-3]:
        return False
    return not enable_gqa or not flash_gqa or query.dtype == torch.float32


def math_backend_running() -> bool:
    """Whether a meta sdpa call is running torch's math backend.  Under a dispatch mode
    that backend adds the mask out of place (``isTensorSubclassLike`` holds for every
    tensor then); on CUDA it adds it in place, which a recording of the op order takes
    from this."""
    return _IN_MATH.get()


@contextlib.contextmanager
def meta_kernels(*, flash: bool, flash_gqa: bool = True) -> Iterator[None]:
    """Within this thread: fused attention and CUDA-style dropout for meta tensors
    (``flash_gqa``: the GPU has sdpa's flash kernel, the one that takes grouped heads)."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch.overrides import TorchFunctionMode

    sdpa = _sdpa_stand_in(flash, flash_gqa)
    grouped_mm = {getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None)} - {None}

    class MetaKernels(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention and args[0].is_meta:
                return sdpa(*args, **kwargs)
            if func is F.dropout and args[0].is_meta:
                return _dropout(*args, **kwargs)
            if func in grouped_mm and _needs_fallback(args[0]):
                return _grouped_mm_fallback(*args, **kwargs)
            return func(*args, **kwargs)

    with MetaKernels():
        yield


def _needs_fallback(tensor: Any) -> bool:
    """grouped_mm on meta accepts only bf16, like the CUDA kernel it models."""
    import torch

    return tensor.is_meta and tensor.dtype != torch.bfloat16


def _grouped_mm_fallback(mat_a: Any, mat_b: Any, *_: Any, offs: Any = None, **__: Any) -> Any:
    """aten's grouped matmul for weights not in bf16 (CUDA runs them through aten's own
    fallback; meta refuses them), as its generated autograd code keeps: the offsets, and
    each input only for the other's gradient, so a frozen stack of experts (QLoRA's fp32
    ones) keeps no input.  transformers' fallback operator would keep both."""
    return _grouped_mm_function().apply(mat_a, mat_b, offs)


@functools.cache
def _grouped_mm_function() -> Any:
    import torch

    class GroupedMM(torch.autograd.Function):
        """The output, and in backward a gradient for each input that requires one."""

        @staticmethod
        def forward(ctx: Any, mat_a: Any, mat_b: Any, offs: Any) -> Any:
            keep_a, keep_b = mat_b.requires_grad, mat_a.requires_grad
            ctx.save_for_backward(mat_a if keep_a else None, mat_b if keep_b else None, offs)
            ctx.shapes, ctx.dtypes = (mat_a.shape, mat_b.shape), (mat_a.dtype, mat_b.dtype)
            return mat_a.new_empty(mat_a.shape[0], mat_b.shape[-1])

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (shape_a, shape_b), (dtype_a, dtype_b) = ctx.shapes, ctx.dtypes
            need_a, need_b = ctx.needs_input_grad[:2]
            grad_a = grad.new_empty(shape_a, dtype=dtype_a) if need_a else None
            grad_b = grad.new_empty(shape_b, dtype=dtype_b) if need_b else None
            return grad_a, grad_b, None

    return GroupedMM


def _dropout(tensor: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """CUDA's fused dropout: the backward keeps a bool mask, not one in the activation dtype."""
    import torch

    del inplace  # an in-place dropout saves the same mask
    if not training or p == 0:
        return tensor
    return torch.native_dropout(tensor, p, True)[0]


def register_flash_stand_in() -> None:
    """Register the fused stand-in under `FLASH_STAND_IN` in transformers (once)."""
    from transformers import AttentionInterface

    if FLASH_STAND_IN in AttentionInterface._global_mapping:
        return
    fused = _fused_attention_class(flash=True)

    def flash_stand_in(
        module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any
    ) -> tuple[Any, None]:
        del module, attention_mask, kwargs  # causal flag only: no mask, no bias kept
        import torch

        # As transformers' flash integration: v padded to q's head dim (MLA), output cropped.
        width = value.shape[-1]
        if width != query.shape[-1]:
            value = torch.nn.functional.pad(value, [0, query.shape[-1] - width])
        if query.is_meta and _PADDED.get():
            return _unpadded_flash(fused, query, key, value)[..., :width], None
        return fused.apply(query, key, value, None).transpose(1, 2)[..., :width], None

    AttentionInterface.register(FLASH_STAND_IN, flash_stand_in)


def _unpadded_flash(fused: Any, query: Any, key: Any, value: Any) -> Any:
    """transformers' flash path for a padded batch (``_upad_input``, ``_pad_input``): the
    real tokens of q, k and v gathered (each gather keeps the indices), the varlen
    kernel on them, its output scattered into a new zero tensor; every token counted
    real, as meta has no mask values.  Takes q, k, v as (batch, heads, seq, dim) and
    returns (batch, seq, heads, dim), as transformers' flash path does."""
    import torch

    batch, heads, length, dim = query.shape
    indices = torch.empty(batch * length, dtype=torch.long, device=query.device)
    key_u, value_u, query_u = (
        x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3])[indices] for x in (key, value, query)
    )
    # The kernel on the packed tokens, as one sequence of (1, heads, tokens, dim).
    out = fused.apply(*(x.transpose(0, 1).unsqueeze(0) for x in (query_u, key_u, value_u)), None)
    padded = out.new_zeros(batch * length, heads, dim)
    padded[indices] = out.squeeze(0).transpose(0, 1)
    return padded.view(batch, length, heads, dim)
