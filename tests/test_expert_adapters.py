"""PEFT's LoRA on MoE experts: the estimate against PEFT's own model.

On transformers 5 an MoE layer's experts are stacked 3-D tensors and its router a
module of its own; PEFT maps the names of the linear modules they replaced (in
``target_modules`` or ``all-linear``) onto them, adapting each stacked weight with a
parametrization that rebuilds it whole every forward.  These run the real PEFT model
(tiny configs, real tensors on CPU: the parametrization turns autocast off, which the
meta device does not support) and compare what the estimate says with what autograd
keeps and what PEFT trains.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from ckpt_core import InvalidWorkloadError
from ckpt_core._memory.activations import activation_bytes
from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
from ckpt_core._meta.measure import measure_activation_bytes
from tests._tiny_models import as_loaded, tiny_model

TIERS = ("off", "selective", "medium", "full")
# The names PEFT maps onto the experts' gate_up_proj (two), down_proj and the router.
EXPERT_NAMES = {
    "mixtral": ["w1", "w3", "w2", "gate"],
    "qwen3_moe": ["gate_proj", "up_proj", "down_proj", "gate"],
    "olmoe": ["gate_proj", "up_proj", "down_proj", "gate"],
    "glm4_moe": ["gate_proj", "up_proj", "down_proj", "gate"],
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _peft_model(arch: str, dtype: str, targets: list[str] | None) -> tuple[Any, dict[str, Any]]:
    from peft import LoraConfig, get_peft_model

    model = as_loaded(tiny_model(arch, num_layers=2, attn_implementation="eager"), DTYPES[dtype])
    config = json.loads(model.config.to_json_string())
    lora = LoraConfig(r=4, target_modules=targets or "all-linear", lora_dropout=0.0)
    peft_model = get_peft_model(model, lora)
    peft_model.enable_input_require_grads()
    return peft_model, config


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("experts", ["gate_up", "all"])
@pytest.mark.parametrize("arch", list(EXPERT_NAMES))
def test_expert_adapters_are_estimated_as_peft_trains_them(
    arch: str, experts: str, dtype: str
) -> None:
    """Each adapted stacked weight keeps the rebuilt weight (for its input's gradient)
    and, when the fp32 factors are cast to a half weight's dtype, those copies; the
    grouped matmul keeps its input rows for the weight's gradient; the router keeps its
    rebuilt weight and its input; GLM-4.5's shared experts and dense layers lose their
    adapters, since PEFT takes their names for the experts.  ``all``: PEFT's
    ``all-linear`` (attention, experts, router).  Trained parameters and kept bytes to
    the byte, every tier."""
    names = EXPERT_NAMES[arch]
    targets = None if experts == "all" else ["q_proj", *names[:2]]
    peft_model, config = _peft_model(arch, dtype, targets)
    shape = {"seq_len": 16, "micro_batch_size": 2, "attention": "eager", "dtype": dtype}
    workload = {**shape, "method": "lora", "lora_rank": 4, "lora_targets": targets}
    run = prepare(model_facts({"config": config}), parse_workload(workload))
    trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert run.static.trainable_parameters == trained
    for tier in TIERS:
        measured = measure_activation_bytes(peft_model, tier, **shape)
        assert activation_bytes(run.facts.arch, run.step, tier) == measured, tier


def test_all_linear_on_qwen3_moe_needs_checkpointing_attention_only_does_not() -> None:
    """Qwen3-30B-A3B, LoRA, one H200, seq 4096: PEFT's ``all-linear`` rebuilds each
    layer's stacked experts (1.2 GB in bf16) and keeps them, so no checkpointing no
    longer fits; LoRA on attention alone still does."""
    from ckpt_core import make_plan

    workload = {"seq_len": 4096, "micro_batch_size": 1, "method": "lora"}
    attention = ["q_proj", "k_proj", "v_proj", "o_proj"]
    model = {"preset": "qwen3-30b-a3b"}
    every = make_plan("auto", gpu="H200", model=model, workload=workload).estimate
    alone = make_plan(
        "auto", gpu="H200", model=model, workload={**workload, "lora_targets": attention}
    ).estimate
    assert every is not None and alone is not None
    assert alone["tiers"]["off"]["fits"] and not every["tiers"]["off"]["fits"]
    assert every["chosen"]["blocks_checkpointed"] > 0


@pytest.mark.parametrize("arch", list(EXPERT_NAMES))
def test_one_of_a_fused_pair_is_refused_as_peft_refuses_it(arch: str) -> None:
    """gate and up are one stacked tensor: PEFT refuses to adapt it for one of them, and
    the estimate names the field and the missing target."""
    from peft import LoraConfig, get_peft_model

    first, second = EXPERT_NAMES[arch][:2]
    model = tiny_model(arch, num_layers=2)  # GLM-4.5's first layer is dense
    with pytest.raises(ValueError, match=second):
        get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", first]))
    config = json.loads(model.config.to_json_string())
    workload = {"seq_len": 16, "method": "lora", "lora_targets": ["q_proj", first]}
    with pytest.raises(InvalidWorkloadError, match=second) as raised:
        prepare(model_facts({"config": config}), parse_workload(workload))
    assert raised.value.field == "workload.lora_targets"
