"""bench/gpu_step.py on CPU: argument handling, the row it writes, and the no-CUDA exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import gpu_step
from bench._gpu_rows import (
    estimate_row,
    load_rows,
    prepared_run,
    replayed_segments,
    workload_of,
)
from ckpt_core._configs.model_config import load_model_config
from ckpt_core._memory.inputs import model_facts

ARGS = ["--model", "llama-3.2-1b", "--seq-len", "1024", "--batch", "2", "--out", "rows.json"]
MEASURED = {
    "peak_allocated_mib": 5000.0,
    "peak_reserved_mib": 5600.0,
    "cuda_context_mib": 500.0,
    "process_mib": 6100.0,
    "resident_before_step_mib": 2400.0,
    "trainable_params": 1,
}


def test_defaults_and_choices() -> None:
    args = gpu_step.parse_args(ARGS)
    assert (args.tier, args.hooks, args.method, args.attention) == (
        "full",
        "project",
        "lora",
        "sdpa",
    )
    assert args.lora_rank == 32
    llama = dict(load_model_config({"preset": "llama-3.2-1b"}).config)
    assert gpu_step.lora_targets_of(args, llama) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    bert = dict(load_model_config({"preset": "bert-base-uncased"}).config)
    assert gpu_step.lora_targets_of(args, bert) == [
        "query",
        "key",
        "value",
        "attention.output.dense",
    ]
    full = gpu_step.parse_args([*ARGS, "--method", "full"])
    assert full.lora_rank is None and gpu_step.lora_targets_of(full, llama) is None


@pytest.mark.parametrize(
    "extra",
    [
        ["--tier", "medium", "--hooks", "hf"],  # HF's checkpointing has no medium
        ["--tier", "most"],
        ["--tier", "blocks:"],
        ["--tier", "blocks:half"],
        ["--tier", "blocks:4", "--hooks", "hf"],
        ["--batch", "0"],
        ["--attention", "flash"],
        ["--method", "qlora", "--load-path", "to_device"],  # bitsandbytes quantizes on load
        ["--load-path", "cpu"],
        ["--quantization", "int8"],  # only with --method qlora
        ["--method", "qlora", "--quantization", "fp4"],
        ["--optimizer", "sgd"],  # the harness steps torch's AdamW only
        ["--method", "full", "--lora-rank", "8"],  # a full fine-tune has no adapters
        ["--method", "full", "--lora-targets", "q_proj"],
        ["--lora-rank", "0"],
    ],
)
def test_bad_arguments_are_refused(extra: list[str]) -> None:
    with pytest.raises(SystemExit) as error:
        gpu_step.parse_args(ARGS + extra)
    assert error.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the step would run")
def test_without_cuda_it_says_so_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "rows.json"
    assert gpu_step.main([*ARGS[:-1], str(out)]) == gpu_step.NO_CUDA
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("method", "tier", "attention", "quantization"),
    [
        ("qlora", "full", "eager", "nf4"),
        ("qlora", "medium", "sdpa", "int8"),
        ("lora", "medium", "sdpa", "nf4"),
        ("full", "off", "eager", "nf4"),
    ],
)
def test_the_row_round_trips_through_gpu_truth(
    tmp_path: Path, method: str, tier: str, attention: str, quantization: str
) -> None:
    """The row has the shared schema; gpu_truth's loader maps it back to the same workload."""
    extra = ["--method", method, "--tier", tier, "--attention", attention, "--dtype", "fp16"]
    extra += ["--quantization", quantization] if method == "qlora" else []
    args = gpu_step.parse_args(ARGS + extra)
    config = dict(load_model_config({"preset": "llama-3.2-1b"}).config)
    row = gpu_step.build_row(args, config, MEASURED, "NVIDIA H200", {"torch": "x"})
    assert set(row) >= {"model_id", "gpu", "run", "measured", "predicted", "model_config"}
    gpu_step.append_row(tmp_path / "rows.json", row)
    gpu_step.append_row(tmp_path / "rows.json", row)  # appended, and an exact repeat is dropped
    (loaded,) = load_rows([tmp_path])
    assert json.loads(json.dumps(row))["measured"] == loaded["measured"]
    workload = workload_of(loaded)
    assert workload["method"] == method and workload["attention"] == attention
    assert workload.get("weights") == (quantization if method == "qlora" else None)
    assert workload["dtype"] == "fp16"  # a full fine-tune's AdamW keeps fp16 states here
    assert ("lora_rank" in workload) == (method != "full")
    assert workload["seq_len"] == 1024 and workload["micro_batch_size"] == 2
    assert workload["load_path"] == "device_map"  # from_pretrained(device_map=...), the default
    estimate = estimate_row(loaded)
    assert row["predicted"]["process_mib"] == estimate["peak_bytes"] / gpu_step.MIB
    assert row["model_config"]["num_kv_heads"] == config["num_key_value_heads"]


