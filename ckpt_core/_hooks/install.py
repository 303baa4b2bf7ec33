"""Install, inspect and remove activation-checkpointing hooks on a model.

The hook replaces nothing on the class: it sets an instance attribute
``forward = functools.partial(_checkpointed_forward, module)``.  A partial of a
module-level function survives what trainers do to models:

- ``copy.deepcopy`` rebinds the partial's ``module`` through deepcopy's memo, so
  a reference / EMA copy runs its OWN weights (a closure over the original bound
  method would keep running the original's, docs/design.md §7.7);
- ``pickle`` and ``torch.save(model)`` store it by qualified name.

Module hooks stay outside the checkpointed region: ``nn.Module.__call__`` runs
them once and then calls ``forward``, exactly like HF's own
``GradientCheckpointingLayer``, which checkpoints ``forward`` rather than
``__call__``.  Parameter names and ``state_dict`` keys never change.

Inside the region (training and grad enabled only):

- every tensor argument, however deeply nested in args / kwargs, is passed to
  ``torch.utils.checkpoint.checkpoint`` POSITIONALLY: non-reentrant checkpoint
  saves accelerator RNG state only for devices of positional tensors, and HF
  calls attention with keyword arguments only (docs/design.md §7.9);
- KV caches (``transformers.Cache`` instances, recognised by type because the
  keyword is ``cache`` / ``past_key_values`` / ``past_key_value`` /
  ``layer_past`` depending on the version) are replaced by None and a truthy
  ``use_cache`` becomes False, as HF's ``GradientCheckpointingLayer`` does in
  training: otherwise recomputation would update the cache a second time.

Nothing here imports torch or transformers at import time.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ckpt_core._errors import CheckpointConflictError, InvalidGranularityError
from ckpt_core._hooks.blocks import (
    Blocks,
    counted_blocks,
    every_nth_block,
    find_attention,
    find_blocks,
)
from ckpt_core._planning.block_plan import BlockPlan
from ckpt_core._planning.tiers import GRANULARITIES

# What the hooks install: a tier's granularity, or a block-level plan's block set.
HOOK_GRANULARITIES = (*GRANULARITIES, "blocks")

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from torch import nn

# A forward that was already an instance attribute before we hooked (e.g.
# accelerate's device-placement hook) is kept here and called as the original.
_PREV_FORWARD = "_ckpt_prev_forward"


@dataclass(frozen=True)
class HookReport:
    """What ``install_checkpoint_hooks`` did; ``dataclasses.asdict`` gives JSON.

    ``hooked`` lists the modules wrapped by THIS call (names as in
    ``model.named_modules()``), ``count`` its length.  ``blocks`` / ``stacks``
    are every transformer block and block container found.  ``skipped`` pairs a
    module that was a target with the reason it was not wrapped;
    ``already_installed`` counts targets a previous install had wrapped.
    """

    granularity: str
    hooked: tuple[str, ...]
    blocks: tuple[str, ...]
    stacks: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    already_installed: int = 0
    count: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", len(self.hooked))

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        return asdict(self)


# --- the checkpointed forward -------------------------------------------------


def _original_forward(module: nn.Module) -> Callable[..., Any]:
    """The forward the hook stands in for: a saved instance forward, else the class's."""
    previous = module.__dict__.get(_PREV_FORWARD)
    if previous is not None:
        return previous
    return type(module).forward.__get__(module, type(module))


@functools.cache
def _cache_class() -> type | None:
    """``transformers.Cache`` (looked up once: this runs on every hooked forward)."""
    try:
        from transformers import Cache
    except ImportError:  # no transformers: there is no HF cache to protect
        return None
    return Cache


def _call_rebuilt(
    forward: Callable[..., Any],
    template: list[Any],
    tensor_positions: list[int],
    spec: Any,
    *tensors: Any,
) -> Any:
    """Put ``tensors`` back where they came from and call ``forward`` (runs inside the region)."""
    from torch.utils import _pytree as pytree

    rebuilt = list(template)
    for position, tensor in zip(tensor_positions, tensors, strict=True):
        rebuilt[position] = tensor
    args, kwargs = pytree.tree_unflatten(rebuilt, spec)
    return forward(*args, **kwargs)


