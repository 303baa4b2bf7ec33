"""A real ``torch.distributed`` job on CPU: DDP and FSDP2 with the gloo backend on 127.0.0.1.

`run_job(world_size, strategy, hooks)` starts ``world_size`` processes from
a forkserver that has imported torch and transformers once (a forked child
of a process whose OpenMP pool is running can deadlock; the server never
runs one), trains a tiny Llama one AdamW step on each rank's slice of one
batch, and returns per rank:

- ``weights`` / ``gradients`` / ``optimizer``: bytes of the unique storages
  of the local parameters, of their gradients and of AdamW's ``exp_avg`` /
  ``exp_avg_sq`` (FSDP2: the local shards of the DTensors).  AdamW's
  ``step`` counters are CPU scalars (not ``capturable``), never on the GPU,
  and are left out;
- ``losses``: the global loss (mean over ranks) of the step and of the next
  forward, after the update - equal to the single-process run when the
  gradients were reduced right.

`single_process(hooks)` is the reference: the whole batch on one process.
Everything stays on the loopback interface and every job has a deadline.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

WORLD_BATCH = 4  # sequences per step in all, split over the ranks
SEQ = 16
# Every dim-0 size divisible by 4, so FSDP2 shards without padding.
CONFIG: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
    "pad_token_id": 0,
}
DEADLINE_S = 120.0
# What every rank imports, imported once by the forkserver (each rank then starts in ~0.1 s).
_PRELOAD = (
    "torch.distributed.fsdp",
    "torch.nn.parallel",
    "transformers.models.llama.modeling_llama",
    "ckpt_core._hooks.install",
    "tests._gloo_job",
)


def tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**CONFIG)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).float()
    model.config.use_cache = False
    return model.train()


def hf_config() -> dict[str, Any]:
    """The tiny model's config as ``config.json`` holds it (for ``model={"config": ...}``)."""
    from transformers import LlamaConfig

    return json.loads(LlamaConfig(**CONFIG).to_json_string())


def plan_for(tier: str, world_size: int, sharding: str) -> Any:
    """The plan for this job's step on ``world_size`` ranks (``ckpt_core.Plan``)."""
    from ckpt_core import make_plan

    return make_plan(
        tier,
        model={"config": hf_config()},
        workload={
            "seq_len": SEQ,
            "micro_batch_size": WORLD_BATCH // world_size,
            "dtype": "fp32",
            "method": "full",
            "world_size": world_size,
            "sharding": sharding,
        },
    )


def batch() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(1, CONFIG["vocab_size"], (WORLD_BATCH, SEQ), generator=generator)


def _loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def single_process(hooks: str | None) -> list[float]:
    """Loss of one AdamW step and of the forward after it, on the whole batch."""
    model = tiny_llama()
    if hooks:
        from ckpt_core import install_checkpoint_hooks

        install_checkpoint_hooks(model, hooks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = batch()
    loss = _loss(model, ids)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        after = _loss(model, ids)
    return [loss.item(), after.item()]


def _unique_bytes(tensors: list[torch.Tensor]) -> int:
    storages: dict[int, int] = {}
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _rank_main(rank: int, job: tuple[int, int, str, str | None, str]) -> None:
    import torch.distributed as dist

    world_size, port, strategy, hooks, out = job
    # A rank that is still running near the deadline writes where it is, for the error.
    stacks = Path(out, f"{rank}.stacks").open("w")  # noqa: SIM115 - open until the rank exits
    faulthandler.dump_traceback_later(DEADLINE_S * 0.8, file=stacks)
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=__import__("datetime").timedelta(seconds=DEADLINE_S),
    )
    try:
        measured = _train(rank, world_size, strategy, hooks)
        Path(out, f"{rank}.json").write_text(json.dumps(measured))
        dist.barrier()  # every rank done with its collectives before any tears down
    finally:
        # The model, DDP's reducer and FSDP's state are gone with `_train`'s frame: a DDP
        # reducer destroyed after its process group can block its rank's exit.
        dist.destroy_process_group()


def _train(rank: int, world_size: int, strategy: str, hooks: str | None) -> dict[str, Any]:
    import torch.distributed as dist

    from ckpt_core import install_checkpoint_hooks

    model = tiny_llama()
    late = strategy == "fsdp2_late"  # as the Trainer's callback: after accelerate shards
    if hooks and not late:  # on the blocks FSDP2 wraps, before fully_shard
        install_checkpoint_hooks(model, hooks)
    if strategy.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        for block in model.model.layers:
            fully_shard(block)
        fully_shard(model)
        trained: nn.Module = model
    else:
        trained = nn.parallel.DistributedDataParallel(model)
    if hooks and late:
        install_checkpoint_hooks(model, hooks)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    per_rank = WORLD_BATCH // world_size
    ids = batch()[rank * per_rank : (rank + 1) * per_rank]
    loss = _loss(trained, ids)
    loss.backward()
    params = list(model.parameters())
    measured: dict[str, Any] = {
        "weights": _unique_bytes(params),
        "gradients": _unique_bytes([p.grad for p in params if p.grad is not None]),
    }
    optimizer.step()
    states = [v for s in optimizer.state.values() for k, v in s.items() if k != "step"]
    measured["optimizer"] = _unique_bytes(states)
    with torch.no_grad():
        after = _loss(trained, ids)
    losses = torch.stack([loss.detach(), after.detach()])
    dist.all_reduce(losses)
    measured["losses"] = (losses / world_size).tolist()
    return measured


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_job(world_size: int, strategy: str, hooks: str | None = None) -> list[dict[str, Any]]:
    """``world_size`` gloo ranks running ``strategy``; their figures.

    ``ddp``, ``fsdp2`` (hooks installed before ``fully_shard``) or ``fsdp2_late``
    (after it, where `CheckpointPlanCallback` installs them under the Trainer).
    """
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(list(_PRELOAD))
    with tempfile.TemporaryDirectory() as out:
        context = mp.start_processes(
            _rank_main,
            args=((world_size, _free_port(), strategy, hooks, out),),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + DEADLINE_S
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                stacks = "\n".join(
                    f"rank {r}:\n" + Path(out, f"{r}.stacks").read_text()
                    for r in range(world_size)
                    if Path(out, f"{r}.stacks").exists()
                )
                raise TimeoutError(
                    f"gloo job ({strategy}, {world_size} ranks) past {DEADLINE_S}s\n{stacks}"
                )
        return [json.loads(Path(out, f"{r}.json").read_text()) for r in range(world_size)]
