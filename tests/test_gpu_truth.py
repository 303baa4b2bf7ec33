"""The estimate against real GPU training steps (``../shared/data/gpu-steps``, the fixture).

bench/gpu_truth.py's scoring over the shared rows, repeats dropped, held to
issue 15's targets.  Skipped, saying why, where the shared folder is absent.
"""

from __future__ import annotations

import pytest

from bench import gpu_truth
from bench._gpu_rows import (
    SHARED_ROWS,
    estimate_row,
    load_rows,
    model_input,
    model_type,
    workload_of,
)

pytestmark = pytest.mark.skipif(
    not SHARED_ROWS.is_dir(), reason=f"no shared GPU rows at {SHARED_ROWS}"
)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return load_rows([SHARED_ROWS])


@pytest.fixture(scope="module")
def table(rows: list[dict]) -> dict[str, dict[str, float]]:
    return gpu_truth.summary(gpu_truth.score(rows))


def test_repeats_are_dropped(rows: list[dict]) -> None:
    """49 distinct steps: the -r2 / -r3 re-runs are not scored twice."""
    assert len(rows) == 49
    assert not any(
        row["run"].get("source_file", "").endswith(("-r2.json", "-r3.json")) for row in rows
    )


def test_allocated_peak_within_5_percent(table: dict[str, dict[str, float]]) -> None:
    assert abs(table["all"]["allocated_worst"]) <= gpu_truth.TARGETS["allocated_worst"]


def test_process_memory_mean_within_3_percent(table: dict[str, dict[str, float]]) -> None:
    assert table["all"]["process_mean"] <= gpu_truth.TARGETS["process_mean"]


@pytest.mark.xfail(
    strict=True,
    reason="issue 15 target not met: SmolLM2-1.7B QLoRA eager s2048 is +15% (docs/memory-model.md)",
)
def test_process_memory_worst_within_8_percent(table: dict[str, dict[str, float]]) -> None:
    assert abs(table["all"]["process_worst"]) <= gpu_truth.TARGETS["process_worst"]


def test_sdpa_process_memory_worst_within_8_percent(table: dict[str, dict[str, float]]) -> None:
    for group in ("T4 LoRA SDPA", "T4 QLoRA SDPA"):
        assert abs(table[group]["process_worst"]) <= gpu_truth.TARGETS["process_worst"], group


def test_boundary_verdicts_are_never_dangerous(rows: list[dict]) -> None:
    """Budgets 2-10% either side of each step's real process memory: never a wrong "fits".

    A step that ran out of memory (real > budget) is never answered "fits";
    one that fits is never answered "does_not_fit": inside the error band the
    answer is "tight".
    """
    verdicts = gpu_truth.boundary(rows, None)
    assert verdicts["cases"] == len(rows) * len(gpu_truth.OFFSETS)
    assert verdicts["dangerous"] == 0
    assert verdicts["over_cautious"] == 0
    assert verdicts["tight"] > 0


