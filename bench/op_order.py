"""The step replay against the real op order, for recipes no GPU row covers.

For each case (preset x method x dtype x attention x tier, at one micro-batch and
sequence length) the real model - transformers, PEFT's LoRA (bitsandbytes' own
4-bit layer for QLoRA, parameters quantized on meta), this project's checkpoint
hooks - runs a warm-up and a measured training step on the meta device.  A
dispatch mode logs every storage's malloc and free in the order autograd makes
them; the optimizer's states and torch AdamW's foreach temporaries are added
where ``optimizer.step()`` makes them, and the cuBLAS workspaces where the first
matmul of the forward and of the backward ask for theirs.  That sequence is
replayed through the project's `CachingAllocator` and printed next to the
estimate's allocated peak and reserved pool (its ``peak_bytes`` less the CUDA
context), as ratios.

Where meta does not run what CUDA runs: sdpa and dropout take this project's
stand-ins (a fused kernel's saved tensors; CUDA's bool dropout mask, not the
CPU's in the activation dtype); bitsandbytes' CUDA ``gemm_4bit`` dequantizes
each weight into a buffer of its own past 4 rows (its fused kernel takes more,
up to 1536, on some GPUs and shapes only), which the recording adds;
bitsandbytes' int8 layer (``--weights int8``) runs at outlier threshold 0,
since meta cannot make the data-dependent outlier columns, and the recording
adds the CUDA buffers transformers' threshold 6.0 makes (the outlier mask, the
int32 product and its fp16 dequantization); and CUDA's softmax reads fp16
scores in its kernel where meta makes the fp32 copy, so fp16 eager is left
out.  QLoRA cases need ``bitsandbytes`` installed (it is not a dependency of
this project); without it they are skipped.

A tier may also be ``blocks:K``: a block-level plan checkpointing K of the
blocks whole, placed as ``auto`` places them (`ckpt_core._memory.placement`),
installed with this project's hooks and estimated as ``auto`` estimates it.

Run: ``.venv/bin/python -m bench.op_order [--presets P ...] [--methods ...]
[--weights nf4 int8] [--attention ...] [--dtypes ...] [--tiers ... blocks:K]
[--batch 2] [--seq 1024] [--padded]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import torch

from bench._common import attention_targets
from bench._gpu_rows import BLOCKS, full_blocks
from bench._meta_kernels import Event, int8_layer, nf4_layer
from bench._op_recording import record_step, replay, with_workspaces
from ckpt_core._memory.allocator import MIB
from ckpt_core._memory.families import family_of
from ckpt_core._memory.placement import place

if TYPE_CHECKING:
    from ckpt_core._memory.inputs import Run

PRESETS: Final = ("llama-3.2-1b", "qwen2.5-0.5b", "gemma-3-1b", "phi-3-mini", "qwen3-8b")
GPU: Final = "A100-80GB"  # the workspace size; the context is taken off the estimate


@dataclass(frozen=True)
class Case:
    preset: str
    method: str  # full | lora | qlora
    dtype: str  # bf16 | fp16 | fp32
    attention: str  # sdpa | eager
    tier: str
    batch: int
    seq: int
    padded: bool = False  # an attention mask with padding (`measure_activation_bytes`'s)
    overrides: tuple[tuple[str, Any], ...] = ()  # config keys set on the preset's config
    weights: str = "nf4"  # a QLoRA case's bitsandbytes weights: nf4 | int8
    all_linear: bool = False  # LoRA on every linear (PEFT's ``all-linear``, MoE experts too)
    lora_targets: tuple[str, ...] = ()  # LoRA on these module names instead of the attention

    @property
    def targets(self) -> list[str] | str:
        if self.all_linear:
            return "all-linear"
        if self.lora_targets:
            return list(self.lora_targets)
        return attention_targets(str(self.model_config["model_type"]))

    @property
    def model_config(self) -> dict[str, Any]:
        from ckpt_core._configs.presets import load_preset

        return {**load_preset(self.preset), **dict(self.overrides)}

    @property
    def model(self) -> dict[str, Any]:
        """The model input: the preset, or its config with the overrides."""
        if not self.overrides:
            return {"preset": self.preset}
        return {"config": self.model_config}


def _model(case: Case) -> Any:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    from ckpt_core import install_checkpoint_hooks
    from ckpt_core._configs.model_config import build_meta_model, load_model_config

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
    config = load_model_config(case.model)
    model = build_meta_model(config, attention=case.attention).to(dtype)
    kept = _keep_in_fp32(case)
    if case.dtype == "fp16":  # as from_pretrained loads fp16 weights: these stay in fp32
        for name, module in model.named_modules():
            if name.rpartition(".")[2] in kept:
                module.float()
    if case.method == "qlora":
        from transformers.pytorch_utils import Conv1D

        # transformers' bitsandbytes integration quantizes every linear but the output
        # embeddings (`get_keys_to_not_convert`) and the model's fp32-kept modules (T5's
        # wo): a head's (BERT's transform) and an idle vision tower's too.
        output = model.get_output_embeddings()
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                # GPT-2's Conv1D is quantized as a linear of its weight's (in, out) shape.
                if not isinstance(child, (torch.nn.Linear, Conv1D)) or child is output:
                    continue
                if name in kept:  # the quantizer's modules_to_not_convert
                    continue
                linear = isinstance(child, torch.nn.Linear)
                shape = (
                    (child.in_features, child.out_features) if linear else tuple(child.weight.shape)
                )
                quantized = (
                    int8_layer(*shape) if case.weights == "int8" else nf4_layer(*shape, dtype)
                )
                setattr(parent, name, quantized)
        if case.weights == "int8":  # PEFT's dispatch picks its 8-bit LoRA layer by this
            model.is_loaded_in_8bit = True
        else:
            model.is_loaded_in_4bit = True
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if case.method != "full":
        lora = LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0, target_modules=case.targets)
        model = get_peft_model(model, lora)
        model.enable_input_require_grads()
    if case.tier.startswith(BLOCKS):
        arch = prepared(case).facts.arch
        install_checkpoint_hooks(
            model, "blocks", block_plan=place(arch, full_blocks(arch, case.tier))
        )
    elif case.tier != "off":
        install_checkpoint_hooks(model, case.tier)
    return model.train()


def record(case: Case) -> list[Event]:
    """The storages' mallocs and frees of the load, a warm-up step and the measured step."""
    # A half-precision load's unquantized parameters are cast to fp32 by kbit preparation.
    kbit_prepared = case.method == "qlora" and case.dtype != "fp32"
    return record_step(
        _model(case),
        batch=case.batch,
        seq=case.seq,
        padded=case.padded,
        kbit_prepared=kbit_prepared,
        # An fp16 load keeps them in fp32 (`_model`).
        loaded_in_fp32=_keep_in_fp32(case) if case.dtype == "fp16" else frozenset(),
    )