def test_a_block_level_row_is_estimated_as_that_plan(tmp_path: Path) -> None:
    """--tier blocks:K: the row names the plan, and its prediction is that plan's, between
    the tiers that checkpoint every block and none; a budget gives it a verdict."""
    config = dict(load_model_config({"preset": "llama-3.2-1b"}).config)

    def row(tier: str) -> dict[str, Any]:
        args = gpu_step.parse_args([*ARGS, "--tier", tier])
        built = gpu_step.build_row(args, config, MEASURED, "NVIDIA H200", {"torch": "x"})
        gpu_step.append_row(tmp_path / tier.replace(":", "-") / "rows.json", built)
        return built

    off, half, full = row("off"), row("blocks:8"), row("full")
    predicted = [r["predicted"]["allocated_mib"] for r in (off, half, full)]
    assert predicted[0] > predicted[1] > predicted[2]
    (loaded,) = load_rows([tmp_path / "blocks-8"])
    assert loaded["run"]["tier"] == "blocks:8" and estimate_row(loaded) == estimate_row(half)
    plan = gpu_step.block_plan_of("blocks:8", config)
    assert len(plan.full) == 8 and not plan.selective
    peak = estimate_row(half)["peak_bytes"]
    assert estimate_row(half, peak + 2**30)["verdict"] == "fits"
    assert estimate_row(half, peak // 2)["verdict"] == "does_not_fit"


def test_a_row_with_its_pool_is_set_against_the_replays_segments() -> None:
    """measured.segments_mib: gpu_truth lists the row's large segments next to the
    replay's, whose sizes add up to the estimate's reserved peak (process memory less
    the CUDA context)."""
    from bench.gpu_truth import segment_lines

    config = dict(load_model_config({"preset": "llama-3.2-1b"}).config)
    args = gpu_step.parse_args([*ARGS, "--tier", "blocks:12", "--method", "full"])
    measured = {**MEASURED, "segments_mib": [2.0, 20.0, 1002.0, 4000.0]}
    row = gpu_step.build_row(args, config, measured, "NVIDIA H100 80GB HBM3", {"torch": "x"})
    replayed = replayed_segments(row)
    context = prepared_run(row).context[0]
    assert sum(replayed) + context == estimate_row(row)["peak_bytes"]
    head, mine, theirs = segment_lines([row, {**row, "measured": MEASURED}])
    assert "4 segments measured" in head and f"{len(replayed)} replayed" in head
    assert mine.split() == ["measured", "4000,", "1002,", "20"]  # large pool, largest first
    largest = max(replayed) / 2**20
    assert theirs.split()[0] == "replayed" and theirs.split()[1] == f"{largest:.0f},"


def test_a_block_count_the_model_has_not_is_refused_before_the_gpu(
    capsys: pytest.CaptureFixture,
) -> None:
    assert gpu_step.main([*ARGS, "--tier", "blocks:17"]) == 2  # llama-3.2-1b has 16 blocks
    assert "from 0 to 16" in capsys.readouterr().err


def test_a_padded_row_is_estimated_as_a_padded_batch() -> None:
    args = gpu_step.parse_args([*ARGS, "--tier", "off", "--padded"])
    config = dict(load_model_config({"preset": "llama-3.2-1b"}).config)
    padded = gpu_step.build_row(args, config, MEASURED, "NVIDIA H200", {"torch": "x"})
    args.padded = False
    plain = gpu_step.build_row(args, config, MEASURED, "NVIDIA H200", {"torch": "x"})
    assert workload_of(padded)["padded"] and not workload_of(plain)["padded"]
    assert padded["predicted"]["allocated_mib"] > plain["predicted"]["allocated_mib"]


def _off_rows(flag: str, values: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """qwen2.5-1.5b's off-tier row for each value of one harness option, keyed by it; each
    row's workload says the value it was recorded with."""
    config = dict(load_model_config({"preset": "qwen2.5-1.5b"}).config)
    rows = {
        value: gpu_step.build_row(
            gpu_step.parse_args([*ARGS, "--tier", "off", f"--{flag.replace('_', '-')}", value]),
            config,
            MEASURED,
            "NVIDIA H200",
            {"torch": "x"},
        )
        for value in values
    }
    assert {workload_of(row)[flag] for row in rows.values()} == set(values)
    return rows


def test_a_row_loaded_and_moved_is_estimated_as_such() -> None:
    """--load-path to_device: the row says so, and the estimate replays that load."""
    rows = _off_rows("load_path", ("device_map", "to_device"))
    moved, mapped = rows["to_device"]["predicted"], rows["device_map"]["predicted"]
    assert moved["allocated_mib"] == pytest.approx(mapped["allocated_mib"], rel=1e-3)
    assert moved["process_mib"] != mapped["process_mib"]  # the same tensors in another pool


def test_a_fused_adamw_row_is_estimated_as_such() -> None:
    """--optimizer adamw_fused: the row says so, and its prediction is the fused step's
    (off peaks in the backward, where the fused step's only trace is its step counts: a
    512 B block per adapter tensor on the GPU)."""
    rows = _off_rows("optimizer", ("adamw", "adamw_fused"))
    foreach, fused = rows["adamw"]["predicted"], rows["adamw_fused"]["predicted"]
    adapters = 2 * 4 * 28  # A and B of q, k, v, o in qwen2.5-1.5b's 28 layers
    assert (fused["allocated_mib"] - foreach["allocated_mib"]) * 2**20 == 512 * adapters


def test_the_sweep_covers_every_tier_of_three_families_at_two_lengths(
    capsys: pytest.CaptureFixture,
) -> None:
    from bench import gpu_sweep

    assert gpu_sweep.main(["--dry"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 * 2 * 4
    for tier in ("off", "selective", "medium", "full"):
        assert sum(f"--tier {tier} " in line for line in lines) == 6
    families = {load_model_config({"preset": p}).config["model_type"] for p in gpu_sweep.PRESETS}
    assert len(families) == 3
    assert not any("--padded" in line for line in lines)
    assert gpu_sweep.main(["--dry", "--padded", "--tiers", "off"]) == 0
    padded = capsys.readouterr().out.splitlines()
    assert len(padded) == 3 * 2 and all(line.endswith(" --padded") for line in padded)
    assert gpu_step.parse_args(padded[0].split()[1:]).padded
    recipe = ["--method", "qlora", "--quantization", "int8", "--tiers", "full"]
    assert gpu_sweep.main(["--dry", *recipe]) == 0
    args = gpu_step.parse_args(capsys.readouterr().out.splitlines()[0].split()[1:])
    assert (args.method, args.quantization, args.load_path) == ("qlora", "int8", "device_map")
    assert gpu_sweep.main(["--dry", "--load-path", "to_device", "--tiers", "off"]) == 0
    moved = capsys.readouterr().out.splitlines()
    assert gpu_step.parse_args(moved[0].split()[1:]).load_path == "to_device"
    encoders = ["--presets", "t5-base,bert-base-uncased", "--seqs", "512", "--tiers", "off"]
    assert gpu_sweep.main(["--dry", "--method", "full", *encoders]) == 0
    full = [gpu_step.parse_args(line.split()[1:]) for line in capsys.readouterr().out.splitlines()]
    assert [(a.model, a.method, a.lora_rank) for a in full] == [
        ("t5-base", "full", None),
        ("bert-base-uncased", "full", None),
    ]


TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}


@pytest.mark.parametrize("padded", [False, True])
def test_the_step_recipe_runs_on_cpu_and_every_tier_gives_the_same_loss(
    tmp_path: Path, padded: bool
) -> None:
    """The build / prepare / step path the GPU run takes, on CPU with a tiny model."""
    weights = gpu_step.saved_random_weights(TINY, tmp_path / "weights", torch.float32)
    built = (weights / "config.json").stat().st_mtime_ns
    losses = {}
    for tier in ("off", "selective", "medium", "full", "blocks:1"):
        args = gpu_step.parse_args(["--model", "tiny", "--seq-len", "16", "--out", "x.json"])
        args.tier, args.dtype = tier, "fp32"
        torch.manual_seed(0)  # the same adapter initialisation for every tier
        model = gpu_step.prepared_model(args, TINY, weights, "cpu")
        trainable = [p for p in model.parameters() if p.requires_grad]
        assert trainable and all(
            "lora_" in n for n, p in model.named_parameters() if p.requires_grad
        )
        optimizer = torch.optim.AdamW(trainable)
        ids = torch.arange(32).reshape(2, 16) % TINY["vocab_size"]
        mask = gpu_step.padding_mask(ids) if padded else None
        losses[tier] = [gpu_step.training_step(model, optimizer, ids, mask) for _ in range(2)]
    assert (weights / "config.json").stat().st_mtime_ns == built  # built once, reused
    for tier, values in losses.items():
        assert values == pytest.approx(losses["off"], rel=1e-5), tier
    assert losses["off"][1] != losses["off"][0]  # the optimizer stepped the adapters


@pytest.mark.parametrize("preset", ["bert-base-uncased", "t5-base"])
def test_an_encoder_family_row_is_estimated_as_its_own_model(preset: str) -> None:
    """BERT's and T5's rows: the sizes read as the estimate reads them (T5's d_model,
    both stacks), LoRA on their own attention names, and a prediction for their step."""
    args = gpu_step.parse_args(["--model", preset, "--seq-len", "512", "--out", "x.json"])
    config = dict(load_model_config({"preset": preset}).config)
    row = gpu_step.build_row(args, config, MEASURED, "NVIDIA H200", {"torch": "x"})
    facts = model_facts({"preset": preset}).arch
    assert row["model_config"]["hidden_size"] == facts.hidden
    assert row["model_config"]["num_layers"] == facts.encoder_layers + facts.layers
    targets = workload_of(row)["lora_targets"]
    assert targets == gpu_step.lora_targets_of(args, config) != ["q_proj", "k_proj"]
    assert row["predicted"]["allocated_mib"] == estimate_row(row)["allocated_bytes"] / 2**20


TINY_BERT = {
    "model_type": "bert",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}
TINY_T5 = {
    "model_type": "t5",
    "d_model": 64,
    "d_kv": 16,
    "d_ff": 128,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "vocab_size": 128,
}


@pytest.mark.parametrize(
    ("config", "method", "kind"),
    [
        (TINY, "full", "LlamaForCausalLM"),
        (TINY_BERT, "lora", "BertForMaskedLM"),
        (TINY_BERT, "full", "BertForMaskedLM"),
        (TINY_T5, "lora", "T5ForConditionalGeneration"),
    ],
)
def test_a_full_fine_tune_and_the_encoder_families_step_on_cpu(
    tmp_path: Path, config: dict[str, Any], method: str, kind: str
) -> None:
    """The model the estimate describes, trained as the recipe says: a full fine-tune
    trains every parameter, LoRA only adapters; every tier gives the loss of no
    checkpointing."""
    weights = gpu_step.saved_random_weights(config, tmp_path / "weights", torch.float32)
    losses = {}
    for tier in ("off", "selective", "full"):
        args = gpu_step.parse_args(
            ["--model", "tiny", "--seq-len", "16", "--method", method, "--out", "x.json"]
        )
        args.tier, args.dtype = tier, "fp32"
        torch.manual_seed(0)
        model = gpu_step.prepared_model(args, config, weights, "cpu")
        assert type(model.get_base_model() if method == "lora" else model).__name__ == kind
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        if method == "full":
            assert trained == {n for n, _ in model.named_parameters()}
        else:
            assert trained and all("lora_" in n for n in trained)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        ids = torch.arange(32).reshape(2, 16) % config["vocab_size"]
        losses[tier] = [gpu_step.training_step(model, optimizer, ids) for _ in range(2)]
    for tier, values in losses.items():
        assert values == pytest.approx(losses["off"], rel=1e-5), tier
    assert losses["off"][1] != losses["off"][0]  # the optimizer stepped


def test_the_next_device_check_is_steps_the_harness_takes() -> None:
    """bench/gpu_window.sh, dry: every step parses, each blocks:K fits its model, and it
    covers what no GPU row does yet: full fine-tunes, a placed plan, BERT and T5, and
    the worst shared row again."""
    script = Path(gpu_step.__file__).with_name("gpu_window.sh")
    done = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "DRY": "1", "PYTHON": sys.executable},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    steps = [gpu_step.parse_args(line.split()[1:]) for line in done.stdout.splitlines()]
    for args in steps:
        config = dict(load_model_config(gpu_step.model_input(args.model)).config)
        if args.tier.startswith("blocks:"):
            plan = gpu_step.block_plan_of(args.tier, config)
            assert plan.every_n_layers is None  # a placed plan, not one of HF's
    covered = {(a.model, a.method, a.tier) for a in steps}
    assert len(covered) == len(steps)
    assert {a.method for a in steps} == {"full", "lora", "qlora"}
    assert {"bert-base-uncased", "t5-base"} <= {a.model for a in steps}
    assert any(a.tier.startswith("blocks:") and a.method == "full" for a in steps)
    # The worst shared row's recipe (as its README says it ran), and its LoRA twin.
    smol = [a for a in steps if a.model.endswith("smollm2-1.7b.json")]
    assert {a.method for a in smol} == {"qlora", "lora"}
    for args in smol:
        assert (args.dtype, args.attention, args.hooks, args.seq_len) == (
            "fp16",
            "eager",
            "hf",
            2048,
        )