def test_rows_map_to_the_recipe_they_were_measured_with(rows: list[dict]) -> None:
    for row in rows:
        workload = workload_of(row)
        assert workload["dtype"] == "fp16"
        assert workload["double_quant"] is False
        assert workload["method"] in ("lora", "qlora")


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        # measure.py --no-lora: no rank; its fp32-state AdamW casts every parameter to fp32
        ({"lora_rank": None, "optimizer": "adamw"}, {"method": "full", "dtype": "fp32"}),
        ({"lora_rank": None, "optimizer": "sgd"}, {"method": "full", "dtype": "bf16"}),
        ({"optimizer": "adam8bit"}, {"method": "lora", "optimizer": "adamw_8bit"}),
        ({"optimizer": "sgd-momentum"}, {"optimizer": "sgd_momentum"}),
        ({"kernel": "flash", "attn_impl": "flash_attention_2"}, {"attention": "flash_attention_2"}),
        ({"kernel": "flash", "attn_impl": "sdpa"}, {"attention": "sdpa"}),
    ],
)
def test_the_harness_options_map_to_the_workload(
    rows: list[dict], run: dict, expected: dict
) -> None:
    """Rows of the shared rows' harness with the options no shared row uses (a held-out
    row may): each maps to the recipe it ran, and the estimate takes it."""
    base = next(row for row in rows if row["run"]["quantization"] == "none")
    row = {**base, "run": {**base["run"], "precision": "bf16", **run}}
    workload = workload_of(row)
    assert {key: workload[key] for key in expected} == expected
    assert estimate_row(row)["allocated_bytes"] > 0


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("gemma-2-2b-it", "gemma2"),
        ("gemma-3-1b-pt", "gemma3_text"),
        ("Phi-3-mini-4k-instruct", "phi3"),
        ("Phi-4-mini-instruct", "phi3"),
        ("phi-2", "phi"),
        ("phi-1_5", "phi"),
        ("Qwen3-1.7B", "qwen3"),
        ("Qwen2.5-1.5B-Instruct", "qwen2"),
        ("Mistral-7B-v0.3", "mistral"),
        ("SmolLM2-1.7B", "llama"),
        ("TinyLlama-1.1B-Chat-v1", "llama"),
        ("facebook/opt-1.3b", "opt"),
        ("EleutherAI/pythia-1.4b", "gpt_neox"),
    ],
)
def test_a_rows_model_type_follows_its_name(rows: list[dict], name: str, kind: str) -> None:
    """The shared rows carry no model_type: a held-out row of another family is built as
    that family, not as Llama at its sizes, and estimated (on Phi-3 the harness's q / k /
    v / o targets adapt o_proj only, as PEFT drops the targets that match nothing; a
    Pythia row names GPT-NeoX's, which the harness's match none of)."""
    base = next(row for row in rows if row["run"]["seq_len"] <= 2048)
    run = {**base["run"]}
    if kind == "gpt_neox":
        run["lora_targets"] = ["query_key_value", "dense"]
    row = {**base, "run": run, "model_config": {**base["model_config"], "name": name}}
    assert model_type(row) == kind
    assert estimate_row(row)["allocated_bytes"] > 0


def test_a_named_models_published_config_fills_what_a_row_does_not_carry(
    rows: list[dict],
) -> None:
    """Phi-2's published config rotates 40% of each head and drops out each branch, away
    from PhiConfig's defaults (half, no dropout), which Phi-1.5's keeps: a Phi-2 row is
    estimated with them (without checkpointing, where every block keeps its dropout
    masks; at the full tier this row's peak is the loss's, which they do not reach)."""
    phi_2, phi_1_5 = (
        {
            **rows[0],
            "model_config": {**rows[0]["model_config"], "name": name},
            "run": {**rows[0]["run"], "grad_checkpoint": False},
        }
        for name in ("microsoft/phi-2", "microsoft/phi-1_5")
    )
    config = model_input(phi_2)["config"]
    assert (config["partial_rotary_factor"], config["resid_pdrop"]) == (0.4, 0.1)
    assert "resid_pdrop" not in model_input(phi_1_5)["config"]
    assert estimate_row(phi_2)["allocated_bytes"] > estimate_row(phi_1_5)["allocated_bytes"]


def test_an_opt_rows_mlp_width_and_positions_are_opts(rows: list[dict]) -> None:
    """OPT names its MLP width ``ffn_dim`` (OPTConfig's default otherwise: 3072) and learns
    2048 positions: an OPT row's parameters are those of the model it names."""
    base = next(row for row in rows if row["run"]["seq_len"] <= 2048)
    row = {**base, "model_config": {**base["model_config"], "name": "facebook/opt-1.3b"}}
    config = model_input(row)["config"]
    assert config["ffn_dim"] == base["model_config"]["intermediate_size"]
    assert "intermediate_size" not in config
    assert config["max_position_embeddings"] == 2048
