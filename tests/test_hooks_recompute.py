"""What the hooks recompute, what it costs, and what the checkpoint region sees.

Recompute is measured directly: forward pre-hooks count how often each module
runs in one forward + backward, and ``FlopCounterMode`` totals the FLOPs.  HF's
own activation checkpointing (non-reentrant) is the reference for full and
medium.
"""

from __future__ import annotations

import collections
import copy

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ckpt_core._hooks.install import install_checkpoint_hooks
from tests._tiny_models import ARCHS, tiny_batch, tiny_model

COUNT_ARCHS = ("llama", "qwen2_moe", "gpt2", "t5", "bart", "bert", "llava")


def _step(model: nn.Module, batch: dict) -> None:
    torch.manual_seed(0)
    model(**batch).loss.backward()


def forward_counts(model: nn.Module, batch: dict) -> collections.Counter:
    """How many times each module's forward ran in one forward + backward."""
    counts: collections.Counter = collections.Counter()
    handles = [
        module.register_forward_pre_hook(lambda _m, _a, name=name: counts.update([name]))
        for name, module in model.named_modules()
    ]
    try:
        _step(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    return counts


def total_flops(model: nn.Module, batch: dict) -> int:
    with FlopCounterMode(display=False) as counter:
        _step(model, batch)
    return counter.get_total_flops()


def _descendants(names: tuple[str, ...], all_names: list[str]) -> set[str]:
    return {n for n in all_names for h in names if n.startswith(h + ".")}


def _hf(model: nn.Module, every_n_layers: int) -> nn.Module:
    native = copy.deepcopy(model)
    native.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=every_n_layers
    )
    return native


@pytest.mark.parametrize("granularity", ["full", "medium", "selective"])
@pytest.mark.parametrize("arch", COUNT_ARCHS)
def test_each_hooked_region_is_recomputed_exactly_once(arch: str, granularity: str) -> None:
    model = tiny_model(arch, dropout=0.1)
    batch = tiny_batch(arch, model.config)
    plain = forward_counts(copy.deepcopy(model), batch)
    report = install_checkpoint_hooks(model, granularity)
    hooked = forward_counts(model, batch)
    extra = {name: hooked[name] - plain[name] for name in hooked if hooked[name] != plain[name]}
    # Everything inside a hooked module runs once more; nothing else does, and
    # the hooked module itself is called once (its hooks stay outside the region).
    expected = _descendants(report.hooked, list(plain))
    assert extra == dict.fromkeys(expected, 1)
    if granularity == "selective":
        assert extra and not [n for n in extra if "mlp" in n or "expert" in n]


@pytest.mark.parametrize(("granularity", "every_n_layers"), [("full", 1), ("medium", 2)])
@pytest.mark.parametrize("arch", COUNT_ARCHS)
def test_recompute_matches_hf_native_checkpointing(
    arch: str, granularity: str, every_n_layers: int
) -> None:
    model = tiny_model(arch, dropout=0.1)
    batch = tiny_batch(arch, model.config)
    native = _hf(model, every_n_layers)
    install_checkpoint_hooks(model, granularity)
    assert forward_counts(model, batch) == forward_counts(native, batch)


@pytest.mark.parametrize("arch", ARCHS)
def test_flops_full_and_medium_equal_hf_and_reinstall_changes_nothing(arch: str) -> None:
    model = tiny_model(arch)
    batch = tiny_batch(arch, model.config)
    plain = total_flops(copy.deepcopy(model), batch)
    costs = {}
    for granularity, every_n_layers in (("full", 1), ("medium", 2)):
        ours = copy.deepcopy(model)
        install_checkpoint_hooks(ours, granularity)
        costs[granularity] = total_flops(ours, batch)
        assert costs[granularity] == total_flops(_hf(model, every_n_layers), batch)
        second = install_checkpoint_hooks(ours, granularity)
        assert second.count == 0
        assert total_flops(ours, batch) == costs[granularity]
    selective = copy.deepcopy(model)
    install_checkpoint_hooks(selective, "selective")
    costs["selective"] = total_flops(selective, batch)
    assert plain < costs["selective"] < costs["full"]
    assert plain < costs["medium"] < costs["full"]


# --- what the checkpoint region receives -----------------------------------------


@pytest.mark.parametrize("arch", ["llama", "bart", "t5"])
def test_hidden_states_reach_checkpoint_positionally(
    arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF calls attention with keywords only; the accelerator RNG must still see them.

    Non-reentrant checkpoint stashes device RNG state for the devices of the
    tensors it gets in ``get_device_states(*args)`` - positional ones only.  On
    CPU it skips that call unless the CUDA module claims to be initialised, so
    the test says it is and records what arrives.
    """
    import torch.utils.checkpoint as torch_checkpoint

    received: list[tuple] = []

    def record(*args: object) -> tuple[list, list]:
        received.append(args)
        return [], []

    monkeypatch.setattr(torch_checkpoint, "get_device_states", record)
    # The device module non-reentrant checkpoint consults for CPU-only inputs
    # (torch.cpu on a CPU build, torch.cuda where CUDA is the default type).
    device_module = torch_checkpoint._get_device_module(
        torch_checkpoint.DefaultDeviceType.get_device_type()
    )
    monkeypatch.setattr(device_module, "_initialized", True, raising=False)
    model = tiny_model(arch)
    batch = tiny_batch(arch, model.config)
    report = install_checkpoint_hooks(model, "selective")
    modules = dict(model.named_modules())
    seen_inputs: list[torch.Tensor] = []
    for name in report.hooked:
        modules[name].register_forward_pre_hook(
            lambda _m, args, kwargs: seen_inputs.append(
                args[0] if args else kwargs.get("hidden_states")
            ),
            with_kwargs=True,
        )
    _step(model, batch)
    assert len(received) == len(report.hooked) == len(seen_inputs)
    for hidden, args in zip(seen_inputs, received, strict=True):
        assert isinstance(hidden, torch.Tensor)
        assert any(a is hidden for a in args), "hidden states not passed positionally"


def test_kv_cache_is_never_updated_during_checkpointed_regions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """use_cache=True in training: hooked layers get no cache, so none is updated twice."""
    from transformers import DynamicCache

    updates: collections.Counter = collections.Counter()
    original_update = DynamicCache.update

    def counting_update(
        self: DynamicCache, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *a, **k
    ):
        updates[layer_idx] += 1
        return original_update(self, key, value, layer_idx, *a, **k)

    monkeypatch.setattr(DynamicCache, "update", counting_update)
    model = tiny_model("llama", attn_implementation="eager")
    assert model.config.use_cache
    batch = tiny_batch("llama", model.config)
    _step(copy.deepcopy(model), batch)
    assert updates == {0: 1, 1: 1, 2: 1}  # no hooks: each layer writes its cache once
    updates.clear()
    install_checkpoint_hooks(model, "medium")  # layers 0 and 2
    _step(model, batch)
    assert updates == {1: 1}
