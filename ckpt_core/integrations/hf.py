"""Apply a `Plan` to HuggingFace training: Trainer callback, TrainingArguments merge.

A plan has two halves and a worker needs both:

1. TrainingArguments kwargs (HF's own checkpointing on or explicitly off):
   `merge_training_arguments` folds them into the worker's kwargs; the plan
   wins for the checkpointing keys and every user value it overrides is
   reported, because a silently ignored ``gradient_checkpointing=True`` is how
   jobs end up checkpointing twice or not at all.  FSDP plans also set ``fsdp``
   and the keys of ``fsdp_config`` they decide (``activation_checkpointing``,
   resharding, offload); the worker's other ``fsdp_config`` keys are kept.
2. Hooks (``plan.hooks``: selective, medium on releases without
   ``every_n_layers``, or a block-level plan's ``blocks`` with
   ``plan.block_plan``): `CheckpointPlanCallback` installs them at train begin
   on the model the Trainer actually trains - after PEFT wrapping (TRL wraps
   inside ``SFTTrainer.__init__``) and after the Trainer has switched its own
   checkpointing on or off, before the first step - and removes them at train
   end.  `apply_plan` does the same for a custom training loop.

Works with `transformers.Trainer` and TRL's ``SFTTrainer`` / ``SFTConfig``
(whose ``gradient_checkpointing`` defaults to True: the merged kwargs always
set the flag explicitly, so off and selective really are off in HF).
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from ckpt_core._errors import CheckpointConflictError
from ckpt_core._hooks.install import (
    HookReport,
    install_checkpoint_hooks,
    is_hf_checkpointing_enabled,
    remove_checkpoint_hooks,
)
from ckpt_core._plan import Plan

if TYPE_CHECKING:
    from torch import nn
    from transformers import TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger(__name__)

# Both generations of the TrainingArguments field names, by role.
_ON_KEYS = ("activation_checkpointing", "gradient_checkpointing")
_KWARGS_KEYS = ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")
CHECKPOINTING_KEYS: tuple[str, ...] = _ON_KEYS + _KWARGS_KEYS


class PlanConflictWarning(UserWarning):
    """A checkpointing value the worker set was overridden by the plan."""


@dataclass(frozen=True, slots=True)
class Conflict:
    """One user checkpointing setting the plan overrides.

    ``plan_value`` is what the plan sets for the same role (under the plan's
    field name ``plan_key``); ``None`` with ``plan_key`` ``None`` means the
    plan drops the setting (e.g. checkpointing kwargs when HF is off).
    """

    key: str
    user_value: Any
    plan_key: str | None
    plan_value: Any

    def __str__(self) -> str:
        target = f"{self.plan_key}={self.plan_value!r}" if self.plan_key else "dropped"
        return f"{self.key}={self.user_value!r} overridden by the plan ({target})"


def merge_training_arguments(
    user_kwargs: Mapping[str, Any], plan: Plan
) -> tuple[dict[str, Any], list[Conflict]]:
    """The worker's TrainingArguments kwargs with the plan's checkpointing keys.

    Every checkpointing key of either generation (``activation_checkpointing*``
    and ``gradient_checkpointing*``) is taken from the plan only, under the
    plan's names (which match the worker's transformers version).  A user value
    that means something else than the plan is returned as a `Conflict` and
    warned about (`PlanConflictWarning`); the same meaning under the other
    generation's name is silently renamed.  ``user_kwargs`` is not modified.
    """
    merged = {k: copy.deepcopy(v) for k, v in user_kwargs.items() if k not in CHECKPOINTING_KEYS}
    merged.update(copy.deepcopy(plan.training_arguments))
    conflicts = [
        conflict
        for key in CHECKPOINTING_KEYS
        if key in user_kwargs
        and (conflict := _conflict(key, user_kwargs[key], plan.training_arguments)) is not None
    ]
    conflicts += _merge_fsdp(user_kwargs, plan.training_arguments, merged)
    for conflict in conflicts:
        warnings.warn(str(conflict), PlanConflictWarning, stacklevel=2)
    return merged, conflicts


def _merge_fsdp(
    user_kwargs: Mapping[str, Any], plan_kwargs: Mapping[str, Any], merged: dict[str, Any]
) -> list[Conflict]:
    """FSDP plans: the plan's ``fsdp`` and ``fsdp_config`` keys win, the user's other keys stay.

    An ``fsdp_config`` given as a path to a JSON file is read, as TrainingArguments would.
    """
    if "fsdp_config" not in plan_kwargs:
        return []
    conflicts = []
    user_fsdp = user_kwargs.get("fsdp")
    if user_fsdp not in (None, False, "") and user_fsdp != plan_kwargs["fsdp"]:
        conflicts.append(Conflict("fsdp", user_fsdp, "fsdp", plan_kwargs["fsdp"]))
    user_config = user_kwargs.get("fsdp_config") or {}
    if isinstance(user_config, str):
        import json
        from pathlib import Path

        user_config = json.loads(Path(user_config).read_text(encoding="utf-8"))
    # TrainingArguments strips a leading "fsdp_" from the keys: compare in its names.
    user_config = {k.removeprefix("fsdp_"): copy.deepcopy(v) for k, v in user_config.items()}
    plan_config = plan_kwargs["fsdp_config"]
    conflicts += [
        Conflict(f"fsdp_config.{key}", value, f"fsdp_config.{key}", plan_config[key])
        for key, value in user_config.items()
        if key in plan_config and value != plan_config[key]
    ]
    merged["fsdp_config"] = {**user_config, **copy.deepcopy(plan_config)}
    return conflicts


def _conflict(key: str, user_value: Any, plan_kwargs: Mapping[str, Any]) -> Conflict | None:
    """The conflict of one user key with the plan's value for the same role, if any."""
    role = _KWARGS_KEYS if key in _KWARGS_KEYS else _ON_KEYS
    plan_key = next((name for name in role if name in plan_kwargs), None)
    plan_value = plan_kwargs.get(plan_key) if plan_key else None
    if _same(user_value, plan_value, role is _ON_KEYS):
        return None
    return Conflict(key, user_value, plan_key, plan_value)


