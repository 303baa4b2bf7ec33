"""make_plan with a model and a workload: the estimate, model-aware auto, and its errors.

auto must be monotonic (more GPU memory never a costlier plan; at a shorter
sequence it never costs more than the longer sequence's plan would there), its
plan must fit and cost no more than any tier that fits, and when nothing fits
the alternatives it names must really fit.  Without a model nothing changes.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from ckpt_core import InvalidWorkloadError, ModelConfigError, load_preset, make_plan
from ckpt_core._memory.alternatives import SEQ_UNIT
from ckpt_core._planning.tiers import auto_granularity_by_memory
from tests._auto_rule import assert_auto_rule

TIERS = ("off", "selective", "medium", "full")
CASES = [
    ({"preset": "llama-3.1-8b"}, {"seq_len": 4096}),
    ({"preset": "qwen2.5-0.5b"}, {"seq_len": 8192, "micro_batch_size": 4}),
    ({"preset": "qwen3-30b-a3b"}, {"seq_len": 2048, "method": "qlora"}),
    ({"preset": "phi-3-mini"}, {"seq_len": 4096, "attention": "eager", "method": "lora"}),
]


def plan(tier: str = "auto", gpu_memory_gb: float | None = 80.0, **kwargs: Any) -> Any:
    return make_plan(tier, gpu_memory_gb, **kwargs)


def ratio(result: Any) -> float:
    return result.estimate["chosen"]["recompute_flops_ratio"]


@pytest.mark.parametrize(("model", "workload"), CASES)
def test_more_gpu_memory_never_gives_a_costlier_plan(model: dict, workload: dict) -> None:
    costs = [
        ratio(plan(gpu_memory_gb=gib, model=model, workload=workload))
        for gib in (8, 16, 24, 40, 48, 80, 96, 141, 192, 400, 1000)
    ]
    assert costs == sorted(costs, reverse=True)
    assert len(set(costs)) > 1  # the sweep crosses at least one boundary


@pytest.mark.parametrize(("model", "workload"), CASES)
def test_a_shorter_sequence_never_costs_more_than_the_longer_ones_plan(
    model: dict, workload: dict
) -> None:
    from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
    from ckpt_core._memory.search import cheapest_fit, evaluate, tier_candidates

    budget = int(48 * 2**30 * 0.9)
    chosen = []
    for seq in (256, 1024, 2048, 4096, 8192, 16384, 32768):
        run = prepare(model_facts(model), parse_workload({**workload, "seq_len": seq}))
        a, step, peak = run.facts.arch, run.step, run.peak
        chosen.append((run, cheapest_fit(a, step, peak, budget, tier_candidates(a, step, peak))))
    for (short, here), (_, longer) in itertools.pairwise(chosen):
        if longer is None:
            continue
        a, step, peak = short.facts.arch, short.step, short.peak
        theirs = evaluate(a, step, peak, longer.counts)
        assert theirs.memory.peak_bytes <= budget  # what fits a longer sequence fits this one
        assert here is not None and here.ratio <= theirs.ratio


@pytest.mark.parametrize(("model", "workload"), CASES)
@pytest.mark.parametrize("gib", [24, 80, 141])
def test_the_chosen_plan_fits_and_no_cheaper_tier_does(
    model: dict, workload: dict, gib: int
) -> None:
    result = plan(gpu_memory_gb=gib, model=model, workload=workload)
    tiers, chosen = result.estimate["tiers"], result.estimate["chosen"]
    if "nothing fits" in result.reason:
        assert result.granularity == "full" and chosen["granularity"] == "full"
        assert not any(row["fits"] for row in tiers.values()) and chosen["fits"] is False
        return
    budget = gib * 2**30 * (1 - result.estimate["assumptions"]["headroom"])
    assert chosen["fits"] and chosen["peak_bytes"] <= budget
    assert chosen["granularity"] == (result.granularity or "off")
    assert_auto_rule(tiers, chosen)


def test_nothing_fits_says_so_and_its_alternatives_fit() -> None:
    # a 1B model with a 128k vocabulary: the fp32 logits of 64k tokens dominate
    model, workload = {"preset": "llama-3.2-1b"}, {"seq_len": 4096, "micro_batch_size": 16}
    result = plan(gpu_memory_gb=24, model=model, workload=workload)
    assert result.granularity == "full"
    assert "nothing fits" in result.reason and "what would fit" in result.reason
    options = result.estimate["alternatives"]
    assert options and result.estimate["chosen"]["fits"] is False
    for option in options:
        changed = {**workload, **option["changes"]}
        again = plan(gpu_memory_gb=24, model=model, workload=changed)
        assert again.estimate["chosen"]["fits"], option
        assert again.estimate["chosen"]["recompute_flops_ratio"] == option["recompute_flops_ratio"]
        assert again.estimate["chosen"]["peak_bytes"] == option["peak_bytes"]
        factor = option.get("gradient_accumulation_factor", 1)
        assert changed["micro_batch_size"] * factor == workload["micro_batch_size"]
        if "seq_len" in option["changes"]:  # the longest that fits, not a guess
            assert changed["seq_len"] % SEQ_UNIT == 0
            longer = {**changed, "seq_len": changed["seq_len"] + SEQ_UNIT}
            assert "nothing fits" in plan(gpu_memory_gb=24, model=model, workload=longer).reason
    for option in options:  # the frontier: no option closer in every change and cheaper
        for other in options:
            closer = all(
                other["changes"].get(k, workload.get(k)) == v for k, v in option["changes"].items()
            )
            if other is not option and closer and other["changes"] != option["changes"]:
                assert other["recompute_flops_ratio"] > option["recompute_flops_ratio"]


@pytest.mark.parametrize(("method", "bytes_each"), [("qlora", 4), ("lora", 2)])
def test_nothing_fits_for_an_moe_model_says_qlora_leaves_its_experts_unquantized(
    method: str, bytes_each: int
) -> None:
    """transformers stores Mixtral's experts as stacked tensors, which bitsandbytes does not
    quantize: the reason gives their bytes (fp32 after PEFT's kbit preparation)."""
    config = load_preset("mixtral-8x7b")
    experts = (
        config["num_hidden_layers"]
        * config["num_local_experts"]
        * 3  # gate, up and down projections
        * config["hidden_size"]
        * config["intermediate_size"]
    )
    workload = {"seq_len": 4096, "method": method}
    result = plan(gpu_memory_gb=80, model={"preset": "mixtral-8x7b"}, workload=workload)
    assert "nothing fits" in result.reason and result.estimate["alternatives"] == []
    gib = experts * bytes_each / 2**30
    assert f"{gib:.1f} GiB of it the model's expert weights" in result.reason
    assert "bitsandbytes quantizes linear layers only" in result.reason
    dense = plan(gpu_memory_gb=24, model={"preset": "llama-3.1-70b"}, workload=workload)
    assert "nothing fits" in dense.reason and "expert weights" not in dense.reason


def test_without_gpu_memory_auto_is_full_and_says_why() -> None:
    result = plan(gpu_memory_gb=None, model={"preset": "llama-3.2-1b"}, workload={"seq_len": 512})
    assert result.granularity == "full"
    assert "no GPU memory" in result.reason
    assert all(row["fits"] is None for row in result.estimate["tiers"].values())


def test_explicit_tiers_keep_the_tier_and_carry_the_estimate() -> None:
    for tier, granularity in (("off", None), ("selective", "selective"), ("full", "full")):
        result = plan(tier, 24, model={"preset": "llama-3.1-8b"}, workload={"seq_len": 4096})
        assert result.granularity == granularity
        assert set(result.estimate["tiers"]) == set(TIERS)
        assert "does NOT fit" in result.reason  # 8B full fine-tune on 24 GiB


def test_selective_saving_little_is_said_for_fused_attention_only() -> None:
    workload = {"seq_len": 4096}
    fused = plan("selective", model={"preset": "llama-3.1-8b"}, workload=workload)
    eager = plan(
        "selective", model={"preset": "llama-3.1-8b"}, workload={**workload, "attention": "eager"}
    )
    assert "selective saves only" in fused.reason
    assert "selective saves only" not in eager.reason
    tiers = eager.estimate["tiers"]
    assert tiers["selective"]["activation_bytes"] < tiers["off"]["activation_bytes"] / 2


def test_estimate_shape_assumptions_and_json() -> None:
    result = make_plan(
        "medium", gpu="H100-80GB", model={"preset": "gemma-2-9b"}, workload={"seq_len": 2048}
    )
    estimate = result.estimate
    assert set(estimate) == {"assumptions", "tiers", "chosen"}
    assert estimate["chosen"]["granularity"] == "medium"
    assert estimate["chosen"]["peak_bytes"] == estimate["tiers"]["medium"]["peak_bytes"]
    for row in estimate["tiers"].values():
        assert set(row) == {
            "activation_bytes",
            "allocated_bytes",
            "peak_bytes",
            "recompute_flops_ratio",
            "fits",
            "margin_bytes",
            "tight",
            "verdict",
        }
    assumptions = estimate["assumptions"]
    assert assumptions["workload"]["weights"] == "bf16"  # defaults applied
    assert assumptions["workload"]["micro_batch_size"] == 1
    assert assumptions["gpu_memory_gb"] == result.gpu_memory_gb
    assert assumptions["headroom"] == 0.1
    assert assumptions["attention_kernel"] == "eager"  # Gemma 2 has no sdpa in transformers
    assert "gemma2" in assumptions["attention_note"]
    ratios = [estimate["tiers"][t]["recompute_flops_ratio"] for t in TIERS]
    assert ratios[0] == 1.0 and all(r > 1.0 for r in ratios[1:])
    json.dumps(result.to_dict())


@pytest.mark.parametrize("gib", [None, 8, 24, 24.0001, 80, 80.5, 200])
def test_without_a_model_the_seed_thresholds_hold(gib: float | None) -> None:
    result = make_plan("auto", gib)
    assert result.granularity == auto_granularity_by_memory(gib)
    assert result.estimate is None


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ({"seq_len": 0}, "workload.seq_len"),
        ({}, "workload.seq_len"),
        ({"seq_len": 1024, "sequence": 2}, "workload.sequence"),
        ({"seq_len": 1024, "dtype": "int4"}, "workload.dtype"),
        ({"seq_len": 1024, "micro_batch_size": 1.5}, "workload.micro_batch_size"),
        ({"seq_len": 1024, "headroom": 1.5}, "workload.headroom"),
        ({"seq_len": 1024, "method": "qlora", "weights": "bf16"}, "workload.weights"),
        (
            {"seq_len": 1024, "method": "lora", "lora_targets": ["not_a_layer"]},
            "workload.lora_targets",
        ),
        ({"seq_len": 2048}, "workload.seq_len"),  # GPT-2: 1024 learned positions
        ("seq_len=1024", "workload"),
        (None, "workload"),
    ],
)
def test_bad_workloads_are_errors_naming_the_field(workload: Any, field: str) -> None:
    with pytest.raises(InvalidWorkloadError) as raised:
        plan(model={"preset": "gpt2"}, workload=workload)
    assert raised.value.field == field


