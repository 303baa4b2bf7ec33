"""A linear layer's allocations for the step replay, with its LoRA adapter.

What the replay needs to know of a recipe (`TraceRecipe`), and a block linear
op by op: the plain matmul, or bitsandbytes' 4-bit one (cast to the compute
dtype, dequantize, cast back), and PEFT's ``lora.Linear.forward`` /
``lora.bnb.Linear4bit.forward`` on top.  A tensor is freed where the last
Python name or autograd node holding it lets go.  Sizes in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.param_layout import matches_target


@dataclass(frozen=True, slots=True)
class TraceRecipe:
    """What the replay needs beyond the architecture (bytes per element unless said)."""

    batch: int
    seq: int
    act: int  # activations (4 after kbit preparation)
    compute: int  # the compute dtype (bitsandbytes' matmuls)
    residual: int  # the residual stream between blocks
    attention: str  # eager | fused | flash
    weights: int  # bytes of a non-quantized parameter as loaded
    kept: int  # bytes of a non-quantized parameter after preparation
    quantized: bool
    double_quant: bool
    full: bool  # full fine-tune: every parameter trained
    lora_rank: int
    adapted: frozenset[str]
    logits: int  # LM head output bytes, 0 when the output is dropped before backward
    state_bytes: float  # optimizer state bytes (all states) per byte of trainable parameter
    foreach_temp: bool  # torch AdamW's foreach temporary
    accumulate: bool
    device_steps: bool = False  # fused AdamW keeps each parameter's step count on the GPU
    factored: bool = False  # transformers' Adafactor (`ckpt_core._memory.adafactor`)
    optimizer_states: int = 2  # state tensors per parameter (AdamW's two, SGD momentum's one)
    eager_extra: bool = True  # CUDA softmax backward's fp32 grad * output temporary
    # The compute dtype is fp16, not bf16: CUDA's softmax upcasts fp16 scores inside its
    # kernel (bf16 ones are copied to fp32 first), and bitsandbytes' int8 matmul takes fp16.
    fp16: bool = False
    int8: bool = False  # bitsandbytes' LLM.int8() linears (else 4-bit when quantized)
    blas_workspace: int = 0  # one cuBLAS workspace (`ckpt_core._memory.workspace`)
    padded: bool = False  # an attention mask with padding (`ckpt_core._memory.model_trace`)
    gqa: str = "native"  # how sdpa runs grouped kv heads (`ckpt_core._memory.ledger.Step`)
    idle_adapters: tuple[int, ...] = ()  # adapter tensors on an idle tower, in PEFT's order
    device_map: bool = False  # loaded by from_pretrained(device_map=...), not moved with .to()
    # The rotary embedding's `inv_freq @ position_ids` is the forward's first cuBLAS call
    # (transformers before 5.19); else the first linear is.
    rotary_matmul: bool = False
    # Linears loaded in fp32 among half-precision ones (`ckpt_core._memory.ledger.Step`).
    fp32_linears: frozenset[str] = frozenset()
    # Linears bitsandbytes leaves unquantized (the family's `Family.keep_in_fp32`).
    unquantized_linears: frozenset[str] = frozenset()


def adapted(recipe: TraceRecipe, name: str) -> bool:
    return any(matches_target(name, target) for target in recipe.adapted)


def kept_in_fp32(recipe: TraceRecipe, name: str) -> bool:
    """Whether the linear ``name`` is loaded in fp32 (`TraceRecipe.fp32_linears`)."""
    return any(matches_target(name, kept) for kept in recipe.fp32_linears)


def left_unquantized(recipe: TraceRecipe, name: str) -> bool:
    """Whether bitsandbytes leaves the linear ``name`` of a quantized model as loaded."""
    return recipe.quantized and any(
        matches_target(name, kept) for kept in recipe.unquantized_linears
    )


def linear(
    sim: Sim,
    x: int,
    name: str,
    shape: tuple[int, int],
    recipe: TraceRecipe,
    *,
    bias: bool = False,
    strided_grad: bool = False,
) -> int:
    """A block linear (bitsandbytes' when quantized) and its LoRA adapter.  ``bias``: an
    unquantized one runs ``addmm``, whose backward makes the input's gradient first.
    ``strided_grad``: its output's gradient arrives as a transposed view (eager's keys,
    through ``k.transpose(2, 3)``): the backward of an unquantized linear's 3-D output
    view copies it contiguous (`strided_output`), and so does lora_B's, as PEFT's casts
    and scaling keep the strides."""
    fan_in, fan_out = shape
    tokens = recipe.batch * recipe.seq
    act, compute = recipe.act, recipe.compute
    if recipe.int8:
        base = _int8_matmul(sim, x, shape, recipe)
    elif recipe.quantized:  # bitsandbytes: cast to the compute dtype, dequantize, cast back
        cast = sim.op([x], compute * tokens * fan_in) if act != compute else x
        out = sim.op(
            [cast],
            compute * tokens * fan_out,
            temps=[compute * fan_in * fan_out],
            backward_temps=[compute * fan_in * fan_out],
            matmul=True,
        )
        if act != compute:
            base = sim.op([out], act * tokens * fan_out)
            sim.drop(out)
        else:
            base = out
        if cast != x:  # bnb Linear4bit.forward's `x = x.to(compute_dtype)` dies on return
            sim.drop(cast)
    else:
        trained = recipe.weights * fan_in * fan_out if recipe.full else 0
        base = sim.op(
            [x],
            act * tokens * fan_out,
            save=[x] if trained else [],
            saves_other=True,  # the weight, for the input's gradient
            param_grad=trained,
            matmul=True,
            view_grads=True,  # aten::linear reshapes the 3-D input to 2-D for the mm
            input_grad_first=bias,
        )
        if strided_grad:
            base = strided_output(sim, base)
    if not (recipe.lora_rank and adapted(recipe, name)):
        return base
    if recipe.quantized:
        return _lora_bnb(sim, x, base, shape, recipe)
    # peft lora.Linear.forward: `x = self._cast_input_dtype(x, fp32)` lives until the
    # return; `result = result + lora_B(lora_A(dropout(x))) * scaling` frees lora_A's
    # output when lora_B returns, then the product, then the base result.
    lora_in, scaled = _adapter(sim, x, shape, recipe, strided_grad=strided_grad)
    total = sim.op([base, scaled], 4 * tokens * fan_out, alias=True, cast=True)
    sim.drop(scaled, base)
    out = sim.op([total], act * tokens * fan_out) if act != 4 else total
    if out != total:
        sim.drop(total)
    if lora_in != x:
        sim.drop(lora_in)
    return out


def strided_output(sim: Sim, out: int) -> int:
    """A matmul's 3-D output, the view of its 2-D result, whose gradient arrives as a
    transposed view: ViewBackward0's reshape copies it contiguous, then frees it."""
    (view,) = sim.views(out, [sim.size(out)])
    sim.drop(out)
    return view


