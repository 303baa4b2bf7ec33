"""Peak memory of one training step on one GPU, per tier (DESIGN section 5).

``peak = weights + gradients + optimizer states + activations(tier)
+ transient working set + allowance``, every term from the config and the
workload, never from a built model.  The assumptions are returned with the
numbers (`ASSUMPTIONS`); the ones that matter most:

- Weights as stored: bf16 / fp16 2 B, fp32 4 B.  Quantized (bitsandbytes, as
  transformers loads them): only ``nn.Linear`` layers inside the blocks;
  embeddings, LM head, norms, routers and MoE expert tensors (3-D parameters,
  which bitsandbytes leaves alone) stay in the compute dtype.  int8: 1 B per
  weight + an fp32 scale per output row.  nf4: 0.5 B per weight + blocksize-64
  absmax quantized to 8 bit with double quantization (1 B per 64 weights + an
  fp32 per 256 blocks): 4.127 bits per weight.
- Full fine-tune: gradients and optimizer states in the parameters' dtype
  (torch's AdamW allocates ``zeros_like(param)``; the HF Trainer keeps no
  separate fp32 master copy): AdamW 2 states, 8-bit AdamW 2 B + an fp32
  absmax per 256 values per state, SGD none (momentum 0, torch's default).
  For fp32 master weights with bf16 compute, say ``weights: fp32``.
- LoRA / QLoRA: adapters (rank r on the target linears) in fp32 (PEFT's
  ``autocast_adapter_dtype``), their gradients and optimizer states fp32; the
  base is frozen.
- Gradients are counted as fully allocated while all activations are held:
  true with gradient accumulation, an upper bound without it.
- Transient: the larger of the loss backward (two fp32 vocab x tokens
  buffers) and one block's backward (its recomputed activations when
  checkpointed, plus the gradient buffers of its widest op).
- Allowance: 1 GiB for the CUDA context and library workspaces plus 5 % of
  the allocated peak for allocator fragmentation (typical values, not
  measured here: no GPU on this machine).

Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ckpt_core._memory.activations import Assignment, activation_bytes
from ckpt_core._memory.arch import Arch
from ckpt_core._memory.ledger import Step
from ckpt_core._memory.param_layout import ParamLayout
from ckpt_core._memory.transient import transient_bytes
from ckpt_core._planning.tiers import CONCRETE_TIERS
from ckpt_core._planning.workload import Workload

GIB: Final = 1 << 30
CONTEXT_BYTES: Final = GIB
FRAGMENTATION: Final = 0.05
NF4_BYTES_PER_WEIGHT: Final = 0.5 + 1 / 64 + 4 / (64 * 256)
ADAM8_BYTES_PER_STATE: Final = 1 + 4 / 256
LORA_BYTES: Final = 4  # adapters in fp32

DTYPE_BYTES: Final[dict[str, int]] = {"bf16": 2, "fp16": 2, "fp32": 4}

ASSUMPTIONS: Final[dict[str, str]] = {
    "activations": "pure `dtype` compute (model loaded in that dtype, no autocast); the same "
    "definition as the meta measurement: storages autograd keeps at the end of forward",
    "attention": "sdpa / flash treated as fused kernels (q, k, v, output, log-sum-exp kept); "
    "eager keeps the s x s softmax",
    "quantization": "bitsandbytes: block linears quantized; embeddings, LM head, norms, "
    "routers and MoE expert tensors in the compute dtype; nf4 = 4.127 bits/weight "
    "(blocksize 64, double quantization); int8 = 1 B/weight + fp32 row scales",
    "full_fine_tune": "gradients and optimizer states in the parameters' dtype (torch AdamW "
    "zeros_like); no separate fp32 master copy",
    "lora": "adapters, their gradients and optimizer states in fp32 (PEFT autocast_adapter_dtype); "
    "lora_dropout 0; each adapter keeps an fp32 copy of its input and its rank-r output",
    "optimizer": "adamw 2 states; adamw_8bit 2 B + fp32 absmax per 256 values per state; "
    "sgd momentum 0 (no state)",
    "gradients": "fully allocated while all activations are held (gradient accumulation); an "
    "upper bound for a single micro-batch",
    "transient": "max(loss backward: 2 fp32 vocab x tokens buffers, one block's backward: "
    "recomputed activations + gradient buffers of its widest op)",
    "allowance": "1 GiB CUDA context and workspaces + 5% fragmentation (typical, not measured "
    "here)",
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


@dataclass(frozen=True, slots=True)
class TierMemory:
    """One assignment's (a tier's) activation bytes and estimated peak (bytes)."""

    activation_bytes: int
    transient_bytes: int
    peak_bytes: int


def static_memory(layout: ParamLayout, workload: Workload, lora_parameters: int) -> StaticMemory:
    """Weights by storage, plus gradients and optimizer states of what is trained."""
    weights = _weight_bytes(layout, workload)
    if workload.method == "full":
        trainable = layout.total
        grad_bytes = DTYPE_BYTES[workload.weight_storage]
    else:
        trainable = lora_parameters
        grad_bytes = LORA_BYTES
        weights += trainable * LORA_BYTES
    return StaticMemory(
        weights=weights,
        trainable_parameters=trainable,
        gradients=trainable * grad_bytes,
        optimizer=int(trainable * _optimizer_bytes_per_parameter(workload.optimizer, grad_bytes)),
    )


def _weight_bytes(layout: ParamLayout, workload: Workload) -> int:
    storage = workload.weight_storage
    if storage in DTYPE_BYTES:
        return layout.total * DTYPE_BYTES[storage]
    compute = DTYPE_BYTES[workload.dtype]
    quantized = sum(linear.weights for linear in layout.linears)
    rows = sum(linear.fan_out * linear.count for linear in layout.linears)
    kept = layout.total - quantized  # biases, embeddings, norms, experts: compute dtype
    if storage == "int8":
        return quantized + 4 * rows + kept * compute
    return int(quantized * NF4_BYTES_PER_WEIGHT) + kept * compute


def _optimizer_bytes_per_parameter(optimizer: str, param_bytes: int) -> float:
    if optimizer == "adamw":
        return 2 * param_bytes
    if optimizer == "adamw_8bit":
        return 2 * ADAM8_BYTES_PER_STATE
    return 0.0


def tier_memory(arch: Arch, step: Step, assignment: Assignment, static: StaticMemory) -> TierMemory:
    """Activations (closed form), transient, allowance and the peak for one assignment.

    The one peak function: the tiers' estimate, ``auto``'s search over
    block-level plans and the alternatives all call it.
    """
    activations = activation_bytes(arch, step, assignment)
    transient = transient_bytes(arch, step, assignment)
    allocated = static.total + activations + transient
    peak = int(allocated * (1 + FRAGMENTATION)) + CONTEXT_BYTES
    return TierMemory(activations, transient, peak)


def all_tiers(arch: Arch, step: Step, static: StaticMemory) -> dict[str, TierMemory]:
    """`tier_memory` for off, selective, medium and full."""
    return {tier: tier_memory(arch, step, tier, static) for tier in CONCRETE_TIERS}
