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
import contextlib
import importlib.util
import itertools
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bench._meta_kernels import (
    Event,
    int8_layer,
    kernel_buffers_after,
    kernel_buffers_before,
    nf4_layer,
)
from ckpt_core._memory.activations import ModeCounts, block_kinds
from ckpt_core._memory.allocator import MIB, CachingAllocator
from ckpt_core._memory.placement import place
from ckpt_core._meta.stand_ins import math_backend_running

if TYPE_CHECKING:
    from ckpt_core._memory.arch import Arch
    from ckpt_core._memory.inputs import Run

TARGETS: Final = ["q_proj", "k_proj", "v_proj", "o_proj"]
# LoRA on the attention of model types whose linears are named otherwise.
TARGETS_BY_TYPE: Final = {
    "phi3": ["qkv_proj", "o_proj"],  # fused q / k / v
    "t5": ["q", "k", "v", "o"],  # self- and cross-attention
    "phi": ["q_proj", "k_proj", "v_proj", "dense"],
    "gpt_neox": ["query_key_value", "dense"],
    "opt": ["q_proj", "k_proj", "v_proj", "out_proj"],
    "deepseek_v2": ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],  # latent attention
    "deepseek_v3": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
    "falcon": ["query_key_value", "dense"],
    "gpt2": ["c_attn", "attn.c_proj"],
    "bert": ["query", "key", "value", "attention.output.dense"],
}
PRESETS: Final = ("llama-3.2-1b", "qwen2.5-0.5b", "gemma-3-1b", "phi-3-mini", "qwen3-8b")
BLOCKS: Final = "blocks:"  # a tier naming a block-level plan: blocks:K
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
        return TARGETS_BY_TYPE.get(str(self.model_config["model_type"]), TARGETS)

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


class _Log(TorchDispatchMode):
    """A dispatch mode that logs each new storage's malloc, and its free once unreferenced."""

    def __init__(self, events: list[Event], known: dict[int, Any]) -> None:
        super().__init__()
        self.events, self.known = events, known
        self.live: dict[int, Any] = {}
        # An output storage -> the block it was added into: its key, and its storage, held
        # so that no new storage reuses the key before the block's free.
        self.in_place: dict[int, tuple[int, Any]] = {}
        self.in_backward = False  # within `run_backward`

    def poll(self) -> None:
        for key in [k for k, ref in self.live.items() if ref.expired()]:
            del self.live[key]
            self.events.append(("free", self.in_place.pop(key, (key,))[0], 0, ""))

    def run_backward(self, loss: Any) -> None:
        """``loss.backward()``, its gradient sums told apart from the forward's adds."""
        self.in_backward = True
        try:
            loss.backward()
        finally:
            self.in_backward = False
        self.poll()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        self.poll()
        out = func(*args, **(kwargs or {}))
        events, known = self.events, self.known
        # CUDA's math backend adds the mask into the scores in place; autograd's engine
        # sums a second gradient into the first in place (``InputBuffer::accumulate``),
        # except under a dispatch mode, as here.  The sum keeps the first's block, whose
        # free waits for the sum's.
        if func is torch.ops.aten.add.Tensor and (
            math_backend_running() or (self.in_backward and _accumulates(args, kwargs))
        ):
            first = args[0].untyped_storage()
            if first._cdata in self.live:
                total = out.untyped_storage()
                del self.live[first._cdata]
                self.live[total._cdata] = StorageWeakRef(total)
                block = self.in_place.pop(first._cdata, (first._cdata, first))
                self.in_place[total._cdata] = block
                return out
        made = kernel_buffers_before(func, args, kwargs or {}, events)
        for tensor in tree_flatten(out)[0]:
            if getattr(tensor, "is_meta", False):
                storage = tensor.untyped_storage()
                key = storage._cdata
                if key in known and known[key].expired():
                    del known[key]  # a replaced parameter's storage: reused
                if key in known or key in self.live:
                    continue
                self.live[key] = StorageWeakRef(storage)
                events.append(("malloc", key, storage.nbytes(), str(func)))
        events.extend(("free", key, 0, "") for key in made)
        kernel_buffers_after(func, args, events)
        return out


def _accumulates(args: Any, kwargs: dict[str, Any] | None) -> bool:
    """Whether a backward's ``add`` is the engine summing a second gradient into the
    first in place: outside grad mode (a recompute's forward runs in it), two dense
    tensors of one layout, no ``alpha``, and a first that holds its storage alone
    (``can_accumulate_inplace``): not a view, as a linear's input gradient is (the
    reshape's backward) and a tied weight's LM-head gradient (the transpose's)."""
    if torch.is_grad_enabled() or kwargs or len(args) != 2:
        return False
    first, second = args
    return (
        isinstance(second, torch.Tensor)
        and first._base is None
        and first.shape == second.shape
        and first.dtype == second.dtype
        and first.stride() == second.stride()
        and first.is_contiguous()
    )


