"""Measure the activation memory of a model by running it on the meta device.

`measure_activation_bytes` runs ONE training forward pass (input ids of shape
``(micro_batch_size, seq_len)``, labels = the ids, decoder input ids of the
same shape for an encoder-decoder, ``use_cache=False``, an attention mask
with padding for a padded batch, the model cast to the workload dtype) and
counts the bytes autograd keeps for the backward pass at the end of it: the
unique storages packed by a ``torch.autograd.graph.saved_tensors_hooks`` pack
hook that are still held by the graph, parameters and buffers excluded
(docs/design.md §5, ``activation_bytes``).  A checkpointed region's own saves go through the
checkpoint's inner hooks and are not kept; the inputs it keeps for
recomputation are saved (non-reentrant checkpoint's ``_NoopSaveInputs``) under
the outer hook and so are counted - the hooks pass every tensor positionally.

Only the forward runs: ``activation_bytes`` is defined at the end of forward,
and a backward on meta would add time, not information.

On meta, `ckpt_core._meta.stand_ins` makes the forward keep what a GPU forward
keeps (fused attention, CUDA dropout masks) and answers transformers'
data-dependent mask checks (packed sequences, sdpa mask skipping) as for the
input it feeds, padded or not.

Importing this module loads no torch: everything is imported inside functions.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from ckpt_core._errors import (
    CheckpointConflictError,
    InvalidGranularityError,
    InvalidWorkloadError,
)
from ckpt_core._meta.stand_ins import (
    FLASH_STAND_IN,
    meta_kernels,
    no_data_dependent_mask_checks,
    register_flash_stand_in,
)
from ckpt_core._planning.gpus import flash_sdpa
from ckpt_core._planning.tiers import CONCRETE_TIERS
from ckpt_core._planning.workload import Workload

if TYPE_CHECKING:
    import torch
    from torch import nn


_DTYPES: Final[dict[str, str]] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def measure_activation_bytes(
    model: nn.Module,
    granularity: str | None,
    *,
    seq_len: int,
    micro_batch_size: int,
    dtype: str = "bf16",
    attention: str = "sdpa",
    padded: bool = False,
    block_plan: Any = None,
    gpu: str | None = None,
) -> int:
    """Bytes autograd keeps at the end of one training forward of ``model``.

    ``granularity``: ``None`` / ``"off"``, ``"selective"``, ``"medium"`` or
    ``"full"``, or ``"blocks"`` with ``block_plan`` (a `Plan.block_plan`).
    Hooks for it are installed if the model has none (and removed
    afterwards); a model already hooked for exactly that granularity is used
    as is.  The model is cast to ``dtype`` (``bf16`` / ``fp16`` / ``fp32``,
    honouring ``_keep_in_fp32_modules``) and put in training mode for the run,
    then restored.  ``attention``: ``sdpa`` / ``flash_attention_2`` (fused) or
    ``eager``; an architecture without sdpa support runs eager, as
    transformers would.  ``padded``: the batch comes with an attention mask
    with padding (the last token of the first row), so transformers builds the
    masks a padded batch gets.  ``gpu``: the GPU-table name of the GPU it models; one
    without sdpa's flash kernel (compute capability below 8.0) runs grouped heads with
    the math backend (None: one that has it).  Raises `InvalidWorkloadError` for bad sizes,
    `InvalidGranularityError` for a bad granularity or a model hooked for
    another one, `CheckpointConflictError` when HF's checkpointing is on.
    """
    import torch

    level = "blocks" if granularity == "blocks" else _parse_granularity(granularity)
    workload = Workload(
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        dtype=dtype,
        attention=attention,
        padded=padded,
    )
    _check_positions(model, workload.seq_len)
    on_meta = _device(model).type == "meta"
    effective = effective_attention(model, workload.attention)
    implementation = _run_implementation(model, effective, on_meta)
    torch_dtype = getattr(torch, _DTYPES[workload.dtype])
    with contextlib.ExitStack() as stack:
        stack.enter_context(_cast(model, torch_dtype))
        stack.enter_context(_attention_implementation(model, implementation, on_meta))
        stack.enter_context(_hooks(model, level, block_plan))
        stack.enter_context(_training(model))
        if on_meta:
            stack.enter_context(no_data_dependent_mask_checks(padded=workload.padded))
            flash = effective == "flash_attention_2"
            stack.enter_context(meta_kernels(flash=flash, flash_gqa=flash_sdpa(gpu)))
        return _kept_bytes(model, workload)


def effective_attention(model: nn.Module, attention: str) -> str:
    """The implementation transformers would run for ``attention`` on this model.

    sdpa on an architecture without sdpa support (Gemma 2: softcapping) falls
    back to eager, as transformers does by default; flash on one without flash
    support uses sdpa (and so eager where neither is supported).
    """
    cls = _pretrained_class(model)
    if attention == "flash_attention_2" and not getattr(cls, "_supports_flash_attn", False):
        attention = "sdpa"
    if attention == "sdpa" and not getattr(cls, "_supports_sdpa", False):
        return "eager"
    return attention


def _pretrained_class(model: nn.Module) -> type:
    """The transformers model class inside wrappers (PEFT): it says what attention it supports."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            return type(module)
    return type(model)


