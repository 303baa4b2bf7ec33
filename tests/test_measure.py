"""The meta-device activation measurement: ground truth checks and its handling of models.

- Counting: on CPU with real tensors, ``measure_activation_bytes`` agrees with
  ``torch.distributed._tools.mem_tracker.MemTracker``'s activation category.
- Meta stand-ins: the meta measurement agrees with the same model run with real
  tensors on CPU, whose sdpa is a fused (flash) kernel keeping q, k, v, output
  and log-sum-exp - for layouts where the CPU kernel writes its output the way
  CUDA's does (separate q / k / v projections).
- Hooks, dtype, training flag and transformers' patched function are left as
  they were found; bad input is a clear error.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import masking_utils

from ckpt_core import (
    CheckpointConflictError,
    InvalidGranularityError,
    InvalidWorkloadError,
    install_checkpoint_hooks,
)
from ckpt_core._hooks.install import is_hooked
from ckpt_core._meta.measure import measure_activation_bytes
from tests._tiny_models import tiny_model

TIERS = ("off", "selective", "medium", "full")
BATCH, SEQ = 2, 64


def _tiny(arch: str, attention: str, **overrides: object) -> torch.nn.Module:
    sizes = {}
    if arch in ("llama", "qwen3", "mixtral"):
        sizes = {"hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4}
    return tiny_model(arch, attn_implementation=attention, dropout=0.0, **{**sizes, **overrides})


def _mem_tracker_activations(model: torch.nn.Module, granularity: str) -> int:
    """MemTracker's ACT bytes alive after a training forward with labels (loss kept)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from ckpt_core import remove_checkpoint_hooks

    if granularity != "off":
        install_checkpoint_hooks(model, granularity)
    ids = torch.randint(3, 90, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    tracker = MemTracker()
    tracker.track_external(model)
    try:
        with tracker:
            kwargs = {} if model.config.model_type == "bert" else {"use_cache": False}
            loss = model(input_ids=ids, labels=ids, **kwargs).loss
            snapshot = tracker.get_tracker_snapshot()
        del loss
    finally:
        remove_checkpoint_hooks(model)
    (device,) = (key for key in snapshot if key.type == "cpu")
    return next(value for key, value in snapshot[device].items() if str(key).endswith("ACT"))


@pytest.mark.parametrize(
    ("arch", "attention"),
    [("llama", "eager"), ("llama", "sdpa"), ("gpt2", "eager"), ("t5", "sdpa"), ("bert", "sdpa")],
)
def test_counting_agrees_with_mem_tracker_on_cpu(arch: str, attention: str) -> None:
    model = _tiny(arch, attention).float()
    for tier in TIERS:
        ours = measure_activation_bytes(
            model, tier, seq_len=SEQ, micro_batch_size=BATCH, dtype="fp32", attention=attention
        )
        tracked = _mem_tracker_activations(model, tier)
        assert ours == pytest.approx(tracked, rel=0.02), tier


def _assert_meta_agrees(
    real: torch.nn.Module, attention: str, dtype: str, *, padded: bool = False
) -> None:
    """Every tier measures the same bytes (within 2%) on meta as on `real` CPU tensors."""
    meta = copy.deepcopy(real).to("meta")
    shape = {"seq_len": SEQ, "micro_batch_size": BATCH, "dtype": dtype, "attention": attention}
    for tier in TIERS:
        measured = [
            measure_activation_bytes(model, tier, **shape, padded=padded) for model in (real, meta)
        ]
        assert measured[1] == pytest.approx(measured[0], rel=0.02), tier


@pytest.mark.parametrize(
    ("arch", "attention", "kv_heads"),
    [("llama", "sdpa", 4), ("llama", "sdpa", 2), ("llama", "eager", 2), ("qwen3", "sdpa", 2)],
)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_meta_agrees_with_real_tensors_on_cpu(
    arch: str, attention: str, kv_heads: int, dtype: str
) -> None:
    """Meta measures what a GPU keeps.  fp32 grouped heads are the exception CPU makes:
    sdpa gets them with ``enable_gqa``, which CPU's flash kernel takes in fp32, and
    CUDA's only in fp16 / bf16, so CUDA and meta run the math backend and keep more."""
    real = _tiny(arch, attention, num_key_value_heads=kv_heads)
    if attention == "sdpa" and dtype == "fp32" and kv_heads < real.config.num_attention_heads:
        shape = {"seq_len": SEQ, "micro_batch_size": BATCH, "dtype": dtype}
        meta = copy.deepcopy(real).to("meta")
        kept = [measure_activation_bytes(model, "off", **shape) for model in (real, meta)]
        assert kept[1] > kept[0]
        return
    _assert_meta_agrees(real, attention, dtype)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_padded_batch_measures_on_meta_what_real_tensors_keep(attention: str) -> None:
    """On CPU the mask really pads a token; on meta the mask checks answer "padded".  With
    sdpa and grouped heads, padding costs the repeated K / V and a float mask per layer."""
    real = _tiny("llama", attention, num_key_value_heads=2)
    _assert_meta_agrees(real, attention, "bf16", padded=True)
    shape = {"seq_len": SEQ, "micro_batch_size": BATCH, "attention": attention}
    padded = measure_activation_bytes(real, "off", **shape, padded=True)
    unpadded = measure_activation_bytes(real, "off", **shape)
    assert padded > unpadded if attention == "sdpa" else padded == unpadded


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_meta_agrees_with_real_tensors_on_bart(attention: str, dtype: str) -> None:
    """BART's decoder fills an all-ones padding mask when given none, and sdpa's
    "can the mask be skipped" check reads it (``Tensor.item()``, impossible on
    meta).  On meta it must be skipped as on real tensors: a materialised mask
    would be kept as an s x s bias per decoder layer.  (bf16: CPU's LayerNorm
    keeps its mean / rstd in bf16, CUDA's and meta's in fp32 - about 1% here.)
    """
    _assert_meta_agrees(_tiny("bart", attention), attention, dtype)


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_decoder_input_ids_measure_what_the_models_own_label_shift_keeps(
    arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The measurement passes decoder ids itself; the model's own shift of the labels keeps the
    same bytes (a new tensor of the same shape and dtype)."""
    import ckpt_core._meta.measure as measure_module

    model = _tiny(arch, "sdpa").to("meta")
    ours = measure_activation_bytes(model, "off", seq_len=SEQ, micro_batch_size=BATCH)
    own_shift = measure_module._inputs

    def without_decoder_ids(
        model: torch.nn.Module, ids: torch.Tensor, *, padded: bool
    ) -> dict[str, object]:
        inputs = own_shift(model, ids, padded=padded)
        assert inputs.pop("decoder_input_ids").shape == ids.shape
        return inputs

    monkeypatch.setattr(measure_module, "_inputs", without_decoder_ids)
    shifted = measure_activation_bytes(model, "off", seq_len=SEQ, micro_batch_size=BATCH)
    assert ours == shifted


@pytest.mark.parametrize("on_meta", [True, False])
def test_t5_without_decoder_start_token_measures_the_same_bytes(on_meta: bool) -> None:
    """HF's ``_shift_right`` fails without ``decoder_start_token_id``; token values change no
    memory, so the measurement must not need one."""
    measured = []
    for start in (0, None):
        model = _tiny("t5", "sdpa", decoder_start_token_id=start)
        model = model.to("meta") if on_meta else model
        for tier in TIERS:
            measured.append(
                measure_activation_bytes(model, tier, seq_len=SEQ, micro_batch_size=BATCH)
            )
    with pytest.raises(ValueError, match="decoder_start_token_id"):  # the model's own shift
        model._shift_right(torch.zeros(BATCH, SEQ, dtype=torch.long, device=model.device))
    assert measured[len(TIERS) :] == measured[: len(TIERS)]
    assert all(size > 0 for size in measured)


def test_fused_attention_keeps_no_scores_and_eager_does() -> None:
    """Doubling the sequence doubles fused activations; eager grows faster (s x s)."""
    growth = {}
    for attention in ("sdpa", "eager"):
        model = _tiny("llama", attention, num_layers=1).to("meta")
        small, large = (
            measure_activation_bytes(
                model, "off", seq_len=s, micro_batch_size=1, attention=attention
            )
            for s in (512, 1024)
        )
        growth[attention] = large / small
    assert growth["sdpa"] == pytest.approx(2.0, rel=0.01)
    assert growth["eager"] > 2.5


def test_meta_dropout_keeps_one_byte_masks() -> None:
    """CUDA's fused dropout keeps a bool mask: each GPT-2 dropout adds one byte per element."""
    sizes = {}
    for p in (0.0, 0.1):
        model = tiny_model("gpt2", attn_implementation="sdpa", num_layers=1, dropout=p).to("meta")
        sizes[p] = measure_activation_bytes(model, "off", seq_len=SEQ, micro_batch_size=BATCH)
    hidden = model.config.n_embd
    # embedding dropout, attention residual dropout, MLP dropout (attention's own is fused)
    assert sizes[0.1] - sizes[0.0] == 3 * BATCH * SEQ * hidden


def test_installs_and_removes_its_own_hooks_and_restores_the_model() -> None:
    model = _tiny("llama", "sdpa").to("meta")
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    model.eval()
    patched = ("find_packed_sequence_indices", "_ignore_causal_mask_sdpa",
               "_ignore_bidirectional_mask_sdpa")  # fmt: skip
    originals = {name: getattr(masking_utils, name) for name in patched}
    measure_activation_bytes(model, "full", seq_len=SEQ, micro_batch_size=1, dtype="bf16")
    assert not any(is_hooked(module) for module in model.modules())
    assert {name: p.dtype for name, p in model.named_parameters()} == dtypes
    assert not model.training
    assert {name: getattr(masking_utils, name) for name in patched} == originals


def test_uses_hooks_already_installed_for_the_same_granularity() -> None:
    model = _tiny("llama", "sdpa").to("meta")
    fresh = measure_activation_bytes(model, "medium", seq_len=SEQ, micro_batch_size=1)
    report = install_checkpoint_hooks(model, "medium")
    assert measure_activation_bytes(model, "medium", seq_len=SEQ, micro_batch_size=1) == fresh
    assert sorted(n for n, m in model.named_modules() if is_hooked(m)) == sorted(report.hooked)


def test_hooks_for_another_granularity_or_off_are_errors() -> None:
    model = _tiny("llama", "sdpa").to("meta")
    install_checkpoint_hooks(model, "selective")
    for granularity in ("full", "off", None):
        with pytest.raises(InvalidGranularityError) as raised:
            measure_activation_bytes(model, granularity, seq_len=SEQ, micro_batch_size=1)
        assert raised.value.field == "granularity"
    assert sum(1 for m in model.modules() if is_hooked(m)) == 3  # the caller's, untouched


def test_hf_checkpointing_on_is_a_conflict() -> None:
    model = _tiny("llama", "sdpa").to("meta")
    model.activation_checkpointing_enable()
    with pytest.raises(CheckpointConflictError):
        measure_activation_bytes(model, "off", seq_len=SEQ, micro_batch_size=1)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"seq_len": 0, "micro_batch_size": 1}, "workload.seq_len"),
        ({"seq_len": 8, "micro_batch_size": True}, "workload.micro_batch_size"),
        ({"seq_len": 8, "micro_batch_size": 1, "dtype": "fp8"}, "workload.dtype"),
        ({"seq_len": 8, "micro_batch_size": 1, "attention": "flex"}, "workload.attention"),
        ({"seq_len": 4096, "micro_batch_size": 1}, "workload.seq_len"),  # GPT-2 has 64 positions
    ],
)
def test_bad_sizes_are_workload_errors(kwargs: dict[str, object], field: str) -> None:
    model = tiny_model("gpt2", num_layers=1).to("meta")
    with pytest.raises(InvalidWorkloadError) as raised:
        measure_activation_bytes(model, "off", **kwargs)  # type: ignore[arg-type]
    assert raised.value.field == field