def _model(case: Case) -> Any:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    from ckpt_core import install_checkpoint_hooks
    from ckpt_core._configs.model_config import build_meta_model, load_model_config

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
    config = load_model_config(case.model)
    model = build_meta_model(config, attention=case.attention).to(dtype)
    if case.method == "qlora":
        from transformers.pytorch_utils import Conv1D

        # transformers' bitsandbytes integration quantizes every linear but the output
        # embeddings (`get_keys_to_not_convert`): a head's (BERT's transform) and an idle
        # vision tower's too.
        output = model.get_output_embeddings()
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                # GPT-2's Conv1D is quantized as a linear of its weight's (in, out) shape.
                if not isinstance(child, (torch.nn.Linear, Conv1D)) or child is output:
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
        install_checkpoint_hooks(model, "blocks", block_plan=place(arch, block_counts(case, arch)))
    elif case.tier != "off":
        install_checkpoint_hooks(model, case.tier)
    return model.train()


def record(case: Case) -> list[Event]:
    """The storages' mallocs and frees of the load, a warm-up step and the measured step."""
    model = _model(case)
    events: list[Event] = []
    known: dict[int, Any] = {}
    # A half-precision load's unquantized parameters are cast to fp32 by kbit preparation.
    _record_load(model, case.method == "qlora" and case.dtype != "fp32", events, known)
    _record_steps(model, case, events, known)
    return events


def _register(tensor: Any, events: list[Event], known: dict[int, Any]) -> None:
    storage = tensor.untyped_storage()
    if storage._cdata not in known:
        known[storage._cdata] = StorageWeakRef(storage)
        events.append(("malloc", storage._cdata, storage.nbytes(), "load"))


def _record_load(model: Any, prepared: bool, events: list[Event], known: dict[int, Any]) -> None:
    """The load as the estimate replays it: each quantized weight from a compute-dtype
    copy; once all is loaded, kbit preparation's fp32 copy of every other parameter (a
    tied one once), each freeing its loaded copy; the adapters last."""
    loaded: dict[int, tuple[Any, Any]] = {}  # a prepared parameter's storage -> (copy, it)
    for name, module in model.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            if "lora_" in name:
                continue
            quant_state = getattr(param, "quant_state", None)
            if param.dtype == torch.int8:  # transformers' Bnb8bitQuantize: an fp16 copy back
                copies = ("value", name), ("fp16", name)
                for copy in copies:
                    events.append(("malloc", copy, 2 * param.numel(), "load"))
                _register(param.SCB, events, known)
                _register(param, events, known)
                for copy in copies:
                    events.append(("free", copy, 0, ""))
            elif quant_state is not None:
                copy = ("copy", name)
                size = quant_state.dtype.itemsize * quant_state.shape.numel()
                events.append(("malloc", copy, size, "load"))
                for tensor in (param, quant_state.absmax, quant_state.code):
                    _register(tensor, events, known)
                events.append(("free", copy, 0, ""))
            elif prepared and param.dtype == torch.float32:
                key = param.untyped_storage()._cdata
                if key not in loaded:
                    loaded[key] = ("half", name, pname), param
                    events.append(("malloc", loaded[key][0], param.numel() * 2, "load"))
            else:
                _register(param, events, known)
        for buffer in module.buffers(recurse=False):
            _register(buffer, events, known)
    for half, param in loaded.values():
        _register(param, events, known)
        events.append(("free", half, 0, ""))
    for name, param in model.named_parameters():
        if "lora_" in name:
            _register(param, events, known)


