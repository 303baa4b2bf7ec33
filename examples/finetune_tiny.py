"""Fine-tune a tiny Llama for a few steps on CPU with every checkpointing tier.

For each tier: ask ckpt_core for the plan, merge its TrainingArguments kwargs
into the worker's own, train with `CheckpointPlanCallback` (which installs the
planned hooks after the Trainer is set up and removes them at the end), and
print the plan, the hooked modules and the loss of every step.  The losses
are the same for every tier: checkpointing trades compute for memory, never
results.

The model is built from a config (random weights): nothing is downloaded.

    python examples/finetune_tiny.py [--steps 4] [--service http://host:8000]
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PrinterCallback, Trainer, TrainingArguments
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging as hf_logging

from ckpt_core import Plan, make_plan
from ckpt_core.integrations.hf import CheckpointPlanCallback, merge_training_arguments

TIERS = ("off", "full", "medium", "selective")
VOCAB, SEQ_LEN, BATCH = 128, 32, 4


def tiny_llama() -> LlamaForCausalLM:
    """Four layers of 64 hidden units, GQA, no dropout: same start for every tier."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        attention_dropout=0.0,
    )
    return LlamaForCausalLM(config)


def dataset(steps: int) -> list[dict[str, torch.Tensor]]:
    """Random token rows; labels are the inputs (HF shifts them for causal LM)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (steps * BATCH, SEQ_LEN), generator=generator)
    return [{"input_ids": row, "labels": row} for row in ids]


def plan_for(tier: str, service: str | None) -> Plan:
    if service is None:
        return make_plan(tier)
    from ckpt_core.client import CkptClient

    with CkptClient(service) as client:
        answer = client.resolve(tier)
    print(f"  (plan from the {answer.source})")
    return answer.value


def hf_checkpointed(model: torch.nn.Module) -> list[str]:
    """The layers HF's own checkpointing wraps (its per-layer flag, left on after training)."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing
    ]


def train(tier: str, steps: int, service: str | None) -> list[float]:
    plan = plan_for(tier, service)
    print(f"\n== tier {tier}: {plan.description}")
    print(f"  TrainingArguments: {plan.training_arguments}")
    print(f"  hooks to install:  {plan.hooks or 'none'}")
    worker_kwargs: dict[str, Any] = {
        "max_steps": steps,
        "per_device_train_batch_size": BATCH,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
    }
    callback = CheckpointPlanCallback(plan)
    with tempfile.TemporaryDirectory() as out:
        merged, _ = merge_training_arguments({**worker_kwargs, "output_dir": out}, plan)
        trainer = Trainer(
            model=tiny_llama(),
            args=TrainingArguments(**merged),
            train_dataset=dataset(steps),
            callbacks=[callback],
        )
        trainer.remove_callback(PrinterCallback)  # we print the losses ourselves
        trainer.train()
    hooked = callback.report.hooked if callback.report else ()
    print(f"  hooked modules:    {', '.join(hooked) or 'none'}")
    print(f"  HF checkpoints:    {', '.join(hf_checkpointed(trainer.model)) or 'nothing'}")
    print(f"  hooks removed after training: {callback.removed}")
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print("  loss per step:     " + "  ".join(f"{loss:.6f}" for loss in losses))
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--service", help="ask the ckpt-advisor service at this URL")
    args = parser.parse_args()
    hf_logging.set_verbosity_error()  # keep the output to what this example prints
    losses = {tier: train(tier, args.steps, args.service) for tier in TIERS}
    baseline = torch.tensor(losses["off"])
    print()
    for tier in TIERS[1:]:
        same = torch.allclose(torch.tensor(losses[tier]), baseline, rtol=1e-5, atol=1e-6)
        print(f"{tier:>9} vs off: {'same losses' if same else 'DIFFERENT losses'}")


if __name__ == "__main__":
    main()
