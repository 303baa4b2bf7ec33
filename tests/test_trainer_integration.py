"""Plans applied through the HF Trainer, PEFT and TRL: same training, less memory.

Each run trains a tiny random-init model for 3 steps (dropout 0, fp32, same
seed and data order) with the plan's merged TrainingArguments and
`CheckpointPlanCallback`.  Every tier must give the no-checkpointing run's
loss at every step and the same final weights, with HF's own checkpointing on
exactly when the plan says, the planned hooks present at every step and gone
after training.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from ckpt_core import CheckpointConflictError, Plan, make_plan
from ckpt_core._hooks.install import is_hf_checkpointing_enabled, is_hooked
from ckpt_core.integrations.hf import (
    CheckpointPlanCallback,
    PlanConflictWarning,
    apply_plan,
    hf_checkpointing_planned,
    merge_training_arguments,
)
from tests._tiny_models import tiny_batch, tiny_model

STEPS = 3
RTOL, ATOL = 1e-5, 1e-6
# (tier, transformers_version): 5.15.0 predates every_n_layers, so its medium
# plan turns HF off and asks for medium hooks - the other way medium can run.
PLANS = [("full", None), ("medium", None), ("selective", None), ("medium", "5.15.0")]
PLAN_IDS = ["full", "medium-hf", "selective", "medium-hooks"]
LORA_TARGETS = ["q_proj", "v_proj"]


@dataclass
class Run:
    """What one training run produced and what was seen while it ran."""

    losses: list[float]
    weights: dict[str, torch.Tensor]
    hf_on_per_step: list[bool] = field(default_factory=list)
    hooked_per_step: list[int] = field(default_factory=list)
    hooked_after: int = 0
    moved: float = 0.0  # largest change of a trained weight: proves training happened
    callback: CheckpointPlanCallback | None = None
    trained_model: Any = None


class _Observe(TrainerCallback):
    """Records, at every step, HF's checkpointing flag and how many modules are hooked."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        self.run.hf_on_per_step.append(is_hf_checkpointing_enabled(model))
        self.run.hooked_per_step.append(sum(is_hooked(m) for m in model.modules()))


class _Rows(torch.utils.data.Dataset):
    """Three tiny padded batches as six rows (the Trainer re-batches them by two)."""

    def __init__(self, arch: str, config: Any) -> None:
        batches = [tiny_batch(arch, config, seed=seed) for seed in range(STEPS)]
        self.rows = [{k: v[i] for k, v in b.items()} for b in batches for i in range(2)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]


def user_kwargs(out: Path, **extra: Any) -> dict[str, Any]:
    """A worker's own TrainingArguments kwargs: 3 logged steps on CPU, nothing saved.

    SGD, not Adam: Adam divides each update by the gradient's running RMS, which
    blows fp32 last-bit noise on near-zero gradients up to ``lr``-sized weight
    differences (seen with T5 under HF's own full checkpointing), hiding the
    comparison; SGD keeps weight differences proportional to gradient differences.
    """
    return {
        "output_dir": str(out),
        "max_steps": STEPS,
        "per_device_train_batch_size": 2,
        "learning_rate": 0.1,
        "optim": "sgd",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
        **extra,
    }


def lora(model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_dropout=0.0, target_modules=LORA_TARGETS))


def trained_weights(model: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def fit(run: Run, trainer: Any, callback: CheckpointPlanCallback) -> Run:
    """Train, then record losses, weights and what is left on the model."""
    before = trained_weights(trainer.model)
    trainer.train()
    run.losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    run.weights = trained_weights(trainer.model)
    run.moved = max((run.weights[n] - w).abs().max().item() for n, w in before.items())
    run.hooked_after = sum(is_hooked(m) for m in trainer.model.modules())
    run.callback = callback
    run.trained_model = trainer.model
    return run


def train_hf(arch: str, plan: Plan, out: Path, *, peft: bool = False) -> Run:
    model = tiny_model(arch, dropout=0.0)
    if peft:
        model = lora(model)
    merged, conflicts = merge_training_arguments(user_kwargs(out), plan)
    assert conflicts == []
    run = Run(losses=[], weights={})
    callback = CheckpointPlanCallback(plan)
    trainer = Trainer(
        model=model,
        args=TrainingArguments(**merged),
        train_dataset=_Rows(arch, model.config),
        callbacks=[callback, _Observe(run)],
    )
    return fit(run, trainer, callback)


def train_trl(plan: Plan, out: Path, *, peft: bool = False) -> Run:
    """TRL's SFTTrainer with its own default gradient_checkpointing=True overridden."""
    import datasets
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    datasets.disable_progress_bar()
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(4, 99, (8,), generator=generator).tolist() for _ in range(2 * STEPS)]
    merged, conflicts = merge_training_arguments(user_kwargs(out, bf16=False), plan)
    assert conflicts == []
    run = Run(losses=[], weights={})
    callback = CheckpointPlanCallback(plan)
    trainer = SFTTrainer(
        model=tiny_model("llama", dropout=0.0),
        args=SFTConfig(**merged),
        train_dataset=datasets.Dataset.from_dict({"input_ids": ids}),
        processing_class=word_tokenizer(),
        peft_config=LoraConfig(r=4, lora_dropout=0.0, target_modules=LORA_TARGETS)
        if peft
        else None,
        callbacks=[callback, _Observe(run)],
    )
    return fit(run, trainer, callback)