def _int8_matmul(sim: Sim, x: int, shape: tuple[int, int], recipe: TraceRecipe) -> int:
    """bitsandbytes' LLM.int8() product with a frozen weight (``MatMul8bitLt`` in
    autograd/_functions.py, the CUDA kernels of backends/cuda/ops.py, transformers'
    outlier threshold 6.0).

    The input cast to fp16 lives while it is quantized row-wise (row scales, then
    int8 rows; ``A.abs() >= threshold`` marks the outlier columns); the int32
    product is dequantized to fp16, cast to the input's dtype, and the outlier
    columns' product is added by ``addmm`` into a new output (real activations have
    outliers; their few columns are left out).  The input is kept for backward as
    ``ctx.tensors``, an attribute checkpointing does not see, so a checkpointed block
    keeps it too; the backward dequantizes the weight into the input's dtype.
    """
    fan_in, fan_out = shape
    tokens, act = recipe.batch * recipe.seq, recipe.act
    rows = tokens * fan_in
    fp16_input = act == 2 and recipe.fp16  # no cast to fp16, in or out
    half = None if fp16_input else sim.new(2 * rows)
    scales, quantized = sim.new(4 * tokens), sim.new(rows)
    magnitude = sim.new(2 * rows)
    outliers = sim.new(rows)
    sim.drop(magnitude, outliers)
    if half is not None:
        sim.drop(half)
    product = sim.new(4 * tokens * fan_out)
    output = sim.new(2 * tokens * fan_out)
    sim.drop(product)
    if not fp16_input:
        cast = sim.new(act * tokens * fan_out)
        sim.drop(output)
        output = cast
    out = sim.op(
        [x], act * tokens * fan_out, holds=[x], backward_temps=[act * fan_in * fan_out], matmul=True
    )
    sim.drop(output, quantized, scales)
    return out


def _lora_bnb(sim: Sim, x: int, base: int, shape: tuple[int, int], recipe: TraceRecipe) -> int:
    """PEFT's adapter on a bitsandbytes linear (peft/tuners/lora/bnb.py: Linear4bit.forward,
    Linear8bitLt.forward).

    The 4-bit layer's `result = result.clone()` copies the base output first;
    `output = lora_B(lora_A(x)) * scaling` (cast to the result's dtype) is a local
    that lives until the return.
    """
    fan_out = shape[1]
    tokens, act = recipe.batch * recipe.seq, recipe.act
    result = base
    if not recipe.int8:
        result = sim.op([base], act * tokens * fan_out, alias=True)
        sim.drop(base)
    lora_in, scaled = _adapter(sim, x, shape, recipe)
    output = sim.op([scaled], act * tokens * fan_out) if act != 4 else scaled
    if output != scaled:
        sim.drop(scaled)
    total = sim.op([result, output], act * tokens * fan_out, alias=True)
    sim.drop(result)
    if lora_in != x:
        sim.drop(lora_in)
    sim.drop(output)
    return total


def _adapter(
    sim: Sim, x: int, shape: tuple[int, int], recipe: TraceRecipe, *, strided_grad: bool = False
) -> tuple[int, int]:
    """``lora_B(lora_A(x)) * scaling`` in fp32: (the fp32 input, which its caller frees,
    and the scaled product); lora_A's output dies when lora_B returns.  ``strided_grad``:
    lora_B's output view copies its transposed gradient (`linear`)."""
    fan_in, fan_out = shape
    tokens, rank = recipe.batch * recipe.seq, recipe.lora_rank
    lora_in = sim.op([x], 4 * tokens * fan_in) if recipe.act != 4 else x
    mid = sim.op(
        [lora_in], 4 * tokens * rank, save=[lora_in], param_grad=4 * rank * fan_in, matmul=True
    )
    up = sim.op([mid], 4 * tokens * fan_out, save=[mid], param_grad=4 * rank * fan_out, matmul=True)
    if strided_grad:
        up = strided_output(sim, up)
    sim.drop(mid)
    scaled = sim.op([up], 4 * tokens * fan_out)
    sim.drop(up)
    return lora_in, scaled
