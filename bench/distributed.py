"""Per-GPU memory under data parallelism, against real engines: the tables of docs/distributed.md.

Run: ``.venv/bin/python -m bench.distributed`` (needs the test extra: deepspeed,
torch, transformers).  Prints, in markdown:

1. DeepSpeed's own ZeRO-2 / ZeRO-3 estimators (``estimate_zero2_model_states_mem_needs``,
   ``estimate_zero3_model_states_mem_needs``: what the ``..._all_cold`` printers
   print) next to our per-GPU model states for the same parameter counts, with
   ``additional_buffer_factor=1`` for the host column;
2. a gloo job on 127.0.0.1 (DDP and FSDP2, 2 and 4 ranks, AdamW, a tiny Llama):
   per-rank bytes of parameters / gradients / optimizer states measured (unique
   local storages) next to the estimate, and the step's loss next to the
   single-process run's;
3. llama-3.1-70b, seq 8192, on 8 x H100-80GB: the per-GPU breakdown by sharding.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the estimators need no device; say so, quietly

GIB = 1 << 30
PRESETS = ("llama-3.1-70b", "llama-3.1-8b", "mixtral-8x7b")
SETUPS = ((1, 8), (4, 8))  # (nodes, GPUs per node)
ZERO3_OFFLOADS = ("none", "optimizer", "all")


def _ours(preset: str, nodes: int, per_node: int, sharding: str, offload: str) -> Any:
    from ckpt_core._memory.inputs import model_facts, parse_workload, prepare

    workload = {
        "seq_len": 1024,
        "method": "full",
        "engine": "deepspeed",
        "world_size": nodes * per_node,
        "gpus_per_node": per_node,
        "sharding": sharding,
        "offload": offload,
    }
    run = prepare(model_facts({"preset": preset}), parse_workload(workload))
    return run.static, run.facts


def deepspeed_table() -> list[str]:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from ckpt_core._memory.sharding import _largest_module

    rows = [
        "| model | nodes x GPUs | stage | offload | DeepSpeed GPU GiB | ours GPU GiB | diff "
        "| DeepSpeed host GiB / node | ours host GiB / node |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for preset in PRESETS:
        for nodes, per_node in SETUPS:
            for sharding, offloads in (("zero2", ("none", "optimizer")), ("zero3", ZERO3_OFFLOADS)):
                for offload in offloads:
                    ours, facts = _ours(preset, nodes, per_node, sharding, offload)
                    total = facts.layout.total
                    if sharding == "zero2":
                        cpu, gpu = estimate_zero2_model_states_mem_needs(
                            total, per_node, nodes, offload != "none", additional_buffer_factor=1
                        )
                    else:
                        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
                            total,
                            _largest_module(facts.arch, facts.layout),
                            per_node,
                            nodes,
                            cpu_offload=offload != "none",
                            cpu_offload_params=offload == "all",
                            additional_buffer_factor=1,
                        )
                    mine = ours.weights + ours.gradients + ours.optimizer + ours.gathered
                    rows.append(
                        f"| {preset} | {nodes} x {per_node} | {sharding} | {offload} "
                        f"| {gpu / GIB:.2f} | {mine / GIB:.2f} | {(mine - gpu) / gpu:+.4%} "
                        f"| {cpu / GIB:.1f} | {ours.host_per_gpu * per_node / GIB:.1f} |"
                    )
    return rows


def gloo_table() -> list[str]:
    from tests import _gloo_job

    reference = _gloo_job.single_process(None)
    rows = [
        f"Single process, whole batch: loss {reference[0]:.6f}, after the step {reference[1]:.6f}.",
        "",
        "| strategy | ranks | hooks | params B/rank (measured / estimate) | grads B/rank "
        "| AdamW states B/rank | loss | loss after step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for strategy, sharding, tier in (
        ("ddp", "none", "selective"),
        ("fsdp2", "zero3", "medium"),
        ("fsdp2", "zero3", "selective"),
        ("fsdp2_late", "zero3", "medium"),  # hooks after fully_shard, as the Trainer's callback
    ):
        for world_size in (2, 4):
            plan = _gloo_job.plan_for(tier, world_size, sharding)
            ranks = _gloo_job.run_job(world_size, strategy, plan.hooks)
            est = plan.estimate["assumptions"]
            worst = {key: max(rank[key] for rank in ranks) for key in ranks[0] if key != "losses"}
            loss, after = ranks[0]["losses"]
            rows.append(
                f"| {strategy} | {world_size} | {plan.hooks} "
                f"| {worst['weights']:,} / {est['weights_bytes']:,} "
                f"| {worst['gradients']:,} / {est['gradients_bytes']:,} "
                f"| {worst['optimizer']:,} / {est['optimizer_bytes']:,} "
                f"| {loss:.6f} | {after:.6f} |"
            )
    return rows


def llama_70b_table() -> list[str]:
    from ckpt_core import make_plan

    rows = [
        "| method | sharding | engine | offload | tier | peak GiB | weights | grads | optimizer "
        "| gathered | buckets | host GiB/GPU | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cases = [
        ("lora", "none", "torch", "none"),
        ("lora", "zero3", "torch", "none"),
        ("lora", "zero3", "deepspeed", "none"),
        ("full", "none", "torch", "none"),
        ("full", "zero3", "torch", "none"),
        ("full", "zero3", "torch", "all"),
        ("full", "zero3", "deepspeed", "optimizer"),
    ]
    for method, sharding, engine, offload in cases:
        workload = {
            "seq_len": 8192,
            "method": method,
            "world_size": 8,
            "sharding": sharding,
            "engine": engine,
            "offload": offload,
        }
        plan = make_plan(
            "auto", gpu="H100-80GB", model={"preset": "llama-3.1-70b"}, workload=workload
        )
        tier = plan.granularity or "off"
        row = plan.estimate["chosen"]
        a = plan.estimate["assumptions"]
        d = a["distributed"]
        gib = [
            a["weights_bytes"],
            a["gradients_bytes"],
            a["optimizer_bytes"],
            d["gathered_bytes"],
            d["communication_bytes"],
            d["host_bytes_per_gpu"],
        ]
        cells = " | ".join(f"{value / GIB:.1f}" for value in gib)
        verdict = row["verdict"] if row["fits"] else "no: nothing fits"
        rows.append(
            f"| {method} | {sharding} | {engine} | {offload} | {tier} "
            f"| {row['peak_bytes'] / GIB:.1f} | {cells} | {verdict} |"
        )
    return rows


def main() -> None:
    print("## DeepSpeed's estimators vs ours (mixed precision, fp32 master weights)\n")
    print("\n".join(deepspeed_table()))
    print("\n## gloo job: DDP and FSDP2 with AdamW, tiny Llama (fp32)\n")
    print("\n".join(gloo_table()))
    print("\n## llama-3.1-70b, seq 8192, 8 x H100-80GB (79.2 GiB, headroom 0.1), auto\n")
    print("\n".join(llama_70b_table()))


if __name__ == "__main__":
    main()
