"""The real-recipe workload fields: defaults, validation, and what each changes in the estimate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from ckpt_core import InvalidWorkloadError, make_plan
from ckpt_core._memory.activations import activation_bytes
from ckpt_core._memory.estimate import NF4_BYTES_PER_WEIGHT, NF4_DOUBLE_QUANT_BYTES_PER_WEIGHT
from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
from ckpt_core._memory.peak import allocated_moments
from ckpt_core._memory.peak_model import tier_memory
from ckpt_core._memory.step_trace import simulate
from ckpt_core._planning.workload import Workload
from tests._tiny_models import tiny_model

MODEL = {"preset": "llama-3.2-1b"}
QLORA = {"seq_len": 1024, "method": "qlora", "dtype": "fp16", "lora_targets": ["q_proj", "v_proj"]}


def run_for(**workload: Any):
    return prepare(model_facts(MODEL), parse_workload(workload))


def test_defaults_match_what_people_run() -> None:
    workload = Workload(seq_len=512)
    assert workload.double_quant is False  # BitsAndBytesConfig's default
    assert workload.kbit_preparation == "peft"  # prepare_model_for_kbit_training
    assert workload.compute == "loaded"
    assert workload.gradients == "set_to_none"  # torch's zero_grad default
    assert workload.logits_held is True
    assert workload.padded is False  # one sequence per row, or packed without padding
    assert workload.sdpa_backend == "auto"  # torch picks sdpa's kernel
    # HF Trainer / TRL move an unquantized model with .to(); bitsandbytes needs a device map.
    assert workload.load_path is None
    assert workload.loaded_with_device_map is False
    assert Workload(seq_len=512, method="qlora").loaded_with_device_map is True


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("double_quant", "yes"),
        ("double_quant", 1),
        ("kbit_preparation", "manual"),
        ("compute", "amp"),
        ("gradients", "zero"),
        ("load_path", "cuda"),
        ("load_path", True),
        ("logits_held", None),
        ("padded", "true"),
        ("padded", 0),
        ("sdpa_backend", "flash"),
        ("sdpa_backend", None),
    ],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidWorkloadError) as error:
        Workload.from_dict({"seq_len": 512, field: value})
    assert error.value.field == f"workload.{field}"


def test_autocast_needs_a_half_dtype_and_fp32_weights() -> None:
    with pytest.raises(InvalidWorkloadError) as error:
        Workload(seq_len=512, dtype="fp32", compute="autocast")
    assert error.value.field == "workload.compute"
    with pytest.raises(InvalidWorkloadError):
        Workload(seq_len=512, weights="bf16", compute="autocast")
    assert Workload(seq_len=512, compute="autocast").weight_storage == "fp32"


def test_nf4_storage_with_and_without_double_quantization() -> None:
    plain, double = run_for(**QLORA), run_for(**QLORA, double_quant=True)
    layout = model_facts(MODEL).layout
    quantized = sum(linear.weights for linear in layout.linears)
    saved = plain.static.weights - double.static.weights
    assert saved == pytest.approx(
        quantized * (NF4_BYTES_PER_WEIGHT - NF4_DOUBLE_QUANT_BYTES_PER_WEIGHT), abs=2
    )
    assert NF4_BYTES_PER_WEIGHT * 8 == 4.5  # 4 bits + an fp32 absmax per 64 weights


def test_kbit_preparation_puts_the_rest_in_fp32_and_the_hidden_states_too() -> None:
    prepared, unprepared = run_for(**QLORA), run_for(**QLORA, kbit_preparation="none")
    layout = model_facts(MODEL).layout
    kept = layout.total - sum(linear.weights for linear in layout.linears)
    assert prepared.static.weights - unprepared.static.weights == 2 * kept  # fp32 vs fp16
    assert (prepared.step.dtype_bytes, unprepared.step.dtype_bytes) == (4, 2)
    assert run_for(**{**QLORA, "method": "lora"}).step.dtype_bytes == 2  # no quantization


@pytest.mark.parametrize("tier", ["off", "full"])
def test_prepared_qlora_activations_match_the_meta_measurement(tier: str) -> None:
    """PEFT's kbit preparation runs every hidden state in fp32: measured as the fp32 PEFT model.

    bitsandbytes' frozen linears keep nothing of their input (MatMul4Bit
    saves only the weight), as a frozen fp32 ``nn.Linear`` on meta.
    """
    from peft import LoraConfig, get_peft_model

    from ckpt_core._configs.model_config import build_meta_model, load_model_config
    from ckpt_core._meta.measure import measure_activation_bytes

    base = build_meta_model(load_model_config(MODEL), attention="sdpa").to(torch.float32)
    model = get_peft_model(base, LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    measured = measure_activation_bytes(model, tier, seq_len=1024, micro_batch_size=1, dtype="fp32")
    run = run_for(**QLORA)
    assert activation_bytes(run.facts.arch, run.step, tier) == pytest.approx(measured, rel=0.02)


def test_accumulated_gradients_raise_the_peak_of_a_full_fine_tune() -> None:
    workload = {"seq_len": 1024, "optimizer": "sgd"}
    fresh = make_plan("full", model=MODEL, workload=workload).estimate["tiers"]["full"]
    held = make_plan("full", model=MODEL, workload={**workload, "gradients": "accumulate"})
    gradients = held.estimate["assumptions"]["gradients_bytes"]
    increase = held.estimate["tiers"]["full"]["allocated_bytes"] - fresh["allocated_bytes"]
    assert 0 < increase <= gradients


def test_dropping_the_logits_before_backward_lowers_the_peak() -> None:
    workload = {"seq_len": 2048, "method": "lora", "dtype": "fp16"}
    held = make_plan("full", model=MODEL, workload=workload).estimate["tiers"]["full"]
    dropped = make_plan("full", model=MODEL, workload={**workload, "logits_held": False})
    assert dropped.estimate["tiers"]["full"]["allocated_bytes"] < held["allocated_bytes"]


def test_two_peaks_context_and_tight_verdict() -> None:
    plan = make_plan("full", model=MODEL, workload=QLORA, gpu="T4")
    row = plan.estimate["tiers"]["full"]
    assumptions = plan.estimate["assumptions"]
    assert assumptions["cuda_context_bytes"] == int(140.875 * 2**20)  # measured on a T4
    assert row["peak_bytes"] >= row["allocated_bytes"] + assumptions["cuda_context_bytes"]
    budget = assumptions["budget_bytes"]
    assert row["margin_bytes"] == budget - row["peak_bytes"]
    assert row["verdict"] == ("tight" if row["tight"] else "fits")
    unnamed = make_plan("full", model=MODEL, workload=QLORA, gpu_memory_gb=14.0)
    assert unnamed.estimate["assumptions"]["cuda_context_bytes"] > assumptions["cuda_context_bytes"]


def test_a_peak_near_the_budget_is_tight() -> None:
    run = run_for(**QLORA)
    from ckpt_core._memory.advise import estimate_tiers

    peak = estimate_tiers(run, None)["tiers"]["full"]["peak_bytes"]
    band = 0.16  # fp32 grouped heads (kbit preparation) run sdpa's math backend: eager's band
    near = estimate_tiers(run, peak * 1.01 / (0.9 * 2**30))["tiers"]["full"]
    far = estimate_tiers(run, peak * (1 + 2 * band) / (0.9 * 2**30))["tiers"]["full"]
    over = estimate_tiers(run, peak * (1 - 2 * band) / (0.9 * 2**30))["tiers"]["full"]
    assert (near["verdict"], far["verdict"], over["verdict"]) == ("tight", "fits", "does_not_fit")


@pytest.mark.parametrize(
    ("preset", "band"),
    [
        ("llama-3.2-1b", 0.06),
        ("bert-base-uncased", 0.06),
        ("t5-base", 0.06),
        ("qwen3-30b-a3b", 0.09),
    ],
)
def test_a_model_the_replay_does_not_run_itself_gets_the_wider_band(
    preset: str, band: float
) -> None:
    """A routed-expert model takes the closed form's allocated peak and a stand-in's pool,
    up to 7.7% low against its real op order: 7.5% under the budget is tight for it, not
    for models replayed as themselves (Llama, BERT, T5)."""
    from ckpt_core._memory.advise import estimate_tiers

    run = prepare(model_facts({"preset": preset}), parse_workload({"seq_len": 512}))
    estimate = estimate_tiers(run, None)
    assert estimate["assumptions"]["tight_band"] == band
    peak = estimate["tiers"]["off"]["peak_bytes"]
    row = estimate_tiers(run, peak * 1.075 / (0.9 * 2**30))["tiers"]["off"]
    assert row["verdict"] == ("tight" if band > 0.075 else "fits")


@pytest.mark.parametrize(
    ("seq_len", "attention", "band"),
    [(1024, "sdpa", 0.06), (4096, "sdpa", 0.06), (8193, "sdpa", 0.06), (8192, "eager", 0.16)],
)
def test_t5s_band_is_its_kernels_at_any_sequence_length(
    seq_len: int, attention: str, band: float
) -> None:
    """T5 is replayed as itself, its relative position bias's sequence x sequence buffers
    included, so its band no longer widens with the sequence (it was 50% at 4096 and
    100% past 8192 while a Llama-block stand-in missed them)."""
    from ckpt_core._memory.advise import estimate_tiers

    workload = parse_workload({"seq_len": seq_len, "attention": attention, "method": "lora"})
    run = prepare(model_facts({"preset": "t5-base"}), workload)
    assert estimate_tiers(run, None)["assumptions"]["tight_band"] == band


def test_sdpas_math_backend_takes_eagers_band() -> None:
    """Grouped heads in a QLoRA step (fp32 after PEFT's kbit preparation) run sdpa's math
    backend, whose score-sized buffers shape the pool as eager's do: against the real op
    order it was up to 10.4% low (medium tier), so its band is eager's, not sdpa's."""
    from ckpt_core._memory.advise import estimate_tiers

    workload = parse_workload({"seq_len": 512, "method": "qlora"})
    run = prepare(model_facts({"preset": "llama-3.2-1b"}), workload)
    assert run.step.gqa == "math"
    assert estimate_tiers(run, None)["assumptions"]["tight_band"] == 0.16
    lora = prepare(model_facts({"preset": "llama-3.2-1b"}), parse_workload({"seq_len": 512}))
    assert estimate_tiers(lora, None)["assumptions"]["tight_band"] == 0.06


@pytest.mark.parametrize(("seq_len", "band"), [(256, 0.16), (1024, 0.06)])
def test_a_model_whose_layers_all_slide_runs_the_math_backend_below_its_window(
    seq_len: int, band: float
) -> None:
    """Mistral with a 512-token window, fp32: below the window no layer gets a mask, so
    its grouped heads run sdpa's math backend and take eager's band; from the window on
    every layer gets one, K and V are repeated, a fused kernel runs: sdpa's band."""
    from ckpt_core._configs.presets import load_preset
    from ckpt_core._memory.advise import estimate_tiers

    config = {**load_preset("mistral-7b-v0.3"), "sliding_window": 512}
    workload = parse_workload({"seq_len": seq_len, "dtype": "fp32"})
    run = prepare(model_facts({"config": config}), workload)
    assert estimate_tiers(run, None)["assumptions"]["tight_band"] == band


def _optimizer_step_allocations(**kind: bool) -> list[int]:
    """Bytes of each CPU allocation torch's AdamW makes in its second step (the states exist)."""
    from torch.profiler import ProfilerActivity, profile

    params = [torch.nn.Parameter(torch.randn(256, 128)) for _ in range(3)]
    optimizer = torch.optim.AdamW(params, **kind)
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer.step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        optimizer.step()
    return [event.self_cpu_memory_usage for event in prof.events()]


def test_only_the_foreach_adamw_step_allocates_a_parameter_sized_temporary() -> None:
    """What `adamw` and `adamw_fused` assume of torch: the foreach step's ``_foreach_sqrt``
    makes one state-sized tensor per parameter; the fused kernel updates in place."""
    param_bytes = 3 * 256 * 128 * 4
    foreach = [size for size in _optimizer_step_allocations(foreach=True) if size >= 1024]
    fused = [size for size in _optimizer_step_allocations(fused=True) if size >= 1024]
    assert sum(foreach) == param_bytes
    assert fused == []


@dataclass(frozen=True)
class _FullFineTunePeak:
    """llama-3.2-1b full fine-tune at seq 512 with one optimizer, on the full tier."""

    closed: int  # the closed form's allocated peak
    replayed: int  # the replay's
    moment: str  # the closed form's peaking moment
    static: Any


def _full_fine_tune_peak(optimizer: str) -> _FullFineTunePeak:
    run = run_for(seq_len=512, method="full", optimizer=optimizer)
    assert run.recipe.trace is not None
    closed = tier_memory(run.facts.arch, run.step, "full", run.static, run.recipe, replay=False)
    resident = run.static.total - run.static.gradients
    moments = allocated_moments(run.facts.arch, run.step, "full", resident, run.recipe)
    return _FullFineTunePeak(
        closed=closed.allocated_bytes,
        replayed=simulate(run.facts.arch, "full", run.recipe.trace)[0],
        moment=max(moments, key=moments.__getitem__),
        static=run.static,
    )


def test_a_fused_adamw_step_holds_no_temporary() -> None:
    """A full fine-tune at seq 512 peaks at the foreach step (weights, gradients, states
    and the temporary).  With the fused step the peak moves to the backward's last op,
    where llama-3.2-1b's tied embedding gradient is summed with the LM head's out of
    place: in the replay and the closed form alike, within 0.1%; the states are the same."""
    foreach, fused = _full_fine_tune_peak("adamw"), _full_fine_tune_peak("adamw_fused")
    for peak in (foreach, fused):
        assert peak.closed == pytest.approx(peak.replayed, rel=1e-3)
    assert (foreach.moment, fused.moment) == ("optimizer_step", "embedding_backward")
    assert fused.static.optimizer == foreach.static.optimizer
    embedding = 128256 * 2048 * 2  # bf16, tied: the gradient's sum holds two more
    lowered = foreach.replayed - fused.replayed
    assert lowered == pytest.approx(foreach.static.gradients - 2 * embedding, rel=1e-2)


def test_sgd_momentum_keeps_one_buffer_per_parameter() -> None:
    """torch's SGD with momentum makes one buffer per parameter at its first step (a clone
    of the gradient, in its dtype); without momentum, none.  A full fine-tune's peak then
    holds one more parameter-sized copy, in the closed form and the replay alike."""
    plain, momentum = _full_fine_tune_peak("sgd"), _full_fine_tune_peak("sgd_momentum")
    assert plain.static.optimizer == 0
    assert momentum.static.optimizer == momentum.static.gradients
    assert momentum.closed - plain.closed == momentum.static.gradients
    grown = momentum.replayed - plain.replayed  # plus the pool's rounding
    assert grown == pytest.approx(momentum.static.gradients, rel=1e-3)


def test_bitsandbytes_32bit_adamw_keeps_fp32_states_and_no_temporary() -> None:
    """bitsandbytes' AdamW with 32-bit states (HF Trainer's ``paged_adamw_32bit``): two
    fp32 states whatever the parameter's dtype, updated in place by one kernel
    (``optimizer_update_32bit``).  A bf16 full fine-tune holds twice the fused AdamW's
    states and the same step; LoRA's fp32 adapters, AdamW's states."""
    fused, bnb = _full_fine_tune_peak("adamw_fused"), _full_fine_tune_peak("adamw_32bit")
    assert bnb.static.optimizer == 2 * fused.static.optimizer
    assert bnb.closed == pytest.approx(bnb.replayed, rel=1e-3)
    grown = bnb.replayed - fused.replayed  # less the fused step's 4 B counts
    assert grown == pytest.approx(fused.static.optimizer, rel=1e-2)
    lora = [
        run_for(seq_len=512, method="lora", optimizer=name) for name in ("adamw", "adamw_32bit")
    ]
    assert lora[0].static.optimizer == lora[1].static.optimizer > 0
    assert lora[1].recipe.optimizer_temporary == 0 < lora[0].recipe.optimizer_temporary


def _backward_allocations(accumulate: bool) -> tuple[float, list[tuple[str, float]]]:
    """A tiny tied-embedding Llama's backward on CPU (torch profiler): what it leaves
    allocated, and its allocations and frees of at least half an embedding, in
    embeddings (fp32 vocab x hidden)."""
    from torch.profiler import ProfilerActivity, profile

    model = tiny_model("llama", vocab_size=32000, tie_word_embeddings=True)
    config = model.config
    embedding = config.vocab_size * config.hidden_size * 4
    for param in model.parameters():
        param.grad = torch.zeros_like(param) if accumulate else None
    ids = torch.randint(0, config.vocab_size, (1, 16))
    out = model(input_ids=ids, labels=ids)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out.loss.backward()
    events = [event for event in prof.events() if event.self_cpu_memory_usage]
    left = sum(event.self_cpu_memory_usage for event in events)
    large = [
        (event.name, round(event.self_cpu_memory_usage / embedding, 2))
        for event in events
        if abs(event.self_cpu_memory_usage) >= embedding // 2
    ]
    return left / embedding, large


def test_accumulated_gradients_are_new_tensors_added_in_place() -> None:
    """What ``gradients: accumulate`` assumes of torch: into an existing ``.grad`` a new
    gradient is made, added in place and freed (AccumulateGrad); a tied weight's two
    gradients are first summed out of place (the engine's input buffer).  So the last op
    of a tied full fine-tune holds three embedding-sized tensors more than ``.grad``."""
    left, large = _backward_allocations(accumulate=True)
    assert abs(left) < 0.01  # nothing stays: every new gradient was added and freed
    assert ("aten::add", 1.0) in large  # the tied weight's out-of-place sum
    assert ("torch::autograd::AccumulateGrad", -1.0) in large  # the sum, freed
    fresh_left, fresh = _backward_allocations(accumulate=False)
    assert 1 <= fresh_left < 1.1  # set_to_none: the sum becomes .grad, beside small ones
    assert all(name != "torch::autograd::AccumulateGrad" for name, _ in fresh)


def test_accumulating_a_tied_full_fine_tune_holds_one_embedding_more() -> None:
    """At the embedding's backward, accumulating: the LM head's new gradient (held since
    its backward), the embedding's and their sum, beside every ``.grad``; with
    ``set_to_none`` the sum is the ``.grad``.  One embedding-sized tensor more, in the
    replay and the closed form alike (plain SGD, whose peak is that moment)."""
    peaks = {}
    for gradients in ("set_to_none", "accumulate"):
        run = run_for(seq_len=512, method="full", optimizer="sgd", gradients=gradients)
        assert run.recipe.trace is not None
        closed = tier_memory(run.facts.arch, run.step, "full", run.static, run.recipe, replay=False)
        replayed = simulate(run.facts.arch, "full", run.recipe.trace)[0]
        assert closed.allocated_bytes == pytest.approx(replayed, rel=1e-3)
        peaks[gradients] = replayed
    embedding = 128256 * 2048 * 2
    grown = peaks["accumulate"] - peaks["set_to_none"]
    assert grown == pytest.approx(embedding, rel=1e-2)
