"""Rows of real GPU training steps: loading, de-duplication, and the estimate for a row.

A row is the schema of ``../shared/data/gpu-steps`` (``model_config``, ``run``,
``measured``, ``predicted``); rows recorded by ``bench/gpu_step.py`` add
``run.tier`` (``off`` | ``selective`` | ``medium`` | ``full``, or ``blocks:K``: a
block-level plan checkpointing K whole blocks, placed as ``auto`` places them) and
``run.model_type``.  Shared by ``bench/gpu_truth.py``, ``bench/gpu_step.py``
and the tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ckpt_core._memory.activations import ModeCounts
    from ckpt_core._memory.arch import Arch
    from ckpt_core._memory.inputs import Run

MIB: Final = 1 << 20
ROOT: Final = Path(__file__).resolve().parents[1]
# CI clones the repository into a folder with shared/ beside it; a git worktree one level
# further down (worktrees/<name>) finds it one level up.
SHARED_CANDIDATES: Final = tuple(
    base / "shared" / "data" / "gpu-steps" for base in (ROOT.parent, ROOT.parent.parent)
)
SHARED_ROWS: Final = next((p for p in SHARED_CANDIDATES if p.is_dir()), SHARED_CANDIDATES[0])
LOCAL_ROWS: Final = ROOT / "bench" / "data"
REPEAT: Final = re.compile(r"-r\d+\.json$")
# The shared rows name no transformers version; their archives' provenance says 5.17.0
# (2026-09-15) and 5.0.0 (2026-09-16), both computing RoPE's angles with a matmul.
SHARED_ROWS_TRANSFORMERS: Final = "5.17.0"
BLOCKS: Final = "blocks:"  # a tier naming a block-level plan: blocks:K
# The shared rows' harness's --optimizer names that differ from the workload's.
HARNESS_OPTIMIZERS: Final = {"adam8bit": "adamw_8bit", "sgd-momentum": "sgd_momentum"}


def load_rows(folders: Iterable[Path]) -> list[dict[str, Any]]:
    """Every row of every ``*.json`` under ``folders``, repeats dropped.

    Repeats: rows whose ``run.source_file`` ends in ``-r2.json`` / ``-r3.json``
    (deliberate re-runs of a row that is kept), and exact duplicates of the
    same configuration with the same measurement.
    """
    rows, seen = [], set()
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            data = json.loads(path.read_text())
            for row in data["runs"] if isinstance(data, dict) else data:
                if REPEAT.search(row["run"].get("source_file", "")):
                    continue
                key = json.dumps([row["model_config"], row["run"], row["measured"]], sort_keys=True)
                key = re.sub(r'"source_file": "[^"]*"', "", key)
                if key in seen:
                    continue
                seen.add(key)
                rows.append({**row, "_file": path.name})
    return rows


# A row without a model_type: its family from the model's name, most specific first.
NAMED_TYPES: Final = (
    ("gemma-3", "gemma3_text"),
    ("gemma-2", "gemma2"),
    ("gemma", "gemma"),
    ("phi-3", "phi3"),
    ("phi-4", "phi3"),  # Phi-4 and Phi-4-mini are Phi3ForCausalLM
    ("phi-2", "phi"),
    ("phi-1", "phi"),  # Phi-1 and Phi-1.5
    ("qwen3", "qwen3"),
    ("qwen", "qwen2"),
    ("ministral", "ministral"),
    ("mistral", "mistral"),
    ("smollm3", "smollm3"),
    ("olmo-2", "olmo2"),
    ("granite", "granite"),
    ("opt-", "opt"),
    ("pythia", "gpt_neox"),
    ("gpt-neox", "gpt_neox"),
    ("gpt2", "gpt2"),
)
# What a named model's published config.json sets away from its config class's defaults
# and a row's model_config does not carry: Phi-2 rotates 32 of its 80 head dimensions and
# drops out each branch's output; OPT's and GPT-2's learned position tables have 2048 and
# 1024 rows (parameters the estimate counts).
PUBLISHED: Final = (
    ("phi-2", {"partial_rotary_factor": 0.4, "resid_pdrop": 0.1}),
    ("opt-", {"max_position_embeddings": 2048}),
    ("gpt2", {"max_position_embeddings": 1024}),
)
# A row's keys that a model type's config names otherwise: OPT's MLP width is ffn_dim.
RENAMED: Final = {"opt": {"intermediate_size": "ffn_dim"}}


def model_type(row: dict[str, Any]) -> str:
    """The transformers model_type of a row (given, or from the model's name; Llama's
    for Llama 3.2, TinyLlama, SmolLM2, deepseek-coder and other Llama-style models)."""
    given = row["run"].get("model_type") or row["model_config"].get("model_type")
    if given:
        return str(given)
    return next((kind for part, kind in NAMED_TYPES if part in _name(row)), "llama")


def _name(row: dict[str, Any]) -> str:
    return str(row["model_config"]["name"]).lower().replace("_", "-")


def model_input(row: dict[str, Any]) -> dict[str, Any]:
    """The ``{"config": ...}`` model input: the full HF config when the row carries one."""
    if row.get("hf_config"):
        return {"config": row["hf_config"]}
    config = row["model_config"]
    published = next((keys for part, keys in PUBLISHED if part in _name(row)), {})
    kind = model_type(row)
    given = {
        "model_type": kind,
        "hidden_size": config["hidden_size"],
        "num_hidden_layers": config["num_layers"],
        "num_attention_heads": config["num_attention_heads"],
        "num_key_value_heads": config["num_kv_heads"],
        "intermediate_size": config["intermediate_size"],
        "vocab_size": config["vocab_size"],
        "head_dim": config["head_dim"],
        "tie_word_embeddings": config["tie_word_embeddings"],
        "max_position_embeddings": max(32768, int(row["run"]["seq_len"])),
    }
    renamed = RENAMED.get(kind, {})
    return {"config": {renamed.get(key, key): value for key, value in given.items()} | published}


def workload_of(row: dict[str, Any]) -> dict[str, Any]:
    """The estimate's workload for the recipe a row was measured with.

    The shared rows' harness (``measure.py``) names its options its own way: no LoRA
    rank is a full fine-tune, ``adam8bit`` / ``sgd-momentum`` are the workload's
    ``adamw_8bit`` / ``sgd_momentum``, and its AdamW with fp32 optimizer states casts a
    full fine-tune's parameters to fp32, so the whole step runs in fp32."""
    run = row["run"]
    quantized = run.get("quantization", "none") not in ("none", None)
    full = not quantized and run.get("lora_rank") is None
    named = run.get("optimizer", "adamw")
    optimizer = HARNESS_OPTIMIZERS.get(named, named)
    fp32 = full and optimizer == "adamw" and run.get("optimizer_dtype", "fp32") == "fp32"
    workload: dict[str, Any] = {
        "seq_len": int(run["seq_len"]),
        "micro_batch_size": int(run["batch_size"]),
        "dtype": "fp32" if fp32 else run["precision"],
        "method": "qlora" if quantized else "full" if full else run.get("method", "lora"),
        "attention": _attention(run),
        "optimizer": optimizer,
        "double_quant": bool(run.get("double_quant", False)),
        "gradients": run.get("gradients", "set_to_none"),
        "padded": bool(run.get("padded", False)),
    }
    # The shared rows' harness loads QLoRA with a device map and LoRA on the CPU, then
    # .cuda(): the defaults.  bench/gpu_step.py records its own.
    if run.get("load_path"):
        workload["load_path"] = run["load_path"]
    # The shared rows' harness pins sdpa's memory-efficient kernel, K and V repeated for it.
    if str(row["measured"].get("sdpa_backend", "")).startswith("EFFICIENT_ATTENTION"):
        workload["sdpa_backend"] = "efficient"
    if quantized:
        workload["weights"] = run["quantization"]
    if workload["method"] != "full":
        workload["lora_rank"] = int(run["lora_rank"])
        workload["lora_targets"] = list(run["lora_targets"])
    return workload