def _run_checkpointed(forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run ``forward`` under non-reentrant checkpoint, tensors positional, caches off."""
    import torch
    import torch.utils.checkpoint as torch_checkpoint
    from torch.utils import _pytree as pytree

    cache_cls = _cache_class()

    def is_cache(value: Any) -> bool:
        return cache_cls is not None and isinstance(value, cache_cls)

    if kwargs.get("use_cache"):
        kwargs = {**kwargs, "use_cache": False}
    leaves, spec = pytree.tree_flatten((args, kwargs), is_leaf=is_cache)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i] for i in positions]
    # The template holds neither the tensors (checkpoint owns those) nor the cache.
    slots = set(positions)
    template = [None if is_cache(leaf) or i in slots else leaf for i, leaf in enumerate(leaves)]
    function = functools.partial(_call_rebuilt, forward, template, positions, spec)
    return torch_checkpoint.checkpoint(function, *tensors, use_reentrant=False)


def _checkpointed_forward(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
    """The hooked ``forward``: checkpoint in training with grad, else the original as is."""
    import torch

    forward = _original_forward(module)
    if not (module.training and torch.is_grad_enabled()):
        return forward(*args, **kwargs)  # eval / no_grad: no backward, nothing to save
    return _run_checkpointed(forward, args, kwargs)


# --- installing and removing --------------------------------------------------


def is_hooked(module: nn.Module) -> bool:
    """Whether ``module`` carries a checkpoint hook from this module."""
    forward = module.__dict__.get("forward")
    return isinstance(forward, functools.partial) and forward.func is _checkpointed_forward


def _hook(module: nn.Module) -> None:
    previous = module.__dict__.get("forward")
    if previous is not None:
        module.__dict__[_PREV_FORWARD] = previous
    module.forward = functools.partial(_checkpointed_forward, module)


def _unhook(module: nn.Module) -> None:
    del module.__dict__["forward"]
    previous = module.__dict__.pop(_PREV_FORWARD, None)
    if previous is not None:
        module.__dict__["forward"] = previous


def is_hf_checkpointing_enabled(model: nn.Module) -> bool:
    """Whether HF's own activation checkpointing is on anywhere in ``model``.

    Same test as ``PreTrainedModel.is_activation_checkpointing`` (any module
    whose ``gradient_checkpointing`` flag is set), but over ``model.modules()``
    so it sees through PEFT and other wrappers that are not PreTrainedModels.
    """
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def _validate(granularity: object, block_plan: object) -> tuple[str, BlockPlan | None]:
    normalised = granularity.strip().lower() if isinstance(granularity, str) else None
    if normalised not in HOOK_GRANULARITIES:
        raise InvalidGranularityError(
            f"granularity must be one of {', '.join(HOOK_GRANULARITIES)}; got {granularity!r}",
            field="granularity",
        )
    if (normalised == "blocks") != (block_plan is not None):
        raise InvalidGranularityError(
            "granularity 'blocks' needs block_plan (the plan's block_plan), and only it does",
            field="block_plan",
        )
    plan = None if block_plan is None else BlockPlan.from_value(block_plan)
    return normalised, plan


def _targets(
    model: nn.Module, blocks: Blocks, granularity: str, plan: BlockPlan | None
) -> list[tuple[str, nn.Module]]:
    """The modules ``granularity`` wraps, in module order."""
    if granularity == "full":
        return [item for stack in blocks.values() for item in stack]
    if granularity == "medium":
        return every_nth_block(model, blocks, 2)
    if plan is not None:
        return _planned(model, blocks, plan)
    return [
        (f"{block_name}.{attn_name}", attn)
        for stack in blocks.values()
        for block_name, block in stack
        for attn_name, attn in find_attention(block)
    ]


def _planned(model: nn.Module, blocks: Blocks, plan: BlockPlan) -> list[tuple[str, nn.Module]]:
    """A block plan's full blocks, and the attention module(s) of its selective blocks."""
    counted, total = counted_blocks(model, blocks)
    if total != plan.blocks:
        raise InvalidGranularityError(
            f"the block plan is for a model of {plan.blocks} blocks; this one has {total} "
            "(plan for the model you train)",
            field="block_plan.blocks",
        )
    full, selective = set(plan.full), set(plan.selective)
    targets: list[tuple[str, nn.Module]] = []
    for counter, name, block in counted:
        if counter in full:
            targets.append((name, block))
        elif counter in selective:
            targets += [(f"{name}.{attn}", module) for attn, module in find_attention(block)]
    return targets


def _hooked_names(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if is_hooked(module)]


def _skip_reason(name: str, hooked: list[str]) -> str | None:
    """Why wrapping ``name`` would nest checkpoint regions, or None when it would not."""
    for other in hooked:
        if name.startswith(other + ".") or other == "":
            return f"inside hooked module {other!r}"
        if other.startswith(name + ".") or name == "":
            return f"contains hooked module {other!r}"
    return None


def install_checkpoint_hooks(
    model: nn.Module,
    granularity: str,
    *,
    allow_nested: bool = False,
    block_plan: BlockPlan | Mapping[str, Any] | None = None,
) -> HookReport:
    """Wrap the modules of ``granularity`` in non-reentrant activation checkpointing.

    ``"full"``: every transformer block of every stack.  ``"medium"``: every
    other block, the layers HF's ``every_n_layers=2`` picks.  ``"selective"``:
    the outermost attention module(s) of every block.  ``"blocks"``: a
    block-level plan, ``block_plan`` (`Plan.block_plan`): its full blocks whole
    and the attention module(s) of its selective blocks, blocks numbered by
    HF's cross-stack counter; refused on a model with another block count.

    Idempotent: a module already hooked is left alone and counted in
    ``already_installed``; one inside or around a hooked module is skipped
    (that would nest recomputation).  Raises ``InvalidGranularityError`` for an
    unknown granularity and ``CheckpointConflictError`` when HF's own
    checkpointing is on (hooks would recompute inside HF's recomputation: more
    compute, no memory saved) unless ``allow_nested`` is true.
    """
    granularity, plan = _validate(granularity, block_plan)
    if not allow_nested and is_hf_checkpointing_enabled(model):
        raise CheckpointConflictError(
            "HF activation checkpointing is already on for this model; hooks on top "
            "would recompute inside its recomputation (more compute, no memory saved). "
            "Turn it off (model.activation_checkpointing_disable()) or pass allow_nested=True.",
            field="granularity",
        )
    blocks = find_blocks(model)
    hooked_before = _hooked_names(model)
    hooked: list[str] = []
    skipped: list[tuple[str, str]] = []
    already = 0
    for name, module in _targets(model, blocks, granularity, plan):
        if is_hooked(module):
            already += 1
            skipped.append((name, "already hooked"))
            continue
        reason = _skip_reason(name, hooked_before)
        if reason is not None:
            skipped.append((name, reason))
            continue
        _hook(module)
        hooked.append(name)
    return HookReport(
        granularity=granularity,
        hooked=tuple(hooked),
        blocks=tuple(name for stack in blocks.values() for name, _ in stack),
        stacks=tuple(blocks),
        skipped=tuple(skipped),
        already_installed=already,
    )


def install_selective_hooks(model: nn.Module, granularity: str) -> int:
    """Seed-compatible entry point: install hooks, return how many modules were wrapped.

    Same rules as ``install_checkpoint_hooks`` (so a second call returns 0 and
    an unknown granularity raises a ``ValueError``).
    """
    return install_checkpoint_hooks(model, granularity).count


def remove_checkpoint_hooks(model: nn.Module, names: Iterable[str] | None = None) -> int:
    """Remove the hooks this module installed on ``model``; return how many.

    ``names`` (as in ``HookReport.hooked``) limits removal to those modules, so
    a caller can undo exactly its own install and leave others' hooks alone.
    Each module gets back exactly the forward it had: the class's, or the
    instance forward that was there before the hook.
    """
    wanted = None if names is None else set(names)
    removed = 0
    for name, module in model.named_modules():
        if is_hooked(module) and (wanted is None or name in wanted):
            _unhook(module)
            removed += 1
    return removed