@pytest.mark.parametrize("granularity", ["fulll", "", 1, "attention"])
def test_bad_granularity_is_an_error(granularity: object) -> None:
    model = _tiny("llama", "sdpa").to("meta")
    with pytest.raises(InvalidGranularityError):
        measure_activation_bytes(model, granularity, seq_len=SEQ, micro_batch_size=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("weight_trained", [False, True])
def test_a_grouped_matmul_not_in_bf16_keeps_what_atens_autograd_keeps(
    weight_trained: bool,
) -> None:
    """Meta refuses grouped matmuls not in bf16 (QLoRA's fp32 experts); the stand-in
    keeps each input only for the other's gradient, as aten's generated autograd code
    does, and makes a gradient only for an input that requires one: a frozen stack keeps
    the weight alone (for the rows' gradient) and the offsets, and gets no gradient."""
    from ckpt_core._meta.stand_ins import meta_kernels

    rows = torch.empty(64, 32, device="meta", requires_grad=True)
    stack = torch.empty(4, 32, 16, device="meta", requires_grad=weight_trained)
    offsets = torch.empty(4, dtype=torch.int32, device="meta")
    saved: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.nbytes)
        return tensor

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
    with hooks, meta_kernels(flash=False):
        out = torch.nn.functional.grouped_mm(rows, stack, offs=offsets)
    kept = [stack.nbytes, offsets.nbytes] + ([rows.nbytes] if weight_trained else [])
    assert sorted(saved) == sorted(kept)
    out.sum().backward()
    assert rows.grad is not None and rows.grad.shape == rows.shape
    assert (stack.grad is not None) == weight_trained
