"""What the peak of one training step on one GPU is made of (docs/design.md §5): the
model states (`static_memory`), the step's recipe (`recipe_for`) and the
assumptions returned with the numbers (`ASSUMPTIONS`); `ckpt_core._memory.peak_model`
computes the peaks from them.

Two peaks per tier, every term from the config and the workload, never from
a built model:

- ``allocated_bytes`` (``torch.cuda.max_memory_allocated()`` of the step):
  weights as stored, optimizer states, gradients, the activations of the tier
  and the transient buffers of the step's competing moments
  (`ckpt_core._memory.peak`), replayed op by op for the decoder family
  (`ckpt_core._memory.step_trace`);
- ``peak_bytes`` (process memory, what runs out): the CUDA context by GPU
  (`ckpt_core._memory.context`) plus what PyTorch's caching allocator reserves for
  that sequence of allocations (`ckpt_core._memory.allocator`).

Weights: bf16 / fp16 2 B, fp32 4 B.  Quantized (bitsandbytes, as transformers
loads them): every ``nn.Linear`` but the output embeddings - the blocks', a
head's (BERT's transform), an idle vision tower's; embeddings, LM head, norms,
routers and MoE expert tensors stay unquantized - in fp32 after PEFT's
``prepare_model_for_kbit_training`` (the default ``kbit_preparation``), else
in the compute dtype.  int8: 1 B per weight + an fp32 scale per output row.
nf4: 0.5 B per weight + an fp32 absmax per 64-weight block (4.5 bits per
weight); with ``double_quant`` the absmax is 8-bit plus an fp32 per 256 blocks
(4.127 bits).  Full fine-tune: gradients and optimizer states in the
parameters' dtype (fp32 with ``compute: autocast``).  LoRA / QLoRA: adapters,
their gradients and states in fp32.

Pure arithmetic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Final

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.ledger import Step
from ckpt_core._memory.param_layout import Linear, ParamLayout
from ckpt_core._memory.peak import Recipe
from ckpt_core._memory.step_trace import TraceRecipe, adafactor_temporary
from ckpt_core._memory.workspace import blas_workspace_bytes
from ckpt_core._planning.workload import Workload

GIB: Final = 1 << 30
MIB: Final = 1 << 20
# bitsandbytes nf4: 4 bits per weight + an absmax per 64-weight block: fp32 by default,
# 8-bit with double quantization (plus an fp32 scale per 256 blocks).
NF4_BYTES_PER_WEIGHT: Final = 0.5 + 4 / 64
NF4_DOUBLE_QUANT_BYTES_PER_WEIGHT: Final = 0.5 + 1 / 64 + 4 / (64 * 256)
ADAM8_BYTES_PER_STATE: Final = 1 + 4 / 256
LORA_BYTES: Final = 4  # adapters in fp32

DTYPE_BYTES: Final[dict[str, int]] = {"bf16": 2, "fp16": 2, "fp32": 4}

ASSUMPTIONS: Final[dict[str, str]] = {
    "activations": "compute in `dtype` (weights loaded in it, or fp32 weights with autocast: "
    "`compute`); after PEFT's kbit preparation every hidden state is fp32 (fp32 embeddings and "
    "norms, bitsandbytes returns its input's dtype); the same definition as the meta "
    "measurement: storages autograd keeps at the end of forward",
    "attention": "sdpa / flash treated as fused kernels (q, k, v, output, log-sum-exp kept); "
    "eager keeps the s x s softmax; a padded batch (padded) gives sdpa a mask per sample on "
    "every layer, which keeps a float copy of it and grouped K / V heads repeated per layer; "
    "sdpa runs torch's math backend (fp32 q, k, v repeated to every head and the fp32 "
    "softmax kept) for calls no fused kernel takes: grouped heads without a mask in fp32 or "
    "on a GPU below compute capability 8.0 (sdpa_backend auto), Falcon-7B's one key head",
    "quantization": "bitsandbytes: block linears quantized but the model's keep-in-fp32 "
    "modules (T5's wo); MoE experts, stacked tensors rather than linear layers, stay "
    "unquantized; nf4 = 0.5 B/weight + fp32 absmax "
    "per 64 (double_quant: 8-bit absmax + fp32 per 256 blocks); int8 = 1 B/weight + fp32 row "
    "scales, and each int8 linear keeps its input as an attribute, through checkpointing too; "
    "other parameters fp32 after PEFT's kbit preparation (kbit_preparation 'peft'), "
    "else in the compute dtype",
    "load_path": "device_map: from_pretrained with a device map first reserves the model's "
    "size in one block and loads into it; to_device: moved with .to(), a block per "
    "parameter; null: device_map for quantized weights (replayed tensor by tensor), "
    "to_device otherwise",
    "full_fine_tune": "gradients and optimizer states in the parameters' dtype (torch AdamW "
    "zeros_like); fp32 master weights with compute 'autocast'; loaded in fp16, the model's "
    "keep-in-fp32 modules (T5's wo) are fp32, and so is what they compute",
    "lora": "adapters on every linear but the output embeddings (PEFT's all-linear; an idle "
    "vision tower's never train) unless lora_targets names them; adapters, their gradients "
    "and optimizer states in fp32 (PEFT autocast_adapter_dtype); lora_dropout 0; each adapter "
    "keeps an fp32 copy of its input and its rank-r output",
    "optimizer": "adamw 2 states (torch's foreach step holds one more parameter-sized "
    "temporary); adamw_fused 2 states and an fp32 step count per parameter on the GPU, no "
    "temporary (torch.optim.AdamW(fused=True), HF Trainer's adamw_torch_fused); adamw_8bit "
    "2 B + fp32 absmax per 256 values per state; adamw_32bit (bitsandbytes', HF Trainer's "
    "paged_adamw_32bit) 2 fp32 states whatever the parameters' dtype, updated in place, paged "
    "ones counted as resident; adafactor (transformers', no beta1) fp32 "
    "row and column second moments per matrix, a whole one per vector, its step one "
    "parameter at a time (16-bit ones copied to fp32); sgd no state (momentum 0); "
    "sgd_momentum one momentum buffer per parameter, in its dtype",
    "gradients": "set_to_none: created during backward, freed by zero_grad(set_to_none=True); "
    "accumulate: allocated all step, each new gradient made, added in place and freed (a "
    "tied weight's two summed first)",
    "logits": "logits_held: the step's output (its logits) stays referenced until the step "
    "ends, as `out = model(...); out.loss.backward()`",
    "allocated": "max over the step's moments (loss backward, each block's recompute and "
    "backward, optimizer step), replayed op by op for the dense decoders (Llama-style, "
    "Phi-3, Qwen3, Gemma 2 / 3, OLMo-2, StarCoder2, Phi, StableLM), GPT-2, GPT-NeoX, "
    "OPT and Falcon (whose multi-query sdpa runs torch's math backend: fp32 scores); "
    "plus "
    "two cuBLAS workspaces (the Python thread's and autograd's: 32 MiB each from compute "
    "capability 9 and for an unnamed GPU, 8.125 MiB before)",
    "process": "CUDA context (measured per GPU where known, else an allowance) + the caching "
    "allocator's reserved pool, replayed with its rounding (512 B), pools (<= 1 MiB from 2 MiB "
    "segments; 20 MiB segments below 10 MiB; else rounded to 2 MiB), best-fit splitting and "
    "caching, over the load, a warm-up step and the step itself (a job's second step reuses "
    "the first one's cached segments)",
}


@dataclass(frozen=True, slots=True)
class StaticMemory:
    """What does not depend on the tier: weights, gradients, optimizer states (bytes)."""

    weights: int
    trainable_parameters: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer

    @property
    def replica_total(self) -> int:
        """The model states of one whole replica: what the step replay allocates."""
        return self.total

    @property
    def foreach_temporary(self) -> int:
        """What torch's foreach AdamW step holds besides the states: one state-sized
        tensor per parameter, in the states' dtype (the parameters', as the gradients)."""
        return self.gradients


def static_memory(
    layout: ParamLayout,
    workload: Workload,
    lora_parameters: int,
    *,
    keep_in_fp32: frozenset[str] = frozenset(),
    fp32_linears: frozenset[str] = frozenset(),
    idle_adapters: int = 0,
    states: int | None = None,
) -> StaticMemory:
    """Weights by storage, plus gradients and optimizer states of what is trained.

    ``keep_in_fp32``: the linears transformers keeps in fp32 when it loads in fp16
    (`Family.keep_in_fp32`), which bitsandbytes never quantizes; ``fp32_linears``:
    those this load keeps in fp32 (`Step.fp32_linears`), whose gradients and
    optimizer states are fp32 too in a full fine-tune, as are those of the
    parameters every load keeps in fp32 (`ParamLayout.fp32_other`).  ``idle_adapters``:
    parameters of the adapters on a tower text-only training never runs (fp32
    weights, never trained).  ``states``: the optimizer's state bytes where
    they follow from shapes, not counts (Adafactor: `ckpt_core._memory.adafactor`).
    """
    wide = sum(linear.parameters for linear in _named(layout, fp32_linears)) + layout.fp32_other
    weights = _weight_bytes(layout, workload, _named(layout, keep_in_fp32), wide)
    if workload.method == "full":
        trainable = layout.trained
        grad_bytes = DTYPE_BYTES[workload.weight_storage]
        per_parameter = functools.partial(optimizer_bytes_per_parameter, workload.optimizer)
        gradients = trainable * grad_bytes + wide * (4 - grad_bytes)
        if states is None:
            states = int(
                trainable * per_parameter(grad_bytes)
                + wide * (per_parameter(4) - per_parameter(grad_bytes))
            )
    else:
        trainable = lora_parameters
        weights += (trainable + idle_adapters) * LORA_BYTES
        gradients = trainable * LORA_BYTES
        if states is None:
            states = int(trainable * optimizer_bytes_per_parameter(workload.optimizer, LORA_BYTES))
    return StaticMemory(
        weights=weights,
        trainable_parameters=trainable,
        gradients=gradients,
        optimizer=states,
    )


def _named(layout: ParamLayout, names: frozenset[str]) -> list[Linear]:
    """The block linears whose last name part is in ``names`` (``"wo"``)."""
    return [linear for linear in layout.linears if linear.name.rsplit(".", 1)[-1] in names]


def unquantized_parameter_bytes(workload: Workload) -> int:
    """Bytes of each parameter bitsandbytes does not quantize (each one, unquantized)."""
    storage = workload.weight_storage
    if storage in DTYPE_BYTES:
        return DTYPE_BYTES[storage]
    # PEFT's prepare_model_for_kbit_training casts every non-quantized parameter to fp32.
    return 4 if workload.kbit_prepared else DTYPE_BYTES[workload.dtype]


def _weight_bytes(layout: ParamLayout, workload: Workload, kept: list[Linear], wide: int) -> int:
    """Bytes of the loaded weights: ``wide`` parameters load in fp32, and bitsandbytes
    leaves the ``kept`` linears unquantized."""
    storage = workload.weight_storage
    unquantized_bytes = unquantized_parameter_bytes(workload)
    if storage in DTYPE_BYTES:
        return layout.total * unquantized_bytes + wide * (4 - unquantized_bytes)
    # Every linear but the output embeddings: an idle vision tower's too.
    quantized_linears = [linear for linear in layout.linears if linear not in kept]
    quantized_linears += layout.idle_linears
    quantized = sum(linear.weights for linear in quantized_linears)
    rows = sum(linear.fan_out * linear.count for linear in quantized_linears)
    unquantized = layout.total - quantized  # biases, embeddings, norms, experts, kept linears
    fixed = unquantized * unquantized_bytes + wide * (4 - unquantized_bytes)
    if storage == "int8":
        return quantized + 4 * rows + fixed
    double = workload.double_quant
    per_weight = NF4_DOUBLE_QUANT_BYTES_PER_WEIGHT if double else NF4_BYTES_PER_WEIGHT
    return int(quantized * per_weight) + fixed


# State tensors each optimizer makes per parameter at its first step.
OPTIMIZER_STATES: Final[dict[str, int]] = {
    "adamw": 2,
    "adamw_fused": 2,
    "adamw_8bit": 2,
    "adamw_32bit": 2,
    "sgd": 0,
    "sgd_momentum": 1,
}


def optimizer_bytes_per_parameter(optimizer: str, param_bytes: int) -> float:
    """Its states' bytes per parameter of ``param_bytes``: each state in the parameter's
    dtype (torch's AdamW and SGD), 8-bit with blockwise absmax or fp32 (bitsandbytes')."""
    per_state = {"adamw_8bit": ADAM8_BYTES_PER_STATE, "adamw_32bit": 4}.get(optimizer, param_bytes)
    return OPTIMIZER_STATES[optimizer] * per_state


def recipe_for(
    arch: Arch,
    layout: ParamLayout,
    workload: Workload,
    static: StaticMemory,
    step: Step,
    *,
    blas_workspace: int = blas_workspace_bytes(None),
    idle_adapters: tuple[int, ...] = (),
    rotary_matmul: bool = False,
    keep_in_fp32: frozenset[str] = frozenset(),
) -> Recipe:
    """The real-step facts `ckpt_core._memory.peak` and the replay need, from the recipe fields.

    ``blas_workspace``: one cuBLAS workspace on the GPU (`ckpt_core._memory.workspace`);
    ``idle_adapters``: the parameters of each adapter tensor on an idle tower, in order;
    ``rotary_matmul``: the worker's transformers computes RoPE's angles with a matmul
    (`TraceRecipe.rotary_matmul`); ``keep_in_fp32``: the linears bitsandbytes leaves
    unquantized (`static_memory`'s).
    """
    compute = DTYPE_BYTES[workload.dtype]
    logits = 0
    if workload.logits_held:
        logits = 4 if workload.kbit_prepared else compute
    trainable = static.trainable_parameters
    grad_bytes = static.gradients // trainable if trainable else 0
    layers = max(1, max((linear.count for linear in layout.linears), default=1))
    head = layout.embeddings * grad_bytes if workload.method == "full" else 0
    factored = workload.optimizer == "adafactor"
    widest = max((linear.fan_in * linear.fan_out for linear in layout.linears), default=0)
    loaded = 4 if workload.weight_storage == "fp32" or workload.compute == "autocast" else compute
    state_ratio = static.optimizer / static.gradients if static.gradients else 0.0
    trace = TraceRecipe(
        batch=step.batch,
        seq=step.seq,
        act=step.dtype_bytes,
        compute=compute,
        residual=step.residual_bytes,
        attention=step.attention,
        gqa=step.gqa,
        weights=loaded,
        kept=4 if workload.kbit_prepared else loaded,
        quantized=workload.quantized,
        double_quant=workload.double_quant,
        full=workload.method == "full",
        lora_rank=step.lora_rank,
        adapted=step.adapters,
        logits=logits,
        state_bytes=state_ratio,
        foreach_temp=workload.optimizer == "adamw",
        device_steps=workload.optimizer == "adamw_fused",
        factored=factored,
        optimizer_states=0 if factored else OPTIMIZER_STATES[workload.optimizer],
        accumulate=workload.gradients == "accumulate",
        blas_workspace=blas_workspace,
        fp16=workload.dtype == "fp16",
        int8=workload.weight_storage == "int8",
        padded=step.padded,
        idle_adapters=tuple(LORA_BYTES * size for size in idle_adapters),
        # A 4-bit load's pool is left to the per-tensor order: transformers' loader threads
        # run ahead of the quantization by a timing-dependent amount (docs/memory-model.md).
        device_map=workload.loaded_with_device_map and not workload.quantized,
        rotary_matmul=rotary_matmul,
        fp32_linears=step.fp32_linears,
        unquantized_linears=keep_in_fp32,
    )
    if factored:
        temporary = adafactor_temporary(arch, trace)
    else:
        temporary = static.foreach_temporary if workload.optimizer == "adamw" else 0
    return Recipe(
        logits_bytes=logits,
        gradients=static.gradients,
        head_gradients=head,
        block_gradients=(static.gradients - head) // layers,
        gradients_held=workload.gradients == "accumulate",
        optimizer_temporary=temporary,
        # bitsandbytes dequantizes a weight for the input's gradient: 4-bit into the compute
        # dtype, int8 into the input's (fp32 after kbit preparation).
        dequantized=widest * (step.dtype_bytes if trace.int8 else compute)
        if workload.quantized
        else 0,
        trace=trace,
    )