def _same(user_value: Any, plan_value: Any, is_flag: bool) -> bool:
    if is_flag:
        # None (the field's default) means off in TrainingArguments.
        return bool(user_value) == bool(plan_value) and isinstance(user_value, bool | None)
    return (user_value or None) == (plan_value or None)


def hf_checkpointing_planned(plan: Plan) -> bool:
    """Whether the plan turns HF's own checkpointing on (either field generation)."""
    return any(plan.training_arguments.get(key) is True for key in _ON_KEYS)


def apply_plan(model: nn.Module, plan: Plan) -> HookReport | None:
    """Install the hooks the plan asks for on ``model``; ``None`` when it asks for none.

    Call it on the model that is trained (the PEFT-wrapped one), before the
    first step.  HF's half of the plan (full, medium with ``every_n_layers``)
    comes from TrainingArguments; in a custom loop call
    ``model.activation_checkpointing_enable(...)`` for it.  Raises
    `CheckpointConflictError` when hooks are planned but HF's checkpointing is
    on (nested recomputation).
    """
    if plan.hooks is None:
        return None
    return install_checkpoint_hooks(model, plan.hooks, block_plan=plan.block_plan)


def remove_hooks(model: nn.Module, report: HookReport | None) -> int:
    """Remove exactly the hooks `report` installed (others, e.g. the user's, stay)."""
    if report is None:
        return 0
    return remove_checkpoint_hooks(model, report.hooked)


class CheckpointPlanCallback(TrainerCallback):
    """Apply a plan inside ``Trainer.train()``: check HF's flag, hook, unhook.

    At train begin it verifies that HF's own checkpointing is on exactly when
    the plan says (the TrainingArguments must come from
    `merge_training_arguments`), installs the planned hooks and logs them; at
    train end it removes the hooks it installed.  ``report`` holds the last
    install's `HookReport` (``None`` when the plan needs no hooks).

    The Trainer skips ``on_train_end`` when training raises; a worker that
    keeps using the model after a failed run calls
    ``remove_hooks(model, callback.report)`` itself.
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.report: HookReport | None = None
        self.removed = 0

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        model = _require_model(model)
        _check_hf_flag(model, self.plan)
        self.report = apply_plan(model, self.plan)
        self.removed = 0
        log.info("ckpt plan %s: %s", self.plan.granularity or "off", _summary(self.report))

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        self.removed = remove_hooks(_require_model(model), self.report)
        if self.report is not None:
            log.info("ckpt plan %s: removed %d hooks", self.plan.granularity, self.removed)


def _require_model(model: nn.Module | None) -> nn.Module:
    if model is None:
        raise TypeError("CheckpointPlanCallback needs the Trainer's model (model=...)")
    return model


def _check_hf_flag(model: nn.Module, plan: Plan) -> None:
    """HF checkpointing on exactly when the plan says, or a clear error before step 1."""
    planned = hf_checkpointing_planned(plan)
    actual = is_hf_checkpointing_enabled(model)
    if planned == actual:
        return
    state = "on" if actual else "off"
    wanted = "on" if planned else "off"
    raise CheckpointConflictError(
        f"HF activation checkpointing is {state} but plan {plan.granularity or 'off'!r} wants it "
        f"{wanted}: build TrainingArguments from merge_training_arguments(kwargs, plan) "
        "and do not enable checkpointing on the model yourself",
        field="training_arguments",
    )


def _summary(report: HookReport | None) -> str:
    if report is None:
        return "no hooks (HF's own checkpointing or none)"
    names = ", ".join(report.hooked) or "none new"
    text = f"hooked {report.count} {report.granularity} modules: {names}"
    if report.already_installed:
        text += f" ({report.already_installed} were already hooked)"
    return text