@functools.cache
def word_tokenizer() -> Any:
    """A 100-word tokenizer built in memory (SFTTrainer needs one; nothing is downloaded)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(100)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="w3")),
        pad_token="w0",
        bos_token="w1",
        eos_token="w2",
        unk_token="w3",
    )


def assert_same_training(run: Run, baseline: Run) -> None:
    assert len(run.losses) == STEPS
    torch.testing.assert_close(
        torch.tensor(run.losses), torch.tensor(baseline.losses), rtol=RTOL, atol=ATOL
    )
    assert run.weights.keys() == baseline.weights.keys()
    for name, weight in run.weights.items():
        torch.testing.assert_close(weight, baseline.weights[name], rtol=RTOL, atol=ATOL, msg=name)


def assert_plan_applied(run: Run, plan: Plan) -> None:
    """HF on exactly when planned; the planned hooks at every step; nothing left after."""
    assert run.hf_on_per_step == [hf_checkpointing_planned(plan)] * STEPS
    report = run.callback.report if run.callback else None
    if plan.hooks is None:
        assert report is None
        assert run.hooked_per_step == [0] * STEPS
    else:
        assert report is not None and report.count > 0
        assert run.hooked_per_step == [report.count] * STEPS
        assert run.callback is not None and run.callback.removed == report.count
    assert run.hooked_after == 0


@functools.cache
def _baseline(kind: str, arch: str, out: Path) -> Run:
    off = make_plan("off")
    if kind == "trl":
        return train_trl(off, out)
    if kind == "trl-peft":
        return train_trl(off, out, peft=True)
    return train_hf(arch, off, out, peft=kind == "peft")


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer_out")


@pytest.mark.parametrize(("tier", "version"), PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_trainer_tier_trains_like_no_checkpointing(
    arch: str, tier: str, version: str | None, out_dir: Path
) -> None:
    plan = make_plan(tier, transformers_version=version)
    run = train_hf(arch, plan, out_dir)
    baseline = _baseline("hf", arch, out_dir)
    assert baseline.hf_on_per_step == [False] * STEPS
    assert baseline.moved > 1e-3, "the model must actually train"
    assert_same_training(run, baseline)
    assert_plan_applied(run, plan)


@pytest.mark.parametrize(("tier", "version"), PLANS, ids=PLAN_IDS)
def test_peft_lora_tier_trains_like_no_checkpointing(
    tier: str, version: str | None, out_dir: Path
) -> None:
    plan = make_plan(tier, transformers_version=version)
    run = train_hf("llama", plan, out_dir, peft=True)
    assert_same_training(run, _baseline("peft", "llama", out_dir))
    assert_plan_applied(run, plan)
    assert all(".lora_" in name for name in run.weights)
    if run.callback and run.callback.report:  # hooks went on the PEFT-wrapped model
        assert all(n.startswith("base_model.model.") for n in run.callback.report.hooked)


@pytest.mark.parametrize(("tier", "version"), PLANS, ids=PLAN_IDS)
def test_trl_sft_tier_trains_like_no_checkpointing(
    tier: str, version: str | None, out_dir: Path
) -> None:
    plan = make_plan(tier, transformers_version=version)
    run = train_trl(plan, out_dir)
    baseline = _baseline("trl", "llama", out_dir)
    assert baseline.hf_on_per_step == [False] * STEPS  # TRL's default ON was overridden
    assert_same_training(run, baseline)
    assert_plan_applied(run, plan)


@pytest.mark.parametrize("tier", ["full", "selective"])
def test_trl_sft_with_peft_config_hooks_the_model_trl_wrapped(tier: str, out_dir: Path) -> None:
    """TRL wraps the model with PEFT inside SFTTrainer.__init__: hooks must land on that."""
    plan = make_plan(tier)
    run = train_trl(plan, out_dir, peft=True)
    assert type(run.trained_model).__name__ == "PeftModel"
    assert_same_training(run, _baseline("trl-peft", "llama", out_dir))
    assert_plan_applied(run, plan)


def test_callback_logs_what_it_hooked_and_removed(
    out_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ckpt_core.integrations.hf")
    run = train_hf("llama", make_plan("selective"), out_dir)
    assert run.callback is not None and run.callback.report is not None
    text = caplog.text
    assert all(name in text for name in run.callback.report.hooked)
    assert f"removed {run.callback.report.count} hooks" in text


def test_callback_refuses_args_that_contradict_the_plan(out_dir: Path) -> None:
    """HF on while the plan wants selective hooks would nest recomputation: stop at begin."""
    model = tiny_model("llama", dropout=0.0)
    args = TrainingArguments(**user_kwargs(out_dir), activation_checkpointing=True)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=_Rows("llama", model.config),
        callbacks=[CheckpointPlanCallback(make_plan("selective"))],
    )
    with pytest.raises(CheckpointConflictError, match="merge_training_arguments"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_callback_removes_only_the_hooks_it_installed(out_dir: Path) -> None:
    """Hooks the worker put on before training are the worker's: they stay."""
    model = tiny_model("llama", dropout=0.0)
    ours = apply_plan(model, make_plan("selective"))
    assert ours is not None and ours.count == 3
    callback = CheckpointPlanCallback(make_plan("selective"))
    merged, _ = merge_training_arguments(user_kwargs(out_dir), callback.plan)
    trainer = Trainer(
        model=model,
        args=TrainingArguments(**merged),
        train_dataset=_Rows("llama", model.config),
        callbacks=[callback],
    )
    trainer.train()
    assert callback.report is not None
    assert (callback.report.count, callback.report.already_installed, callback.removed) == (0, 3, 0)
    assert sum(is_hooked(m) for m in model.modules()) == 3


