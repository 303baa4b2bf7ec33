"""Checkpoint hooks change memory, never results: loss and every gradient match.

Each case trains one step of a tiny random-init model twice from the same RNG
state - once plain, once with hooks - with dropout on wherever the config has a
knob, a right-padded batch with an attention mask, labels (HF computes the
loss) and the config's default ``use_cache`` (True for decoders: the seed
crashed there because recomputation updated the KV cache a second time).
"""

from __future__ import annotations

import copy

import pytest
import torch

from ckpt_core._hooks.install import install_checkpoint_hooks
from tests._tiny_models import ARCHS, loss_and_grads, tiny_batch, tiny_model

GRANULARITIES = ("full", "medium", "selective")
DROPOUT = 0.1
# fp32 noise only.  On CPU most cases are bit-exact; T5 with dropout differs
# in the last bits, exactly as much as HF's own checkpointing does (checked in
# test_hf_native_checkpointing_has_the_same_t5_noise).  A wrong dropout mask or
# a missing gradient path is orders of magnitude above these tolerances
# (test_tolerance_catches_a_different_dropout_mask).
RTOL, ATOL = 1e-5, 1e-6


def assert_same_step(expected: tuple, actual: tuple) -> None:
    """Loss and every parameter gradient equal (None only where both are None)."""
    loss0, grads0 = expected
    loss1, grads1 = actual
    torch.testing.assert_close(loss1, loss0, rtol=RTOL, atol=ATOL)
    assert grads1.keys() == grads0.keys()
    reached = 0
    for name, grad0 in grads0.items():
        grad1 = grads1[name]
        if grad0 is None or grad1 is None:
            assert grad0 is None and grad1 is None, f"{name}: gradient reached only one run"
            continue
        torch.testing.assert_close(grad1, grad0, rtol=RTOL, atol=ATOL, msg=name)
        reached += 1
    assert reached > 0.8 * len(grads0), "most parameters must receive a gradient"


def _compare(arch: str, granularity: str, **overrides: object) -> None:
    model = tiny_model(arch, dropout=DROPOUT, **overrides)
    assert getattr(model.config.get_text_config(), "use_cache", True) is not False
    batch = tiny_batch(arch, model.config)
    expected = loss_and_grads(copy.deepcopy(model), batch)
    report = install_checkpoint_hooks(model, granularity)
    assert report.count > 0
    assert_same_step(expected, loss_and_grads(model, batch))


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("arch", ARCHS)
def test_hooked_step_equals_plain_step(arch: str, granularity: str) -> None:
    _compare(arch, granularity)


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2", "falcon", "bart", "t5", "llava"])
def test_hooked_step_equals_plain_step_with_eager_attention(arch: str, granularity: str) -> None:
    _compare(arch, granularity, attn_implementation="eager")


def test_tolerance_catches_a_different_dropout_mask() -> None:
    """Negative control: another dropout draw is far outside the tolerance."""
    model = tiny_model("llama", dropout=DROPOUT)
    batch = tiny_batch("llama", model.config)
    first = loss_and_grads(model, batch, seed=1)
    second = loss_and_grads(model, batch, seed=2)
    with pytest.raises(AssertionError):
        assert_same_step(first, second)


def test_hf_native_checkpointing_has_the_same_t5_noise() -> None:
    """HF's own full checkpointing shows T5's last-bit noise too: it is not the hooks."""
    model = tiny_model("t5", dropout=DROPOUT)
    batch = tiny_batch("t5", model.config)
    expected = loss_and_grads(copy.deepcopy(model), batch)
    native = copy.deepcopy(model)
    native.activation_checkpointing_enable()
    hooked = copy.deepcopy(model)
    install_checkpoint_hooks(hooked, "full")
    native_step, hooked_step = loss_and_grads(native, batch), loss_and_grads(hooked, batch)
    assert_same_step(expected, native_step)
    # Ours and HF's run the same computation, so they agree with each other bit for bit.
    assert torch.equal(native_step[0], hooked_step[0])
    for name, grad in native_step[1].items():
        other = hooked_step[1][name]
        assert (grad is None and other is None) or torch.equal(grad, other), name


# --- PEFT ------------------------------------------------------------------------


def _lora(model: object) -> object:
    from peft import LoraConfig, get_peft_model

    # init_lora_weights=False: B is random too, so LoRA A gets a non-zero gradient.
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=DROPOUT,
        target_modules=["q_proj", "v_proj"],
        init_lora_weights=False,
    )
    return get_peft_model(model, config)


# PEFT's own constructor reads HF's deprecated alias; not ours to fix.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_peft_lora_step_equals_plain_peft_step(granularity: str) -> None:
    peft_model = _lora(tiny_model("llama", dropout=DROPOUT))
    batch = tiny_batch("llama", peft_model.config)
    expected = loss_and_grads(copy.deepcopy(peft_model), batch)
    report = install_checkpoint_hooks(peft_model, granularity)
    assert report.count > 0
    # The names are the PEFT-wrapped ones, and LoRA sits inside what is hooked.
    assert all(name.startswith("base_model.model.model.layers.") for name in report.hooked)
    actual = loss_and_grads(peft_model, batch)
    assert_same_step(expected, actual)
    lora_grads = [g for n, g in actual[1].items() if "lora_" in n]
    assert lora_grads and all(g is not None and g.abs().sum() > 0 for g in lora_grads)
