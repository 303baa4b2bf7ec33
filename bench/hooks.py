"""Our checkpoint hooks next to HF's native checkpointing, on a small Llama on CPU.

Run: ``.venv/bin/python -m bench.hooks`` (``--layers`` 8, ``--hidden`` 256,
``--seq-len`` 256, ``--batch`` 2, ``--steps`` 7, ``--threads`` 1).

Per configuration, on the same randomly initialised model (same seed):

- FLOPs of one training step (forward + backward, recomputation included),
  counted by ``torch.utils.flop_counter.FlopCounterMode``;
- bytes held after the forward pass (with labels, ``use_cache=False``): the
  net CPU memory the torch profiler saw allocated and not freed during the
  forward - what the backward keeps, plus the logits and loss - measured
  the same way for every row and independent of ckpt_core's own accounting;
- step time: forward + backward with real tensors on ``--threads`` CPU
  threads (1: on a shared machine more threads mostly measure the
  neighbours); the rows take turns step by step, after one warm-up step
  each, and the table shows the median of ``--steps``.

Rows: no checkpointing; ours (``install_checkpoint_hooks``) selective,
medium and full; HF's ``activation_checkpointing_enable()`` (full) and
``activation_checkpointing_enable(every_n_layers=2)`` (medium: the same
layers 0, 2, 4, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench._common import table

ROWS = ("off", "ours selective", "ours medium", "HF medium", "ours full", "HF full")
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    flops: int
    held_bytes: int
    step_ms: float


def build(name: str, args: argparse.Namespace) -> Any:
    """The small Llama in training mode, with the checkpointing `name` asks for."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ckpt_core import install_checkpoint_hooks

    config = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=1024,
        max_position_embeddings=max(args.seq_len, 1024),
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).train()
    if name.startswith("ours "):
        install_checkpoint_hooks(model, name.removeprefix("ours "))
    elif name == "HF full":
        model.activation_checkpointing_enable()
    elif name == "HF medium":
        model.activation_checkpointing_enable(every_n_layers=2)
    return model


def step(model: Any, ids: Any) -> None:
    output = model(input_ids=ids, labels=ids, use_cache=False)
    output.loss.backward()
    model.zero_grad(set_to_none=True)


def count_flops(model: Any, ids: Any) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step(model, ids)
    return int(counter.get_total_flops())


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """The profiler's C++ side prints start / stop lines on fd 2: keep the table clean."""
    saved = os.dup(2)
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def held_after_forward(model: Any, ids: Any) -> int:
    """Net bytes allocated during the forward and still alive at its end (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        output = model(input_ids=ids, labels=ids, use_cache=False)
    held = sum(event.self_cpu_memory_usage for event in prof.events())
    del output
    return int(held)


def _timed_step(model: Any, ids: Any) -> float:
    started = time.perf_counter()
    step(model, ids)
    return (time.perf_counter() - started) * 1000


def measure_all(args: argparse.Namespace) -> dict[str, Row]:
    import torch

    torch.set_num_threads(args.threads)
    models = {name: build(name, args) for name in ROWS}
    ids = torch.randint(0, models["off"].config.vocab_size, (args.batch, args.seq_len))
    flops = {name: count_flops(model, ids) for name, model in models.items()}
    held = {name: held_after_forward(model, ids) for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in ROWS}
    for model in models.values():
        step(model, ids)  # warm-up
    for _ in range(args.steps):  # turns: drift on the machine hits every row alike
        for name, model in models.items():
            times[name].append(_timed_step(model, ids))
    return {
        name: Row(name, flops[name], held[name], statistics.median(times[name])) for name in ROWS
    }


def checks(rows: dict[str, Row]) -> list[tuple[str, bool, str]]:
    """The targets: (what, met, the figures)."""

    def same(a: str, b: str) -> tuple[str, bool, str]:
        flops = rows[a].flops / rows[b].flops - 1
        held = rows[a].held_bytes - rows[b].held_bytes
        return (
            f"{a} = {b}: FLOPs within 1%, same bytes",
            abs(flops) <= 0.01 and held == 0,
            f"FLOPs {flops:+.4%}, bytes differ by {held}",
        )

    off, sel, med = (rows[n].flops for n in ("off", "ours selective", "ours medium"))
    return [
        same("ours full", "HF full"),
        same("ours medium", "HF medium"),
        (
            "off < selective < medium in FLOPs",
            off < sel < med,
            f"{off / 1e9:.3f} < {sel / 1e9:.3f} < {med / 1e9:.3f} GFLOPs",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    rows = measure_all(args)
    off = rows["off"]
    print(
        f"Llama, {args.layers} layers, hidden {args.hidden}, batch {args.batch} x seq "
        f"{args.seq_len}, fp32 on CPU, {args.threads} thread(s)\n"
    )
    body = [
        [
            r.name,
            r.flops / 1e9,
            r.flops / off.flops,
            r.held_bytes / MIB,
            r.held_bytes / off.held_bytes,
            r.step_ms,
            r.step_ms / off.step_ms,
        ]
        for r in rows.values()
    ]
    headers = ["rows", "GFLOPs/step", "x off", "MiB after fwd", "x off", "step ms", "x off"]
    print(table(headers, body))
    print("\ntargets:")
    for what, met, figures in checks(rows):
        print(f"  {'yes' if met else 'NO '} {what}: {figures}")


if __name__ == "__main__":
    main()