def test_apply_plan_hooks_only_what_the_plan_asks() -> None:
    model = tiny_model("llama")
    assert apply_plan(model, make_plan("full")) is None  # HF's own checkpointing does it
    assert not any(is_hooked(m) for m in model.modules())
    report = apply_plan(model, make_plan("selective"))
    assert report is not None
    assert report.hooked == tuple(f"model.layers.{i}.self_attn" for i in range(3))


def test_apply_plan_refuses_hooks_under_hf_checkpointing() -> None:
    model = tiny_model("llama")
    model.activation_checkpointing_enable()
    with pytest.raises(CheckpointConflictError):
        apply_plan(model, make_plan("selective"))


# --- merge_training_arguments -------------------------------------------------


def test_merge_keeps_user_keys_and_takes_checkpointing_from_the_plan() -> None:
    plan = make_plan("selective")
    user = {"learning_rate": 3e-4, "gradient_checkpointing": True}
    with pytest.warns(PlanConflictWarning, match="gradient_checkpointing=True"):
        merged, conflicts = merge_training_arguments(user, plan)
    assert merged == {"learning_rate": 3e-4, **plan.training_arguments}
    assert [(c.key, c.user_value, c.plan_key, c.plan_value) for c in conflicts] == [
        ("gradient_checkpointing", True, "activation_checkpointing", False)
    ]
    assert user == {"learning_rate": 3e-4, "gradient_checkpointing": True}  # not modified


def test_merge_renames_the_same_meaning_without_a_conflict() -> None:
    plan = make_plan("full")
    user = {
        "gradient_checkpointing": True,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
    }
    merged, conflicts = merge_training_arguments(user, plan)
    assert conflicts == []
    assert merged == plan.training_arguments
    merged["activation_checkpointing_kwargs"]["use_reentrant"] = True
    assert plan.training_arguments["activation_checkpointing_kwargs"]["use_reentrant"] is False


def test_merge_reports_kwargs_the_plan_changes_or_drops() -> None:
    reentrant = {"activation_checkpointing_kwargs": {"use_reentrant": True}}
    with pytest.warns(PlanConflictWarning):
        _, changed = merge_training_arguments(reentrant, make_plan("full"))
    assert [(c.key, c.plan_value) for c in changed] == [
        ("activation_checkpointing_kwargs", {"use_reentrant": False})
    ]
    with pytest.warns(PlanConflictWarning, match="dropped"):
        merged, dropped = merge_training_arguments(reentrant, make_plan("off"))
    assert [(c.key, c.plan_key) for c in dropped] == [("activation_checkpointing_kwargs", None)]
    assert "activation_checkpointing_kwargs" not in merged


def test_merge_uses_the_old_names_for_old_transformers() -> None:
    plan = make_plan("full", transformers_version="4.57.0")
    merged, conflicts = merge_training_arguments({"activation_checkpointing": True}, plan)
    assert conflicts == []
    assert merged == plan.training_arguments
    assert set(merged) == {"gradient_checkpointing", "gradient_checkpointing_kwargs"}


@pytest.mark.parametrize(("tier", "hf_on"), [("off", False), ("selective", False), ("full", True)])
def test_merged_kwargs_override_trl_default_on(tier: str, hf_on: bool, tmp_path: Path) -> None:
    from trl import SFTConfig

    assert SFTConfig.__dataclass_fields__["gradient_checkpointing"].default is True
    merged, _ = merge_training_arguments(user_kwargs(tmp_path, bf16=False), make_plan(tier))
    config = SFTConfig(**merged)
    assert config.activation_checkpointing is hf_on
    assert config.gradient_checkpointing is hf_on


def test_example_finetune_tiny_runs_every_tier_with_the_same_losses() -> None:
    import os
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[1] / "examples" / "finetune_tiny.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(example), "--steps", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for tier in ("full", "medium", "selective"):
        assert f"{tier} vs off: same losses" in done.stdout
    assert "model.layers.0.self_attn" in done.stdout  # the selective hooks are listed