def _run_implementation(model: nn.Module, implementation: str, on_meta: bool) -> str:
    """What to set on the config: on meta, flash runs a registered fused stand-in.

    Models that route attention through transformers' AttentionInterface get
    the stand-in; the others (Falcon) run their sdpa branch, whose kernel the
    meta stand-in replaces without keeping a mask.
    """
    if not on_meta or implementation != "flash_attention_2":
        return implementation
    uses_interface = getattr(_pretrained_class(model), "_can_set_attn_implementation", bool)()
    return FLASH_STAND_IN if uses_interface else "sdpa"


def _check_positions(model: nn.Module, seq_len: int) -> None:
    """Learned absolute positions (GPT-2, BERT) end at their table: longer is an error.

    On meta an out-of-range index goes unnoticed, so the check is made here.
    """
    from torch import nn

    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        learned = isinstance(module, nn.Embedding) and leaf in ("wpe", "position_embeddings")
        if learned and seq_len > module.num_embeddings:
            raise InvalidWorkloadError(
                f"seq_len {seq_len} is longer than the model's learned positions "
                f"({module.num_embeddings}, {name})",
                field="workload.seq_len",
            )


def _parse_granularity(granularity: object) -> str:
    value = "off" if granularity is None else granularity
    if isinstance(value, str) and value.strip().lower() in CONCRETE_TIERS:
        return value.strip().lower()
    raise InvalidGranularityError(
        f"granularity must be None or one of {', '.join(CONCRETE_TIERS)}; got {granularity!r}",
        field="granularity",
    )


def _device(model: nn.Module) -> torch.device:
    import torch

    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


# --- the forward and the count --------------------------------------------------


class _Kept:
    """What the pack hook hands autograd: alive exactly as long as the graph holds it."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _storage_key(tensor: torch.Tensor) -> tuple[int, int]:
    """Identity and size of a tensor's storage (views share it; works on meta too)."""
    storage = tensor.untyped_storage()
    return storage._cdata, storage.nbytes()


def _kept_bytes(model: nn.Module, workload: Workload) -> int:
    """Run the forward under a pack hook; sum the storages the graph still holds."""
    import torch

    excluded = {_storage_key(t)[0] for t in (*model.parameters(), *model.buffers())}
    kept: weakref.WeakSet[_Kept] = weakref.WeakSet()

    def pack(tensor: torch.Tensor) -> _Kept:
        holder = _Kept(tensor)
        kept.add(holder)
        return holder

    def unpack(holder: _Kept) -> torch.Tensor:
        return holder.tensor

    shape = (workload.micro_batch_size, workload.seq_len)
    ids = torch.zeros(shape, dtype=torch.long, device=_device(model))
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        outputs = model(**_inputs(model, ids, padded=workload.padded))
    loss = outputs["loss"]  # holds the graph; everything else may go
    del outputs
    storages = dict(_storage_key(holder.tensor) for holder in list(kept))
    del loss
    return sum(size for key, size in storages.items() if key not in excluded)


def _inputs(model: nn.Module, ids: torch.Tensor, *, padded: bool) -> dict[str, Any]:
    """Input ids with labels (the loss path counts); no KV cache where the model has one;
    for a ``padded`` batch, an attention mask that pads the first row's last token.

    An encoder-decoder also gets decoder input ids of the ids' shape, in a
    tensor of their own, as a seq2seq collator passes them: otherwise the
    model shifts the labels right itself, which needs
    ``decoder_start_token_id`` (T5's ``_shift_right`` fails without one) only
    to write token values, and values change no memory.  The shifted ids
    would be a new tensor of the same shape and dtype, so the bytes are the
    same either way.  Its labels are a tensor of their own too (the target
    sequence, not the input), which its loss keeps.
    """
    import torch

    # A PEFT model passes keyword arguments on to the model it wraps, whose forward says
    # which it takes (its own signature is ``**kwargs``).
    get_base_model = getattr(model, "get_base_model", None)
    wrapped = get_base_model() if callable(get_base_model) else model
    parameters = inspect.signature(wrapped.forward).parameters
    inputs: dict[str, Any] = {"input_ids": ids, "labels": ids}
    if "use_cache" in parameters:
        inputs["use_cache"] = False
    if "decoder_input_ids" in parameters:
        inputs["decoder_input_ids"] = torch.zeros_like(ids)
        inputs["labels"] = torch.zeros_like(ids)
    if padded:
        mask = torch.ones_like(ids)
        mask[0, -1] = 0
        inputs["attention_mask"] = mask
    return inputs