def _keep_in_fp32(case: Case) -> frozenset[str]:
    """The modules transformers keeps in fp32 for the case's model (its
    ``_keep_in_fp32_modules``, as the family lists them): none is quantized either."""
    from ckpt_core._memory.inputs import model_facts

    return family_of(model_facts(case.model).arch).keep_in_fp32


def prepared(case: Case) -> Run:
    """The estimate's prepared request for the case (its workload, on `GPU`)."""
    from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
    from ckpt_core._planning.training_args import (
        ROTARY_MUL_SINCE,
        installed_transformers_version,
        parse_transformers_version,
    )

    workload: dict[str, Any] = {
        "seq_len": case.seq,
        "micro_batch_size": case.batch,
        "padded": case.padded,
        "dtype": case.dtype,
        "attention": case.attention,
        "method": case.method,
        "headroom": 0.0,
    }
    if case.method != "full":
        # The estimate's default targets are PEFT's all-linear.
        workload.update(lora_rank=32, lora_targets=None if case.all_linear else case.targets)
    if case.method == "qlora":
        workload["weights"] = case.weights
    installed = parse_transformers_version(installed_transformers_version())
    return prepare(
        model_facts(case.model),
        parse_workload(workload),
        GPU,
        rotary_matmul=installed < ROTARY_MUL_SINCE,  # the recording's transformers
    )


