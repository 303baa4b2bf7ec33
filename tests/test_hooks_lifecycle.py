"""Hooks survive what trainers do to models, and undo cleanly.

deepcopy (reference / EMA models), pickle and ``torch.save(model)``, a second
install, removal, eval / no_grad, HF's own checkpointing already on, bad input.
"""

from __future__ import annotations

import copy
import functools
import io
import pickle
import subprocess
import sys

import pytest
import torch
from torch import nn

from ckpt_core._errors import CheckpointConflictError, CkptError, InvalidGranularityError
from ckpt_core._hooks.install import (
    install_checkpoint_hooks,
    install_selective_hooks,
    is_hf_checkpointing_enabled,
    is_hooked,
    remove_checkpoint_hooks,
)
from tests._tiny_models import loss_and_grads, tiny_batch, tiny_model


@pytest.fixture
def llama() -> nn.Module:
    return tiny_model("llama", dropout=0.1)


@pytest.fixture
def batch(llama: nn.Module) -> dict:
    return tiny_batch("llama", llama.config)


def _count_checkpoint_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import torch.utils.checkpoint as torch_checkpoint

    calls = [0]
    original = torch_checkpoint.checkpoint

    def counting(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(torch_checkpoint, "checkpoint", counting)
    return calls


# --- copies ------------------------------------------------------------------------


def test_deepcopy_trains_its_own_weights(llama: nn.Module, batch: dict) -> None:
    install_checkpoint_hooks(llama, "full")
    clone = copy.deepcopy(llama)
    with torch.no_grad():
        for p in clone.model.layers.parameters():
            p.mul_(0.5)  # the copy now differs from the original
    assert all(is_hooked(layer) for layer in clone.model.layers)
    loss_and_grads(clone, batch)
    assert all(p.grad is None for p in llama.parameters()), "grads landed on the original"
    assert all(p.grad is not None for p in clone.model.layers.parameters())
    # Bound to the copy: same result as an unhooked copy of the copy's weights.
    reference = copy.deepcopy(clone)
    remove_checkpoint_hooks(reference)
    torch.testing.assert_close(loss_and_grads(clone, batch)[0], loss_and_grads(reference, batch)[0])


def test_pickle_round_trip_keeps_hooks_working(llama: nn.Module, batch: dict) -> None:
    install_checkpoint_hooks(llama, "selective")
    expected = loss_and_grads(copy.deepcopy(llama), batch)[0]
    restored = pickle.loads(pickle.dumps(llama))
    assert [n for n, m in restored.named_modules() if is_hooked(m)] == [
        f"model.layers.{i}.self_attn" for i in range(3)
    ]
    attn = restored.model.layers[0].self_attn
    assert attn.forward.args[0] is attn  # bound to the unpickled module, not a stale one
    torch.testing.assert_close(loss_and_grads(restored, batch)[0], expected, rtol=0, atol=0)


def test_torch_save_and_load_round_trip_still_checkpoints(
    llama: nn.Module, batch: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_checkpoint_hooks(llama, "medium")
    buffer = io.BytesIO()
    torch.save(llama, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    calls = _count_checkpoint_calls(monkeypatch)
    loss_and_grads(loaded, batch)
    assert calls[0] == 2  # layers 0 and 2
    assert remove_checkpoint_hooks(loaded) == 2


# --- install / remove ---------------------------------------------------------------


def test_second_install_wraps_nothing_twice(llama: nn.Module, batch: dict) -> None:
    first = install_checkpoint_hooks(llama, "full")
    forwards = [layer.forward for layer in llama.model.layers]
    second = install_checkpoint_hooks(llama, "full")
    assert first.count == 3 and first.already_installed == 0
    assert second.count == 0 and second.hooked == ()
    assert second.already_installed == 3
    assert second.skipped == tuple((f"model.layers.{i}", "already hooked") for i in range(3))
    assert [layer.forward for layer in llama.model.layers] == forwards
    assert install_selective_hooks(llama, "full") == 0


def test_no_nesting_across_granularities(llama: nn.Module) -> None:
    install_checkpoint_hooks(llama, "full")
    report = install_checkpoint_hooks(llama, "selective")
    assert report.count == 0
    assert report.skipped[0] == (
        "model.layers.0.self_attn",
        "inside hooked module 'model.layers.0'",
    )
    remove_checkpoint_hooks(llama)
    install_checkpoint_hooks(llama, "selective")
    report = install_checkpoint_hooks(llama, "medium")
    assert report.count == 0
    assert report.skipped[0][1] == "contains hooked module 'model.layers.0.self_attn'"


def test_remove_restores_the_original_forward_exactly(llama: nn.Module, batch: dict) -> None:
    expected = loss_and_grads(copy.deepcopy(llama), batch)
    keys = list(llama.state_dict())
    names = [n for n, _ in llama.named_parameters()]
    install_checkpoint_hooks(llama, "full")
    assert list(llama.state_dict()) == keys
    assert [n for n, _ in llama.named_parameters()] == names
    assert remove_checkpoint_hooks(llama) == 3
    assert remove_checkpoint_hooks(llama) == 0
    for module in llama.modules():
        assert "forward" not in vars(module)
        assert "_ckpt_prev_forward" not in vars(module)
    assert type(llama.model.layers[0]).forward is llama.model.layers[0].forward.__func__
    actual = loss_and_grads(llama, batch)
    torch.testing.assert_close(actual[0], expected[0], rtol=0, atol=0)


def test_a_forward_already_on_the_instance_is_kept_and_restored() -> None:
    """E.g. accelerate's device-placement hook sets an instance forward first."""
    model = tiny_model("gpt2")
    block = model.transformer.h[0]
    calls: list[int] = []

    def placed_forward(module: nn.Module, *args: object, **kwargs: object) -> object:
        calls.append(1)
        return type(module).forward(module, *args, **kwargs)

    previous = functools.partial(placed_forward, block)
    block.forward = previous
    install_checkpoint_hooks(model, "full")
    assert is_hooked(block)
    loss_and_grads(model, tiny_batch("gpt2", model.config))
    assert len(calls) == 2  # forward + recompute both go through the previous forward
    remove_checkpoint_hooks(model)
    assert block.forward is previous


# --- when the hooks do nothing ------------------------------------------------------


def test_eval_and_no_grad_pay_nothing(
    llama: nn.Module, batch: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_checkpoint_hooks(llama, "full")
    calls = _count_checkpoint_calls(monkeypatch)
    with torch.no_grad():
        llama(**batch)
    llama.eval()
    llama(**batch).loss.backward()
    assert calls[0] == 0
    llama.train()
    llama(**batch).loss.backward()
    assert calls[0] == 3


def test_eval_output_is_unchanged(batch: dict) -> None:
    model = tiny_model("llama", dropout=0.1).eval()
    with torch.no_grad():
        expected = model(**batch).logits
    install_checkpoint_hooks(model, "full")
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, expected)


# --- HF's own checkpointing ---------------------------------------------------------


def test_refuses_to_stack_on_hf_checkpointing(llama: nn.Module, batch: dict) -> None:
    assert not is_hf_checkpointing_enabled(llama)
    llama.activation_checkpointing_enable(every_n_layers=2)
    assert is_hf_checkpointing_enabled(llama)
    with pytest.raises(CheckpointConflictError, match="already on") as info:
        install_checkpoint_hooks(llama, "selective")
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, CkptError)
    assert not any(is_hooked(m) for m in llama.modules())
    report = install_checkpoint_hooks(llama, "selective", allow_nested=True)
    assert report.count == 3
    loss_and_grads(llama, batch)  # nested regions still train
    llama.activation_checkpointing_disable()
    assert not is_hf_checkpointing_enabled(llama)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_hf_checkpointing_is_seen_through_peft() -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model("llama"), LoraConfig(r=2, target_modules=["q_proj"]))
    assert not is_hf_checkpointing_enabled(model)
    model.base_model.model.activation_checkpointing_enable()
    assert is_hf_checkpointing_enabled(model)
    with pytest.raises(CheckpointConflictError):
        install_checkpoint_hooks(model, "full")


# --- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["ful", "fulll", "auto", "", "selective-ish", None, 1, True])
def test_unknown_granularity_is_a_value_error(llama: nn.Module, bad: object) -> None:
    with pytest.raises(InvalidGranularityError, match="full, medium, selective") as info:
        install_checkpoint_hooks(llama, bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert info.value.field == "granularity"
    with pytest.raises(ValueError):
        install_selective_hooks(llama, bad)  # type: ignore[arg-type]
    assert not any(is_hooked(m) for m in llama.modules())


def test_granularity_is_trimmed_and_case_insensitive(llama: nn.Module) -> None:
    assert install_checkpoint_hooks(llama, " Selective ").granularity == "selective"


def test_seed_entry_point_returns_the_count(llama: nn.Module) -> None:
    assert install_selective_hooks(llama, "medium") == 2
    assert install_selective_hooks(llama, "medium") == 0


def test_importing_the_hook_modules_loads_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, ckpt_core._hooks.install, ckpt_core._hooks.blocks; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_remove_by_name_leaves_other_hooks_in_place() -> None:
    from ckpt_core._hooks.install import remove_checkpoint_hooks

    model = tiny_model("llama")
    report = install_checkpoint_hooks(model, "selective")
    first, *rest = report.hooked
    assert remove_checkpoint_hooks(model, [first, "no.such.module"]) == 1
    still = [name for name, module in model.named_modules() if "forward" in module.__dict__]
    assert still == rest
    assert remove_checkpoint_hooks(model) == len(rest)
