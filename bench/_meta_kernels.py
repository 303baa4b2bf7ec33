"""What CUDA kernels allocate that their meta stand-ins do not, for `bench.op_order`.

A recording on meta sees each op's outputs only.  The buffers a CUDA kernel
makes inside (bitsandbytes' dequantized 4-bit weight, its int8 matmul's
product; the softmax backward's temporary; ``_safe_softmax``'s softmax and
-inf test) are added to the recording here, and bitsandbytes' quantized
layers are built on meta.
"""

from __future__ import annotations

from typing import Any

import torch

# (malloc | free | mark, storage key, bytes, the op that made it)
Event = tuple[str, Any, int, str]


def kernel_buffers_before(func: Any, args: Any, kwargs: Any, events: list[Event]) -> list[Any]:
    """Log the buffers ``func`` makes before its output; returns those freed after it.

    bitsandbytes' CUDA ``gemm_4bit`` dequantizes the weight
    (``_dequant_linear_fallback``) past 4 rows: its fused kernel wins only below a
    per-GPU size (1536 rows at most), which a training step's rows pass on most
    GPUs and shapes (the estimate's dequantized buffer); its ``int8_scaled_mm`` at transformers'
    outlier threshold makes the int32 product and its fp16 dequantization (cast
    to the input's dtype), and ``addmm`` remakes the output with the outlier
    columns.
    """
    name = str(func)
    if name == "aten._safe_softmax.default":
        # Its composite kernel: the softmax, the -inf test (bool), then `where` (the output).
        buffers = [("safe_softmax", part, len(events)) for part in ("softmax", "masked")]
        sizes = (args[0].nbytes, args[0].numel())
        events.extend(("malloc", key, size, "") for key, size in zip(buffers, sizes, strict=True))
        return buffers
    if name == "bitsandbytes.gemm_4bit.default":
        inputs, shape = args[0], args[2]
        rows = inputs.numel() // inputs.shape[-1]
        if rows <= 4:  # `_GEMM_4BIT_CUSTOM_FLOOR_M`: the fused kernel on any GPU
            return []
        buffer = ("dequantized", len(events))
        events.append(("malloc", buffer, shape[0] * shape[1] * inputs.element_size(), ""))
        return [buffer]
    if name != "bitsandbytes.int8_scaled_mm.default":
        return []
    size = args[0].numel() // args[0].shape[-1] * args[1].shape[0]
    dtype = kwargs.get("dtype") or (args[5] if len(args) > 5 else None) or torch.float16
    product, half, cast = (("int8", part, len(events)) for part in ("i32", "fp16", "cast"))
    events.append(("malloc", product, 4 * size, ""))
    events.append(("malloc", half, 2 * size, ""))
    events.append(("free", product, 0, ""))
    if dtype == torch.float16:
        return [half]
    events.append(("malloc", cast, dtype.itemsize * size, ""))
    events.append(("free", half, 0, ""))
    return [cast]


def kernel_buffers_after(func: Any, args: Any, events: list[Event]) -> None:
    """Log the buffers ``func`` makes and frees after its output: bitsandbytes'
    ``int8_vectorwise_quant`` marks outliers (``A.abs() >= threshold``); CUDA's softmax
    backward holds a ``grad * output`` temporary (``softmax_backward_cuda_out``)."""
    name = str(func)
    if name == "bitsandbytes.int8_vectorwise_quant.default":
        rows = args[0].numel()
        magnitude, outliers = ("abs", len(events)), ("outliers", len(events))
        events.append(("malloc", magnitude, 2 * rows, ""))
        events.append(("malloc", outliers, rows, ""))
        events.append(("free", magnitude, 0, ""))
        events.append(("free", outliers, 0, ""))
    elif name == "aten._softmax_backward_data.default":
        temporary = ("softmax", len(events))
        events.append(("malloc", temporary, args[0].nbytes, ""))
        events.append(("free", temporary, 0, ""))


def nf4_layer(fan_in: int, fan_out: int, dtype: Any) -> Any:
    """bitsandbytes' Linear4bit with an nf4 weight (block size 64) built on meta."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import QuantState

    layer = bnb.nn.Linear4bit(
        fan_in, fan_out, bias=False, compute_dtype=dtype, quant_type="nf4", device="meta"
    )
    n = fan_in * fan_out
    state = QuantState(
        absmax=torch.empty(n // 64, dtype=torch.float32, device="meta"),
        shape=torch.Size([fan_out, fan_in]),
        code=torch.empty(16, dtype=torch.float32, device="meta"),
        blocksize=64,
        quant_type="nf4",
        dtype=dtype,
    )
    packed = torch.empty(n // 2, 1, dtype=torch.uint8, device="meta")
    layer.weight = bnb.nn.Params4bit(
        data=packed, requires_grad=False, quant_state=state, bnb_quantized=True, module=layer
    )
    return layer


def int8_layer(fan_in: int, fan_out: int) -> Any:
    """bitsandbytes' Linear8bitLt with int8 rows and fp32 row scales built on meta; its
    outlier threshold is 0 here (meta cannot make the data-dependent outlier columns),
    and the kernels' buffers at transformers' 6.0 are logged above."""
    import bitsandbytes as bnb

    layer = bnb.nn.Linear8bitLt(
        fan_in, fan_out, bias=False, has_fp16_weights=False, threshold=0.0, device="meta"
    )
    rows = torch.empty(fan_out, fan_in, dtype=torch.int8, device="meta")
    layer.weight = bnb.nn.Int8Params(rows, requires_grad=False, has_fp16_weights=False)
    layer.weight.CB = rows
    layer.weight.SCB = torch.empty(fan_out, dtype=torch.float32, device="meta")
    return layer