def estimate(case: Case) -> tuple[int, int, int]:
    """The estimate's (allocated peak, reserved pool, cuBLAS workspace) for the case."""
    from ckpt_core._memory.advise import estimate_tiers

    run = prepared(case)
    assert run.recipe.trace is not None
    workspace = run.recipe.trace.blas_workspace
    if case.tier.startswith(BLOCKS):
        counts = full_blocks(run.facts.arch, case.tier)
        memory = run.peak.of(run.facts.arch, run.step, counts)
        return memory.allocated_bytes, memory.peak_bytes - run.context[0], workspace
    answer = estimate_tiers(run, None)
    tier = answer["tiers"][case.tier]
    context = answer["assumptions"]["cuda_context_bytes"]
    return tier["allocated_bytes"], tier["peak_bytes"] - context, workspace


def cases(args: argparse.Namespace) -> Iterator[Case]:
    product = itertools.product(args.presets, args.methods, args.dtypes, args.attention, args.tiers)
    for preset, method, dtype, attention, tier in product:
        if dtype == "fp16" and attention == "eager":
            continue  # meta makes the fp32 softmax copy that CUDA does not
        for weights in args.weights if method == "qlora" else ["nf4"]:
            yield Case(
                preset,
                method,
                dtype,
                attention,
                tier,
                args.batch,
                args.seq,
                args.padded,
                weights=weights,
                all_linear=args.all_linear,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--methods", nargs="+", default=["full", "lora", "qlora"])
    parser.add_argument("--dtypes", nargs="+", default=["bf16"])
    parser.add_argument(
        "--weights", nargs="+", default=["nf4"], help="QLoRA's bitsandbytes weights: nf4 | int8"
    )
    parser.add_argument("--attention", nargs="+", default=["sdpa", "eager"])
    parser.add_argument("--tiers", nargs="+", default=["off", "selective", "medium", "full"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--padded", action="store_true", help="a padded batch (attention mask)")
    parser.add_argument(
        "--all-linear", action="store_true", help="LoRA on every linear, not the attention's"
    )
    args = parser.parse_args()
    if "qlora" in args.methods and importlib.util.find_spec("bitsandbytes") is None:
        print("bitsandbytes is not installed: QLoRA cases skipped")
        args.methods = [m for m in args.methods if m != "qlora"]
    print(
        "| case | real order MiB (alloc / reserved) | estimate MiB | ratio alloc | ratio reserved |"
    )
    print("|---|--:|--:|--:|--:|")
    ratios: list[tuple[Case, float, float]] = []
    for case in cases(args):
        allocated, reserved, workspace = estimate(case)
        real_allocated, real_reserved = replay(with_workspaces(record(case), workspace))
        ratio = (allocated / real_allocated, reserved / real_reserved)
        ratios.append((case, *ratio))
        name = (
            " ".join((case.preset, case.method, case.dtype, case.attention, case.tier))
            + (f" {case.weights}" if case.method == "qlora" else "")
            + f" b{case.batch} s{case.seq}"
            + (" padded" if case.padded else "")
        )
        print(
            f"| {name} | {real_allocated / MIB:.0f} / {real_reserved / MIB:.0f} "
            f"| {allocated / MIB:.0f} / {reserved / MIB:.0f} | {ratio[0]:.4f} | {ratio[1]:.4f} |",
            flush=True,
        )
    if not ratios:
        return
    allocated_errors = [abs(a - 1) for _, a, _ in ratios]
    reserved_errors = [r - 1 for _, _, r in ratios]
    print(
        f"\n{len(ratios)} cases. allocated: mean |error| {statistics.mean(allocated_errors):.2%}, "
        f"worst {max(allocated_errors):.2%}; reserved: mean |error| "
        f"{statistics.mean(map(abs, reserved_errors)):.2%}, lowest {min(reserved_errors):+.2%}, "
        f"highest {max(reserved_errors):+.2%}, within 1%: "
        f"{sum(abs(e) <= 0.01 for e in reserved_errors)}"
    )


if __name__ == "__main__":
    main()