def _record_steps(model: Any, case: Case, events: list[Event], known: dict[int, Any]) -> None:
    """A warm-up and a measured step: ``zero_grad(set_to_none=True)``, forward, backward,
    torch AdamW's step (its states at the first, foreach temporaries at each)."""
    from ckpt_core._meta.stand_ins import (
        _dropout,
        _grouped_mm_fallback,
        _needs_fallback,
        _sdpa_stand_in,
        no_data_dependent_mask_checks,
    )

    trainable = [p for p in model.parameters() if p.requires_grad]
    ids = torch.zeros(case.batch, case.seq, dtype=torch.long, device="meta")
    _register(ids, events, known)
    inputs: dict[str, Any] = {"input_ids": ids, "labels": ids, "use_cache": False}
    if model.config.is_encoder_decoder:  # a seq2seq collator's decoder inputs
        inputs["decoder_input_ids"] = torch.zeros_like(ids)
        _register(inputs["decoder_input_ids"], events, known)
    if case.padded:
        inputs["attention_mask"] = torch.ones_like(ids)
        _register(inputs["attention_mask"], events, known)
    log = _Log(events, known)
    # On meta tensors, sdpa's fused kernel, CUDA's fused dropout (a bool mask) and aten's
    # grouped matmul for experts not in bf16 (QLoRA's fp32 ones) stand in for the CPU ones;
    # patched module-wide, since a checkpoint's recompute runs on autograd's thread,
    # outside any torch-function mode.
    functional = torch.nn.functional
    originals = (functional.scaled_dot_product_attention, functional.dropout)
    grouped = functional.grouped_mm
    fused = _sdpa_stand_in(False)

    def sdpa(query: Any, *args: Any, **kwargs: Any) -> Any:
        return (fused if query.is_meta else originals[0])(query, *args, **kwargs)

    def dropout(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return (_dropout if tensor.is_meta else originals[1])(tensor, *args, **kwargs)

    def grouped_mm(mat_a: Any, *args: Any, **kwargs: Any) -> Any:
        return (_grouped_mm_fallback if _needs_fallback(mat_a) else grouped)(mat_a, *args, **kwargs)

    # PEFT's parametrized experts turn autocast off around their rebuilt stacks, which
    # torch refuses for meta; meta never autocasts, so it is a no-op there (as
    # transformers' own `maybe_autocast` makes it).
    autocast = torch.autocast

    def meta_autocast(device_type: str, *args: Any, enabled: bool = True, **kwargs: Any) -> Any:
        if device_type == "meta" and not enabled:
            return contextlib.nullcontext()
        return autocast(device_type, *args, enabled=enabled, **kwargs)

    functional.scaled_dot_product_attention, functional.dropout = sdpa, dropout
    functional.grouped_mm = grouped_mm
    torch.autocast = meta_autocast
    try:
        with no_data_dependent_mask_checks(padded=case.padded):
            for step in range(2):
                events.append(("mark", f"step{step}", 0, ""))
                for param in trainable:
                    param.grad = None
                with log:
                    out = model(**inputs)
                    events.append(("mark", "loss", 0, ""))
                    log.run_backward(out.loss)
                # AdamW skips a parameter without a gradient (one the forward never ran).
                stepped = [param for param in trainable if param.grad is not None]
                if step == 0:
                    for i, param in enumerate(stepped):
                        events.append(("malloc", ("exp_avg", i), param.nbytes, ""))
                        events.append(("malloc", ("exp_avg_sq", i), param.nbytes, ""))
                for i, param in enumerate(stepped):
                    events.append(("malloc", ("foreach", step, i), param.nbytes, ""))
                for i, _ in enumerate(stepped):
                    events.append(("free", ("foreach", step, i), 0, ""))
                del out
                with log:
                    log.poll()
    finally:
        functional.scaled_dot_product_attention, functional.dropout = originals
        functional.grouped_mm = grouped
        torch.autocast = autocast


def with_workspaces(events: list[Event], size: int) -> list[Event]:
    """cuBLAS's workspace, kept for good: after the output of the warm-up's first matmul
    (the Python thread's handle) and of its backward's first (autograd's device thread).
    bitsandbytes' ops are: the 4-bit one dequantizes, then calls ``F.linear``; the int8
    one adds its outlier columns' product by ``addmm`` (real activations have outliers,
    `ckpt_core._memory.linear_trace`; meta has none)."""
    out: list[Event] = []
    phase, done = "", set()
    for event in events:
        kind, key, _, label = event
        out.append(event)
        if kind == "mark":
            phase = key
        elif (
            kind == "malloc"
            and any(op in label for op in ("aten.mm", "addmm", "gemm_4bit", "int8_scaled_mm"))
            and phase in ("step0", "loss")
            and phase not in done
        ):
            done.add(phase)
            out.append(("malloc", ("workspace", phase), size, "workspace"))
    return out


def replay(events: list[Event]) -> tuple[int, int]:
    """(peak allocated over the measured step, peak reserved) through `CachingAllocator`."""
    allocator = CachingAllocator()
    handles: dict[Any, tuple[int, int]] = {}
    for kind, key, size, _ in events:
        if kind == "mark" and key == "step1":
            allocator.peak_allocated = allocator.allocated
        elif kind == "malloc":
            handles[key] = allocator.malloc(size)
        elif kind == "free" and key in handles:
            allocator.free(handles.pop(key))
    return allocator.peak_allocated, allocator.peak_reserved


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


def block_counts(case: Case, arch: Arch) -> ModeCounts:
    """A ``blocks:K`` case's assignment: K full blocks, the rest off (one kind of block)."""
    kinds = block_kinds(arch)
    if len(kinds) != 1:
        raise ValueError(f"{case.preset}: a blocks:K case needs a model of one kind of block")
    ((kind, blocks),) = kinds
    full = int(case.tier.removeprefix(BLOCKS))
    return ((("full", kind), full), (("off", kind), blocks - full))


def estimate(case: Case) -> tuple[int, int, int]:
    """The estimate's (allocated peak, reserved pool, cuBLAS workspace) for the case."""
    from ckpt_core._memory.advise import estimate_tiers

    run = prepared(case)
    assert run.recipe.trace is not None
    workspace = run.recipe.trace.blas_workspace
    if case.tier.startswith(BLOCKS):
        counts = block_counts(case, run.facts.arch)
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