def _attention(run: dict[str, Any]) -> str:
    """eager, sdpa (the harness's "flash" kernel on sm75: memory-efficient SDPA) or FA2."""
    if run.get("attn_impl") == "flash_attention_2":
        return "flash_attention_2"
    return "eager" if run["kernel"] == "eager" else "sdpa"


def tier_of(row: dict[str, Any]) -> str:
    run = row["run"]
    return str(run.get("tier") or ("full" if run.get("grad_checkpoint") else "off"))


def full_blocks(arch: Arch, tier: str) -> ModeCounts:
    """A ``blocks:K`` tier's assignment: K whole blocks checkpointed, the rest off.

    Raises ValueError for a K the model has not, or a model of several kinds of block
    (whose K would not say which)."""
    from ckpt_core._memory.activations import block_kinds

    kinds = block_kinds(arch)
    if len(kinds) != 1:
        raise ValueError(f"{tier}: only for a model of one kind of block")
    ((kind, blocks),) = kinds
    count = tier.removeprefix(BLOCKS)
    if not count.isdigit() or int(count) > blocks:
        raise ValueError(f"{tier}: K must be a whole number of blocks from 0 to {blocks}")
    return ((("full", kind), int(count)), (("off", kind), blocks - int(count)))


def gpu_of(row: dict[str, Any]) -> str | None:
    """The GPU-table name of the row's GPU, or None when the table does not know it."""
    from ckpt_core._planning.gpus import lookup_gpu

    try:
        return lookup_gpu(row.get("gpu") or row["run"].get("gpu_name", "")).name
    except ValueError:
        return None


