"""A real model's training step on the meta device, as the allocator would see it.

`record_step` logs every storage's malloc and free, in the order autograd makes
them, over the load, a warm-up step and the measured step (`bench.op_order`'s
reference); `with_workspaces` adds the cuBLAS workspaces and `replay` runs the
events through the project's `CachingAllocator`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bench._meta_kernels import Event, kernel_buffers_after, kernel_buffers_before
from ckpt_core._memory.allocator import CachingAllocator
from ckpt_core._meta.stand_ins import math_backend_running


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


def record_step(
    model: Any,
    *,
    batch: int,
    seq: int,
    padded: bool,
    kbit_prepared: bool,
    loaded_in_fp32: frozenset[str] = frozenset(),
) -> list[Event]:
    """The mallocs and frees of ``model``'s load, a warm-up step and the measured step on a
    (``batch``, ``seq``) batch of token ids (``padded``: with an attention mask);
    ``kbit_prepared``: PEFT's kbit preparation cast the unquantized parameters to fp32;
    ``loaded_in_fp32``: names of the modules loaded in fp32 already (T5's ``wo`` in an
    fp16 load), which the preparation leaves as they are."""
    events: list[Event] = []
    known: dict[int, Any] = {}
    _record_load(model, loaded_in_fp32, kbit_prepared, events, known)
    _record_steps(model, events, known, batch=batch, seq=seq, padded=padded)
    return events


def _register(tensor: Any, events: list[Event], known: dict[int, Any]) -> None:
    storage = tensor.untyped_storage()
    if storage._cdata not in known:
        known[storage._cdata] = StorageWeakRef(storage)
        events.append(("malloc", storage._cdata, storage.nbytes(), "load"))


def _record_load(
    model: Any,
    loaded_in_fp32: frozenset[str],
    prepared: bool,
    events: list[Event],
    known: dict[int, Any],
) -> None:
    """The load as the estimate replays it: each quantized weight from a compute-dtype
    copy; once all is loaded, kbit preparation's fp32 copy of every other parameter (a
    tied one once) but those of modules ``loaded_in_fp32``, each freeing its loaded copy;
    the adapters last."""
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
            elif (
                prepared
                and param.dtype == torch.float32
                and name.rpartition(".")[2] not in loaded_in_fp32
            ):
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


def _record_steps(
    model: Any, events: list[Event], known: dict[int, Any], *, batch: int, seq: int, padded: bool
) -> None:
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
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    _register(ids, events, known)
    inputs: dict[str, Any] = {"input_ids": ids, "labels": ids, "use_cache": False}
    if model.config.is_encoder_decoder:  # a seq2seq collator's decoder inputs
        inputs["decoder_input_ids"] = torch.zeros_like(ids)
        _register(inputs["decoder_input_ids"], events, known)
    if padded:
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
        with no_data_dependent_mask_checks(padded=padded):
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