# --- temporary changes to the model, each restored ------------------------------


@contextlib.contextmanager
def _cast(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Cast floating parameters and buffers to ``dtype`` like ``from_pretrained(dtype=)``.

    Modules in ``_keep_in_fp32_modules_strict`` (and ``_keep_in_fp32_modules``
    under fp16) stay fp32, as transformers keeps them.  When some parameters
    are frozen (an adapter model such as PEFT's LoRA), the trainable ones keep
    their dtype: PEFT keeps adapters in fp32 on purpose.  Original dtypes are
    restored afterwards (on meta this costs nothing).
    """
    import torch

    keep = _keep_fp32_pattern(model, dtype)
    adapters = not all(p.requires_grad for p in model.parameters())
    originals: list[tuple[torch.Tensor, torch.dtype]] = []
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if not tensor.is_floating_point() or (adapters and tensor.requires_grad):
            continue
        target = torch.float32 if keep is not None and keep.search(name) else dtype
        if tensor.dtype != target:
            originals.append((tensor, tensor.dtype))
            tensor.data = tensor.data.to(target)
    try:
        yield
    finally:
        for tensor, original in originals:
            tensor.data = tensor.data.to(original)


def _keep_fp32_pattern(model: nn.Module, dtype: torch.dtype) -> re.Pattern[str] | None:
    """The names ``from_pretrained`` keeps in fp32, matched as its loader does: each entry
    (``*`` a wildcard) searched in the parameter's name (``gate.weight``: the router's)."""
    import torch

    keep = set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == torch.float16:
        keep |= set(getattr(model, "_keep_in_fp32_modules", None) or ())
    if dtype == torch.float32 or not keep:
        return None
    return re.compile("|".join(entry.replace("*", ".*") for entry in sorted(keep)))


@contextlib.contextmanager
def _attention_implementation(
    model: nn.Module, implementation: str, on_meta: bool
) -> Iterator[None]:
    """Set the attention implementation on every config in the model, then restore it."""
    if implementation == FLASH_STAND_IN:
        register_flash_stand_in()
    elif implementation == "flash_attention_2" and not on_meta:
        import torch

        if not torch.cuda.is_available():
            raise InvalidWorkloadError(
                "flash_attention_2 needs CUDA; measure sdpa on CPU or on the meta device",
                field="workload.attention",
            )
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    saved = {key: getattr(c, "_attn_implementation_internal", None) for key, c in configs.items()}
    for config in configs.values():
        config._attn_implementation_internal = implementation
    try:
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation_internal = saved[key]


@contextlib.contextmanager
def _hooks(model: nn.Module, granularity: str, block_plan: Any = None) -> Iterator[None]:
    """Make the model carry exactly ``granularity``'s hooks for the run.

    Hooks this call installs are removed afterwards; hooks the caller had
    installed for the same granularity are used and kept.
    """
    from ckpt_core._hooks.install import (
        install_checkpoint_hooks,
        is_hf_checkpointing_enabled,
        is_hooked,
        remove_checkpoint_hooks,
    )

    if is_hf_checkpointing_enabled(model):
        raise CheckpointConflictError(
            "HF activation checkpointing is on for this model; the measurement applies "
            "the tier itself: turn it off first (model.activation_checkpointing_disable())",
            field="granularity",
        )
    if granularity == "off":
        hooked = sum(1 for module in model.modules() if is_hooked(module))
        if hooked:
            raise InvalidGranularityError(
                f"the model carries checkpoint hooks on {hooked} modules; "
                "measure 'off' on a model without hooks",
                field="granularity",
            )
        yield
        return
    report = install_checkpoint_hooks(model, granularity, block_plan=block_plan)
    try:
        foreign = [f"{name} ({why})" for name, why in report.skipped if why != "already hooked"]
        if foreign:
            raise InvalidGranularityError(
                f"the model carries checkpoint hooks that {granularity!r} does not place "
                f"({', '.join(foreign[:3])}); remove them first",
                field="granularity",
            )
        yield
    finally:
        remove_checkpoint_hooks(model, report.hooked)


@contextlib.contextmanager
def _training(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.train()
    try:
        yield
    finally:
        model.train(was_training)
