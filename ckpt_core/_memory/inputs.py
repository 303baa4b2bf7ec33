"""The estimate's inputs: a model's architecture facts and a workload prepared against it.

`model_facts` validates a model input (``{"preset": ...}``, ``{"config": {...}}``
or a `ModelConfig`) and parses its config once per config key (a preset asked
for by name is validated once); `parse_workload` makes a `Workload`;
`prepare` checks the workload against the model and derives what every peak
of the step needs (`Run`: the activation step, the static memory per GPU, the
real recipe).  Nothing here builds a model or imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ckpt_core._errors import InvalidWorkloadError
from ckpt_core._memory import adafactor
from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention import gqa_kind
from ckpt_core._memory.context import context_bytes
from ckpt_core._memory.estimate import (
    DTYPE_BYTES,
    StaticMemory,
    recipe_for,
    static_memory,
)
from ckpt_core._memory.families import (
    MOE_MODEL_TYPES,
    NO_FLASH,
    NO_SDPA,
    arch_of,
    family_of,
    param_layout,
)
from ckpt_core._memory.ledger import Step
from ckpt_core._memory.param_layout import ParamLayout, matches_target
from ckpt_core._memory.peak import Recipe
from ckpt_core._memory.peak_model import PeakModel
from ckpt_core._memory.sharding import per_gpu_memory
from ckpt_core._memory.workspace import blas_workspace_bytes
from ckpt_core._planning.workload import Workload

# The attention kernel kinds of the activation model, by requested implementation.
_KERNEL: Final[dict[str, str]] = {"sdpa": "fused", "flash_attention_2": "flash", "eager": "eager"}


@dataclass(frozen=True, slots=True)
class Facts:
    """What the estimate needs from a model config (cached per config key)."""

    arch: Arch
    layout: ParamLayout
    architecture: str


_FACTS: dict[str, Facts] = {}  # config key -> facts; bounded, oldest dropped first
_FACTS_LIMIT: Final = 256
_PRESET_KEYS: dict[str, str] = {}  # preset name -> its config key, once validated


def _preset_name(model: object) -> str | None:
    """The name in ``{"preset": NAME}`` (nothing else in the mapping), else None."""
    if isinstance(model, dict) and len(model) == 1 and isinstance(model.get("preset"), str):
        return model["preset"]
    return None


def model_facts(model: object) -> Facts:
    """Validate the model input (`load_model_config`'s rules) and parse it once per key.

    A bundled preset asked for by name is validated once: its config cannot change.
    """
    from ckpt_core._configs.model_config import ModelConfig, hf_config_from_dict, load_model_config

    preset = _preset_name(model)
    known = _FACTS.get(_PRESET_KEYS.get(preset, "")) if preset else None
    if known is not None:
        return known
    config = model if isinstance(model, ModelConfig) else load_model_config(model)
    if preset:
        _PRESET_KEYS[preset] = config.key
    facts = _FACTS.get(config.key)
    if facts is None:
        arch = arch_of(hf_config_from_dict(config.config))
        facts = Facts(arch, param_layout(arch), config.architecture)
        if len(_FACTS) >= _FACTS_LIMIT:
            _FACTS.pop(next(iter(_FACTS)), None)
        _FACTS[config.key] = facts
    return facts


def parse_workload(workload: object) -> Workload:
    """A `Workload` from a mapping (strict: `InvalidWorkloadError` naming the field)."""
    if isinstance(workload, Workload):
        return workload
    if workload is None:
        raise InvalidWorkloadError(
            "a workload with at least seq_len is required with a model", field="workload"
        )
    return Workload.from_dict(workload)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Run:
    """A validated (model, workload) pair and everything derived from it."""

    facts: Facts
    workload: Workload
    step: Step
    static: StaticMemory
    attention_note: str
    recipe: Recipe
    gpu: str | None = None  # GPU-table name: picks the measured CUDA context

    @property
    def rotary_matmul(self) -> bool:
        """`TraceRecipe.rotary_matmul`: the worker's transformers (`prepare`)."""
        trace = self.recipe.trace
        return trace is not None and trace.rotary_matmul

    @property
    def context(self) -> tuple[int, str]:
        return context_bytes(self.gpu)

    @property
    def peak(self) -> PeakModel:
        return PeakModel(self.static, self.recipe, self.context[0])


def prepare(
    facts: Facts, workload: Workload, gpu: str | None = None, *, rotary_matmul: bool = False
) -> Run:
    """Check the workload against the model and derive the activation step and static memory.

    ``rotary_matmul``: the worker's transformers is older than 5.19, whose RoPE angles are
    a matmul, the forward's first cuBLAS call (`TraceRecipe.rotary_matmul`)."""
    arch, layout = facts.arch, facts.layout
    _check_fits_model(arch, workload)
    targets = _lora_targets(layout, workload)
    lora_parameters = sum(
        workload.lora_rank * (linear.fan_in + linear.fan_out) * linear.count
        for linear in layout.linears
        if linear.name in targets
    ) + sum(
        parameter.adapter_parameters(workload.lora_rank)
        for parameter in layout.adapted_parameters
        if parameter.name in targets
    )
    idle_adapters = _idle_adapters(layout, workload)
    factored_states = None
    if workload.optimizer == "adafactor":
        if arch.model_type in MOE_MODEL_TYPES or layout.experts or layout.adapted_parameters:
            raise InvalidWorkloadError(
                f"adafactor's states are modelled for dense models: {arch.model_type}'s "
                "experts are stacked matrices whose factored states are not",
                field="workload.optimizer",
            )
        adapted = None if workload.method == "full" else targets
        factored_states = adafactor.state_bytes(arch, layout, adapted, workload.lora_rank)
    kernel, note = _attention(arch, workload.attention)
    act_bytes = activation_dtype_bytes(workload)
    # autocast hands sdpa its inputs in the dtype, whatever the activations' bytes
    query_bytes = DTYPE_BYTES[workload.dtype] if workload.compute == "autocast" else act_bytes
    gqa = gqa_kind(arch, kernel, workload.sdpa_backend, query_bytes, gpu)
    note = note or _math_note(arch, kernel, gqa)
    fp32_linears = _fp32_linears(arch, workload)
    step = Step(
        batch=workload.micro_batch_size,
        seq=workload.seq_len,
        dtype_bytes=act_bytes,
        attention=kernel,
        trainable_weights=workload.method == "full",
        lora_rank=workload.lora_rank if workload.method != "full" else 0,
        adapters=targets,  # empty for a full fine-tune
        hidden_bytes=4 if workload.compute == "autocast" else 0,
        padded=workload.padded,
        fp32_linears=fp32_linears,
        held_inputs=workload.weight_storage == "int8",
        gqa=gqa,
    )
    # Per GPU of the data-parallel group (the unsharded totals ride along): issue 17.
    replica = static_memory(
        layout,
        workload,
        lora_parameters,
        keep_in_fp32=family_of(arch).keep_in_fp32,
        fp32_linears=fp32_linears,
        idle_adapters=sum(idle_adapters),
        states=factored_states,
    )
    static = per_gpu_memory(replica, arch, layout, workload)
    recipe = recipe_for(
        arch,
        layout,
        workload,
        static,
        step,
        blas_workspace=blas_workspace_bytes(gpu),
        idle_adapters=idle_adapters,
        rotary_matmul=rotary_matmul,
        keep_in_fp32=family_of(arch).keep_in_fp32,
    )
    return Run(facts, workload, step, static, note, recipe, gpu)


def _fp32_linears(arch: Arch, workload: Workload) -> frozenset[str]:
    """The linears transformers keeps in fp32 for this load: the family's
    ``_keep_in_fp32_modules`` when ``from_pretrained`` loads in fp16 (half weights,
    or quantized ones computing in fp16)."""
    fp16 = workload.weight_storage == "fp16" or (workload.quantized and workload.dtype == "fp16")
    return family_of(arch).keep_in_fp32 if fp16 else frozenset()


def activation_dtype_bytes(workload: Workload) -> int:
    """Bytes per activation element.

    After PEFT's kbit preparation the embeddings, norms and LM head are fp32:
    the embedding's output is fp32, Llama-style norms return ``weight *
    x.to(input_dtype)`` (fp32), and bitsandbytes' linears cast back to their
    input's dtype, so every hidden state of the step is fp32.
    """
    return 4 if workload.kbit_prepared else DTYPE_BYTES[workload.dtype]


def _check_fits_model(arch: Arch, workload: Workload) -> None:
    if arch.positions and workload.seq_len > arch.positions:
        raise InvalidWorkloadError(
            f"seq_len {workload.seq_len} is longer than the model's learned positions "
            f"({arch.positions})",
            field="workload.seq_len",
        )


def _lora_targets(layout: ParamLayout, workload: Workload) -> frozenset[str]:
    """Block linears and parameters the adapters go on: every one by default (PEFT's
    ``all-linear``), else those matching by suffix.  A name PEFT maps onto a parameter
    (an MoE expert projection) adapts that parameter instead of any linear of that name."""
    if workload.method == "full":
        return frozenset()
    linears = [linear.name for linear in layout.linears]
    parameters = layout.adapted_parameters
    mapped = {name for parameter in parameters for name in parameter.targets}
    if workload.lora_targets is None:
        kept = [name for name in linears if name.rsplit(".", 1)[-1] not in mapped]
        return frozenset(kept + [parameter.name for parameter in parameters])
    chosen: set[str] = set()
    named: set[str] = set()
    for target in workload.lora_targets:
        maps = [name for name in mapped if target == name or target.endswith("." + name)]
        matched = [p.name for p in parameters if set(maps) & set(p.targets)]
        if not maps:
            matched = [name for name in linears if matches_target(name, target)]
        if not matched:
            experts = f"; PEFT maps {', '.join(sorted(mapped))} onto its experts" if mapped else ""
            raise InvalidWorkloadError(
                f"lora target {target!r} matches no linear layer of this model; its "
                f"linears are {', '.join(linears)}{experts}",
                field="workload.lora_targets",
            )
        chosen.update(matched)
        named.update(maps)
    for parameter in parameters:
        missing = set(parameter.targets) - named
        if parameter.name in chosen and missing:
            raise InvalidWorkloadError(
                f"lora targets {', '.join(sorted(set(parameter.targets) & named))} need "
                f"{', '.join(sorted(missing))} too: PEFT adapts {parameter.name} for them "
                "together and refuses one alone",
                field="workload.lora_targets",
            )
    return frozenset(chosen)


def _idle_adapters(layout: ParamLayout, workload: Workload) -> tuple[int, ...]:
    """Parameters of each adapter PEFT puts on an idle tower's linears (``lora_targets``
    match module names by suffix, a vision tower's too; ``all-linear`` takes every linear
    but the output embeddings), A then B, in the order PEFT makes them: the tower's
    layers, then its projector.  They never train."""
    if workload.method == "full":
        return ()
    targets = workload.lora_targets
    matched = [
        linear
        for linear in layout.idle_linears
        if targets is None or any(matches_target(linear.name, t) for t in targets)
    ]
    per_layer = [linear for linear in matched if linear.count > 1]
    layers = max((linear.count for linear in per_layer), default=0)
    once = [linear for linear in matched if linear.count == 1]
    order = [linear for _ in range(layers) for linear in per_layer] + once
    rank = workload.lora_rank
    return tuple(rank * size for linear in order for size in (linear.fan_in, linear.fan_out))


def _math_note(arch: Arch, kernel: str, gqa: str) -> str:
    """What the answer says when sdpa runs torch's math backend (`gqa_kind`)."""
    if kernel != "fused":
        return ""
    if arch.sdpa_math:
        return (
            f"{arch.model_type} hands sdpa one key head without enable_gqa, which no fused "
            "kernel takes: torch's math backend runs, keeping fp32 scores per layer"
        )
    if gqa == "math":
        return (
            "sdpa gets grouped kv heads with enable_gqa where no mask is needed, which only "
            "flash takes, in fp16 / bf16 from compute capability 8.0: here torch's math "
            "backend runs, keeping fp32 scores per such layer"
        )
    return ""


def _attention(arch: Arch, requested: str) -> tuple[str, str]:
    """The kernel transformers would run, and a note when it differs from the request."""
    effective = requested
    if effective == "flash_attention_2" and arch.model_type in NO_FLASH:
        effective = "sdpa"
    if effective == "sdpa" and arch.model_type in NO_SDPA:
        effective = "eager"
    note = ""
    if effective != requested:
        note = f"{arch.model_type} does not support {requested} in transformers: {effective} runs"
    return _KERNEL[effective], note