def rotary_matmul_of(row: dict[str, Any]) -> bool:
    """Whether the row's transformers computed RoPE's angles with a matmul, the forward's
    first cuBLAS call (before 5.19): ``run.transformers``, which ``bench/gpu_step.py``
    records, else the shared rows' (`SHARED_ROWS_TRANSFORMERS`)."""
    from ckpt_core._planning.training_args import ROTARY_MUL_SINCE, parse_transformers_version

    version = row["run"].get("transformers", SHARED_ROWS_TRANSFORMERS)
    return parse_transformers_version(version) < ROTARY_MUL_SINCE


def estimate_row(row: dict[str, Any], budget_bytes: int | None = None) -> dict[str, Any]:
    """The estimate's tier entry for the row (allocated, peak, verdict against a budget);
    for a ``blocks:K`` row, the entry ``estimate["chosen"]`` gives that plan."""
    from ckpt_core._memory.advise import chosen_row, estimate_tiers
    from ckpt_core._memory.search import evaluate
    from ckpt_core._memory.verdict import tight_band

    run, tier = prepared_run(row), tier_of(row)
    arch = run.facts.arch
    if tier.startswith(BLOCKS):
        candidate = evaluate(arch, run.step, run.peak, full_blocks(arch, tier))
        return chosen_row(candidate, budget_bytes, tight_band(arch, run.step))
    memory_gib = None if budget_bytes is None else budget_bytes / (1 << 30)
    return estimate_tiers(run, memory_gib)["tiers"][tier]


def replayed_segments(row: dict[str, Any]) -> list[int]:
    """The sizes of the segments the estimate's replay of the row's step reserves, in the
    order it reserves them (to set against ``measured.segments_mib``)."""
    from ckpt_core._memory.placement import placed_modes
    from ckpt_core._memory.step_trace import replayed_pool

    run, tier = prepared_run(row), tier_of(row)
    arch, trace = run.facts.arch, run.recipe.trace
    if trace is None:
        raise ValueError(f"{tier}: the estimate replays no step for this row's workload")
    plan = placed_modes(arch, full_blocks(arch, tier)) if tier.startswith(BLOCKS) else tier
    return replayed_pool(arch, plan, trace).segment_sizes()


def prepared_run(row: dict[str, Any]) -> Run:
    """The estimate's prepared request for the row, on its GPU, without headroom.

    LoRA targets the model has no linear for are dropped, as PEFT drops them when
    another target matches (the harness's q / k / v / o on Phi-3 adapt its o_proj)."""
    from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
    from ckpt_core._memory.param_layout import matches_target

    facts = model_facts(model_input(row))
    fields = {**workload_of(row), "headroom": 0.0}
    if "lora_targets" in fields:
        names = [linear.name for linear in facts.layout.linears]
        fields["lora_targets"] = [
            target
            for target in fields["lora_targets"]
            if any(matches_target(name, target) for name in names)
        ]
    return prepare(facts, parse_workload(fields), gpu_of(row), rotary_matmul=rotary_matmul_of(row))