def test_a_workload_without_a_model_is_an_error() -> None:
    with pytest.raises(ModelConfigError) as raised:
        plan(workload={"seq_len": 1024})
    assert raised.value.field == "model"


def test_a_model_type_without_a_memory_model_is_an_error() -> None:
    config = {
        "model_type": "bloom",
        "hidden_size": 64,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 100,
    }
    with pytest.raises(ModelConfigError) as raised:
        plan(model={"config": config}, workload={"seq_len": 128})
    assert raised.value.field == "model.config.model_type"
    assert "llama" in raised.value.message  # names what is supported


def test_an_inline_config_equal_to_a_preset_gives_the_same_estimate() -> None:
    from ckpt_core._configs.presets import load_preset

    workload = {"seq_len": 2048}
    by_name = plan(model={"preset": "qwen2.5-1.5b"}, workload=workload)
    inline = plan(model={"config": load_preset("qwen2.5-1.5b")}, workload=workload)
    assert inline.estimate == by_name.estimate


def test_a_preset_is_validated_once_and_bad_input_every_time() -> None:
    from unittest import mock

    from ckpt_core import ModelConfigError, UnknownPresetError
    from ckpt_core._configs import model_config
    from ckpt_core._memory.inputs import model_facts

    first = model_facts({"preset": "qwen2.5-0.5b"})
    with mock.patch.object(model_config, "load_model_config") as load:
        assert model_facts({"preset": "qwen2.5-0.5b"}) is first
    assert load.call_count == 0
    for _ in range(2):
        with pytest.raises(UnknownPresetError):
            model_facts({"preset": "qwen2.5-0.5b-typo"})
        with pytest.raises(ModelConfigError):  # more than a name: validated as given
            model_facts({"preset": "qwen2.5-0.5b", "config": {"model_type": "qwen2"}})
