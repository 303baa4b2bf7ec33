"""The replayed step through the caching allocator (`ckpt_core._memory.step_trace`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ckpt_core._memory.allocator import MIB
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
from ckpt_core._memory.peak import allocated_moments
from ckpt_core._memory.peak_model import tier_memory
from ckpt_core._memory.step_trace import simulate
from ckpt_core._memory.workspace import EARLIER, HOPPER_AND_LATER, blas_workspace_bytes
from tests._model_configs import MISTRAL3

LORA = {"method": "lora", "lora_rank": 32, "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}
_TARGETS = {"target_modules": LORA["lora_targets"]}


def reserve_gap(
    preset: str, tier: str, gpu: str | None = None, workspace: int | None = None, **workload: Any
) -> int:
    """Replayed peak reserved minus peak allocated, in bytes."""
    run = prepare(model_facts({"preset": preset}), parse_workload({**LORA, **workload}), gpu)
    trace = run.recipe.trace
    assert trace is not None
    if workspace is not None:
        trace = dataclasses.replace(trace, blas_workspace=workspace)
    allocated, reserved = simulate(run.facts.arch, tier, trace)
    return reserved - allocated


def test_the_measured_step_reuses_the_warm_up_steps_pool() -> None:
    """llama-3.2-1b LoRA s2048 off on an H200 reserved 1148 MiB above its allocated peak:
    the measured step best-fits into the warm-up's cached segments, its bf16 logits
    split a freed fp32-logits segment and the loss backward reserves one more (1002 MiB).
    A first step alone (an empty pool) reserves 286 MiB above.  The real op order (the
    step run on meta, its storages replayed) reserves 1204 MiB above, as the replay does
    once the embedding output lives through the step."""
    gap = reserve_gap("llama-3.2-1b", "off", gpu="H200", seq_len=2048)
    fp32_logits = 2048 * 128256 * 4
    assert fp32_logits < gap < fp32_logits + 300 * MIB


def test_a_warm_up_leaves_the_other_tiers_gap_small() -> None:
    """The same model checkpointed: measured gaps 91-169 MiB, no extra logits segment."""
    for tier in ("medium", "full"):
        assert reserve_gap("llama-3.2-1b", tier, gpu="H200", seq_len=2048) < 300 * MIB


def test_blas_workspace_sizes_are_pytorchs_defaults() -> None:
    """CublasHandlePool.cpp: :4096:8 from compute capability 9 on, :4096:2:16:8 before."""
    assert blas_workspace_bytes("H200") == HOPPER_AND_LATER == 32 * MIB
    assert blas_workspace_bytes("T4") == blas_workspace_bytes("A100-80GB") == EARLIER
    assert blas_workspace_bytes(None) == HOPPER_AND_LATER  # unnamed: the larger default
    assert EARLIER == 8 * MIB + 128 * 1024


def test_autograd_threads_workspace_strands_a_freed_logits_segment() -> None:
    """gemma-3-1b LoRA s2048 on an H200 reserved 2132-2302 MiB above its allocated peak in
    every tier (fp32 logits: 2048 MiB).  The backward's first matmul (the LM head's) makes
    the autograd thread's 32 MiB cuBLAS workspace while the freed fp32 logits blocks are
    the only free ones that fit: it lands in one for good, and every later step's loss
    reserves one more logits-sized segment.  Without the workspace the replay misses it."""
    fp32_logits = 2048 * 262144 * 4
    for tier in ("off", "full"):
        assert reserve_gap("gemma-3-1b", tier, gpu="H200", seq_len=2048) > fp32_logits
        assert reserve_gap("gemma-3-1b", tier, "H200", 0, seq_len=2048) < 300 * MIB


def test_selective_leaves_the_backward_workspace_a_free_block() -> None:
    """llama-3.2-1b LoRA s2048 selective on an H200 reserved 117 MiB above its allocated
    peak.  The embedding output (a leaf: `enable_input_require_grads`) stays allocated
    through the step, so the last block's freed MLP blocks stay whole and the backward
    thread's 32 MiB cuBLAS workspace fits there; freeing the embedding output after the
    first block let a norm's fp32 upcast split them, the workspace stranded a freed
    logits block and the loss reserved one more logits-sized segment."""
    bf16_logits = 2048 * 128256 * 2
    assert reserve_gap("llama-3.2-1b", "selective", gpu="H200", seq_len=2048) < bf16_logits


def test_the_steps_output_keeps_what_it_keeps_on_meta(monkeypatch: pytest.MonkeyPatch) -> None:
    """After backward, what the real step keeps until `out` is freed (after optimizer.step())
    is what the replay's step output keeps: PEFT's LoRA model on meta with
    `enable_input_require_grads()` and the selective hooks, its storages' lifetimes
    tracked through a dispatch mode (parameters and their gradients left out).  Besides
    the logits and the loss, AccumulateGrad keeps the embedding output (a leaf) and its
    `.grad`.  The fused attention stand-in replaces sdpa itself: checkpoint's recompute
    runs in the backward, outside `meta_kernels`' torch-function mode."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from peft import LoraConfig, get_peft_model
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from ckpt_core import install_checkpoint_hooks
    from ckpt_core._configs.model_config import build_meta_model, load_model_config
    from ckpt_core._configs.presets import load_preset
    from ckpt_core._memory.step_trace import _forward_backward
    from ckpt_core._meta.stand_ins import _sdpa_stand_in, no_data_dependent_mask_checks

    class Storages(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, tuple[StorageWeakRef, int]] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            out = func(*args, **(kwargs or {}))
            for tensor in tree_flatten(out)[0]:
                if isinstance(tensor, torch.Tensor):
                    storage = tensor.untyped_storage()
                    self.live.setdefault(
                        storage._cdata, (StorageWeakRef(storage), storage.nbytes())
                    )
            return out

    layers, seq = 2, 512
    model_input = {"config": {**load_preset("llama-3.2-1b"), "num_hidden_layers": layers}}
    base = build_meta_model(load_model_config(model_input), attention="sdpa").to(torch.bfloat16)
    base.config.use_cache = False
    model = get_peft_model(base, LoraConfig(r=32, lora_alpha=64, **_TARGETS, lora_dropout=0.0))
    model.enable_input_require_grads()
    install_checkpoint_hooks(model, "selective")
    model.train()
    ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
    monkeypatch.setattr(F, "scaled_dot_product_attention", _sdpa_stand_in(False))
    mode = Storages()
    with no_data_dependent_mask_checks(), mode:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    weights = [*model.parameters(), *model.buffers()]
    model_storages = {t.untyped_storage()._cdata for t in weights} | {
        p.grad.untyped_storage()._cdata for p in model.parameters() if p.grad is not None
    }
    kept = sum(
        size
        for key, (ref, size) in mode.live.items()
        if not ref.expired() and key not in model_storages
    )
    assert out.logits is not None

    run = prepare(model_facts(model_input), parse_workload({**LORA, "seq_len": seq}))
    assert run.recipe.trace is not None
    sim = Sim()
    held = _forward_backward(sim, run.facts.arch, "selective", run.recipe.trace, 0)
    assert sum(sim.size(tid) for tid in held) == pytest.approx(kept, abs=64 * 1024)


def test_a_recompute_waits_for_the_first_unpack() -> None:
    """Non-reentrant checkpoint recomputes when a backward function first reads a saved
    tensor: PEFT's `* scaling` and the mixed-dtype `result + lora` (the engine casts its
    fp32 gradient to the base result's bf16) run before, as on meta (llama-3.2-1b
    selective: the fp32 and bf16 gradients of o_proj's adapter sum, then the scaled
    one, then the recomputed q_proj).  Tensors of 2, 4 and 8 MiB tell the order."""

    def region(sim: Sim, x: int) -> int:
        base = sim.op([x], 2 * MIB, saves_other=True, matmul=True)  # bf16 x @ W
        up = sim.op([x], 4 * MIB, save=[x])  # the adapter, fp32
        scaled = sim.op([up], 4 * MIB)  # * scaling
        sim.drop(up)
        total = sim.op([base, scaled], 4 * MIB, alias=True, cast=True)
        sim.drop(base, scaled)
        out = sim.op([total], 2 * MIB)  # .to(bf16)
        sim.drop(total)
        return out

    sim, sizes = _logging_sim()
    x = sim.new(8 * MIB, grad=True)
    out = sim.checkpoint(region, x)
    loss = sim.op([out], 1)
    sim.drop(out)
    sizes.clear()
    sim.backward(loss)
    # the loss's gradient of out, then .to's fp32 gradient, the sum's bf16 one for base,
    # scaled's; only then the recompute's base and adapter outputs
    assert sizes[:6] == [0, 2, 4, 2, 4, 2]


def test_an_attribute_held_input_outlives_checkpointing() -> None:
    """bitsandbytes' int8 matmul keeps its input as ``ctx.tensors``, out of checkpoint's
    hooks: the checkpointed forward keeps it until that op's backward, where a saved
    input would be freed with the region's forward."""

    def region(sim: Sim, x: int, holds: bool) -> int:
        hidden = sim.op([x], 8 * MIB)
        kept = {"holds": [hidden]} if holds else {"save": [hidden]}
        out = sim.op([hidden], 2 * MIB, matmul=True, **kept)
        sim.drop(hidden)
        return out

    for holds, after_forward in ((False, 0), (True, 8)):
        sim = Sim()
        x = sim.new(4 * MIB, grad=True)
        out = sim.checkpoint(lambda s, t, h=holds: region(s, t, h), x)  # type: ignore[misc]
        sim.drop(x)
        # x (kept for the recompute) and out, and what the region's op holds
        assert sim.allocator.allocated == (4 + 2 + after_forward) * MIB
        loss = sim.op([out], 512)
        sim.drop(out)
        sim.backward(loss)
        sim.drop(loss)
        assert sim.allocator.allocated == 0  # everything freed, the held input too


@pytest.mark.parametrize("views", [False, True])
def test_a_second_gradient_is_summed_out_of_place_only_into_a_view(views: bool) -> None:
    """The engine adds a tensor's second gradient into its first in place, once the
    function has returned, unless the first shares its storage: a view, as
    ``aten::linear``'s input gradient is (its reshape's backward).  Then ``old + new``
    is made, and both are freed.  Sizes in MiB tell the order."""
    sim, sizes = _logging_sim()
    x = sim.new(8 * MIB, grad=True)
    first = sim.op([x], 2 * MIB, view_grads=views)
    second = sim.op([x], 4 * MIB, view_grads=views)
    loss = sim.op([first, second], 1)
    sim.drop(first, second)
    sizes.clear()
    before = sim.allocator.allocated
    sim.allocator.peak_allocated = before
    sim.backward(loss)
    # the loss's gradients (second's, then first's), x's from the op made last, x's second
    assert sizes == [0, 4, 2, 8, 8, *([8] if views else [])]
    # The peak: x's two gradients and first's incoming one, or (once that is freed) both
    # and their sum.
    held = sim.allocator.peak_allocated - before
    assert held == (8 + 8 + (8 if views else 2)) * MIB


@pytest.mark.parametrize("rotary_matmul", [True, False])
def test_the_forwards_first_cublas_call_makes_the_workspace(
    rotary_matmul: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python thread's cuBLAS workspace comes with the forward's first cuBLAS call:
    before transformers 5.19 RoPE's ``inv_freq @ position_ids``, before any block;
    since, the first linear's mm (q_proj), once its output is allocated."""
    from ckpt_core._memory.allocator import CachingAllocator

    run = prepare(
        model_facts({"preset": "qwen2.5-0.5b"}),
        parse_workload({"seq_len": 1024, "micro_batch_size": 2, "method": "lora"}),
        "A100-80GB",
        rotary_matmul=rotary_matmul,
    )
    trace = run.recipe.trace
    assert trace is not None and trace.rotary_matmul == rotary_matmul
    sizes: list[int] = []
    malloc = CachingAllocator.malloc

    def logged(self: CachingAllocator, size: int) -> tuple[int, int]:
        sizes.append(size)
        return malloc(self, size)

    monkeypatch.setattr(CachingAllocator, "malloc", logged)
    simulate.__wrapped__(run.facts.arch, "off", trace)  # uncached: every malloc logged
    first = sizes.index(trace.blas_workspace)
    hidden = 2 * 2 * 1024 * 896  # bf16: the embedding's output, the norm's, q_proj's
    assert (sizes[first - 1] == hidden) is not rotary_matmul
    assert (sizes[:first].count(hidden) > 1) is not rotary_matmul  # a block has run


def _logging_sim() -> tuple[Sim, list[int]]:
    """A `Sim` whose allocator logs the MiB of each malloc in the list returned with it."""
    from ckpt_core._memory.allocator import CachingAllocator

    sizes: list[int] = []

    class Logged(CachingAllocator):
        def malloc(self, size: int) -> tuple[int, int]:
            sizes.append(size // MIB)
            return super().malloc(size)

    return Sim(allocator=Logged()), sizes


@pytest.mark.parametrize("bias", [False, True])
def test_a_linear_with_a_bias_makes_its_inputs_gradient_before_its_weights(bias: bool) -> None:
    """``mm``'s backward makes the weight's gradient first; ``addmm``'s (a linear with a
    bias, as recorded) the input's, then the weight's.  Sizes in MiB tell the order."""
    sim, sizes = _logging_sim()
    x = sim.new(8 * MIB, grad=True)
    out = sim.op([x], 2 * MIB, save=[x], param_grad=4 * MIB, input_grad_first=bias)
    loss = sim.op([out], 1)
    sim.drop(out)
    sizes.clear()
    sim.backward(loss)
    # the loss's gradient, the output's, then x's and the weight's in the kernel's order
    assert sizes == [0, 2, *([8, 4] if bias else [4, 8])]


def test_a_strided_outputs_gradient_is_copied_before_its_matmul() -> None:
    """A gradient that reaches a matmul's 3-D output as a transposed view (eager's keys) is
    copied contiguous by the output view's backward, which then frees it, before the
    matmul's own backward (`linear_trace.strided_output`)."""
    from ckpt_core._memory.linear_trace import strided_output

    sim, sizes = _logging_sim()
    x = sim.new(8 * MIB, grad=True)
    out = strided_output(sim, sim.op([x], 2 * MIB))
    loss = sim.op([out], 1)
    sim.drop(out)
    sizes.clear()
    before = sim.allocator.allocated
    sim.allocator.peak_allocated = before
    sim.backward(loss)
    assert sizes == [0, 2, 2, 8]  # the loss's gradient, the view's, its copy, x's
    # the copy replaced the view's gradient before x's was made: 2 + 8 at most, not 2 + 2 + 8
    assert sim.allocator.peak_allocated - before <= (2 + 8) * MIB + 512


@pytest.mark.parametrize("held", [False, True])
def test_a_checkpointed_regions_further_output_lives_until_its_caller_drops_it(
    held: bool,
) -> None:
    """A checkpointed attention returns its eager weights too, which the layer's ``_``
    keeps through its MLP: handed the caller's list, the region's first forward leaves
    them there; the recompute does not."""
    sim = Sim()
    x = sim.new(MIB, grad=True)
    weights: list[int] = []

    def region(s: Sim, y: int, outputs: list[int] | None = None) -> int:
        probs = s.op([y], 8 * MIB)
        out = s.op([probs], MIB)
        if outputs is None:
            s.drop(probs)
        else:
            outputs.append(probs)
        return out

    out = sim.checkpoint(region, x, weights if held else None)
    assert len(weights) == (1 if held else 0)
    assert sim.allocator.allocated == (1 + 1 + (8 if held else 0)) * MIB
    mlp = sim.op([out], 4 * MIB)  # the layer's MLP runs while `_` still holds them
    assert sim.allocator.allocated == (1 + 1 + 4 + (8 if held else 0)) * MIB
    sim.drop(out, *weights)
    loss = sim.op([mlp], 1)
    sim.drop(mlp)
    sim.backward(loss)
    assert len(weights) == (1 if held else 0)  # the recompute appended nothing


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_dropout_keeps_its_mask_until_its_backward(checkpointed: bool) -> None:
    """CUDA's fused dropout allocates its output, then a bool mask that only its backward
    reads (`Sim.op`'s ``saved_outputs``).  A checkpointed region ending in one stops its
    recompute at that mask, after its output: the output goes with the early stop, and
    nothing is freed twice or left behind.  Sizes in MiB tell the order."""
    from ckpt_core._memory.fused_trace import dropout

    def region(s: Sim, t: int) -> int:
        return dropout(s, t, 8 * MIB, 2 * MIB, 0.1)

    sim, sizes = _logging_sim()
    x = sim.new(4 * MIB, grad=True)
    out = sim.checkpoint(region, x) if checkpointed else region(sim, x)
    assert sizes == [4, 8, 2]  # the output, then its mask
    kept = 4 + 8 + (0 if checkpointed else 2)  # a checkpoint keeps no mask
    assert sim.allocator.allocated == kept * MIB
    sim.drop(x)
    loss = sim.op([out], 512)
    sim.drop(out)
    sim.backward(loss)
    sim.drop(loss)
    # The loss and its gradient (under 1 MiB), the output's gradient, then (checkpointed)
    # the recompute's output and mask, then the input's gradient.
    assert sizes[3:] == ([0, 0, 8, 8, 2, 4] if checkpointed else [0, 0, 8, 4])
    assert sim.allocator.allocated == 0


@pytest.mark.parametrize("alias", [True, False])
def test_an_in_place_op_allocates_nothing_and_its_backward_as_autograd_does(alias: bool) -> None:
    """``y += x`` (Falcon's ``mlp_output += attention_output``) and ``y /= c`` (its eager
    scores) allocate nothing and keep ``y``'s block; in backward the add hands the
    incoming gradient to both inputs as it is, the division makes a new one.  Sizes in
    MiB tell the order."""
    sim, sizes = _logging_sim()
    x = sim.new(2 * MIB, grad=True)
    y = sim.op([x], 4 * MIB)  # its backward makes x's gradient
    result = sim.in_place(y, [x] if alias else [], alias=alias)
    sim.drop(y)
    assert sizes == [2, 4]
    assert sim.allocator.allocated == 6 * MIB
    loss = sim.op([result], 512)
    sim.drop(result)
    sim.backward(loss)
    sim.drop(loss, x)
    # The loss and its gradient (under 1 MiB), the result's gradient, (the division: a
    # new one for y), then x's.
    assert sizes[2:] == ([0, 0, 4, 2] if alias else [0, 0, 4, 4, 2])
    assert sim.allocator.allocated == 0


@pytest.mark.parametrize("kbit_preparation", ["peft", "none"])
def test_the_closed_form_keeps_what_int8_linears_hold_as_the_replay_does(
    kbit_preparation: str,
) -> None:
    """bitsandbytes' int8 linears keep their inputs in every mode: the closed form's
    allocated peak (`tier_memory(replay=False)`) is the replay's on every tier, and its
    activations keep them through checkpointing."""
    from ckpt_core._memory.activations import activation_bytes
    from ckpt_core._memory.peak_model import tier_memory

    workload = {"seq_len": 1024, "micro_batch_size": 2, "method": "qlora", "weights": "int8"}
    runs = {
        weights: prepare(
            model_facts({"preset": "qwen2.5-0.5b"}),
            parse_workload({**workload, "weights": weights, "kbit_preparation": kbit_preparation}),
        )
        for weights in ("nf4", "int8")
    }
    run = runs["int8"]
    for tier in ("off", "selective", "medium", "full"):
        args = (run.facts.arch, run.step, tier, run.static, run.recipe)
        closed, replayed = tier_memory(*args, replay=False), tier_memory(*args)
        assert closed.allocated_bytes == pytest.approx(replayed.allocated_bytes, rel=0.01)
    nf4 = runs["nf4"]
    kept = {weights: activation_bytes(r.facts.arch, r.step, "full") for weights, r in runs.items()}
    assert kept["int8"] > kept["nf4"] + activation_bytes(nf4.facts.arch, nf4.step, "full") // 2


def test_a_promoted_products_input_gradient_is_made_in_fp32_then_cast() -> None:
    """`bf16 * fp32` (OLMo-2's RoPE against fp32 cos / sin) makes an fp32 product.  Its
    backward computes the bf16 input's gradient in fp32, and the engine casts it to
    bf16 (validate_outputs): both are allocated, in that order."""
    sim, sizes = _logging_sim()
    x = sim.new(2 * MIB, grad=True)
    product = sim.op([x], 4 * MIB, saves_other=True, cast=True)
    loss = sim.op([product], 1)
    sim.drop(product)
    sizes.clear()
    grads = sim.backward(loss, leaves=[x])
    # the root's gradient, the product's, then x's in fp32 and in bf16
    assert sizes == [0, 4, 4, 2]
    assert [sim.size(grad) for grad in grads] == [2 * MIB]


def test_gemma3_selective_strands_one_more_fp32_logits_segment_at_8192() -> None:
    """gemma-3-1b LoRA s8192 on an H200: selective reserved 8458 MiB above its allocated
    peak (one more fp32-logits segment: 8192 x 262144 x 4 B = 8 GiB), off / medium / full
    201-486 MiB.  Replayed as Gemma 3's own layers (sandwich and q / k norms, the sliding
    layers' sdpa masks), selective's pool leaves no freed block the measured step's loss
    can take the fp32 logits from; a Llama block at Gemma's sizes left one (295 MiB)."""
    fp32_logits = 8192 * 262144 * 4
    assert reserve_gap("gemma-3-1b", "selective", gpu="H200", seq_len=8192) > fp32_logits
    for tier in ("off", "medium", "full"):
        assert reserve_gap("gemma-3-1b", tier, gpu="H200", seq_len=8192) < fp32_logits // 8


def _eager_allocated(dtype: str, tier: str, *, replay: bool = True) -> int:
    """llama-3.1-8b LoRA eager seq 4096: the replayed (or the closed-form) allocated peak."""
    workload = {"seq_len": 4096, "dtype": dtype, "attention": "eager", "method": "lora"}
    run = prepare(model_facts({"preset": "llama-3.1-8b"}), parse_workload(workload), "A100-80GB")
    assert run.recipe.trace is not None
    if replay:
        return simulate(run.facts.arch, tier, run.recipe.trace)[0]
    memory = tier_memory(run.facts.arch, run.step, tier, run.static, run.recipe, replay=False)
    return memory.allocated_bytes


def test_bf16_scores_reach_the_softmax_through_an_fp32_copy() -> None:
    """SoftMax.cpp `softmax(x, dim, dtype=float32)`: on CUDA the kernel reads fp16 scores
    itself (half_to_float); bf16 scores are first copied to fp32, so the softmax's input
    gradient is fp32 and cast back.  A checkpointed block's backward (its peak in full
    and selective) then holds 2 bytes more per score: llama-3.1-8b, 32 heads, seq 4096."""
    scores = 32 * 4096 * 4096
    for tier in ("full", "selective"):
        assert _eager_allocated("bf16", tier) - _eager_allocated("fp16", tier) == 2 * scores
    # Without checkpointing the step's peak is elsewhere (the loss backward).
    assert _eager_allocated("bf16", "off") == _eager_allocated("fp16", "off")
    # The closed form (block-level plans, the search's quick bound) counts the same.
    closed = _eager_allocated("bf16", "full", replay=False)
    assert closed - _eager_allocated("fp16", "full", replay=False) == 2 * scores


@pytest.mark.parametrize("preset", ["llama-3.1-8b", "llama-3.2-1b"])
def test_a_full_fine_tune_replays_the_embedding_gradient(preset: str) -> None:
    """A full fine-tune at seq 512 peaks at the optimizer step: weights, every gradient,
    AdamW's states and its foreach temporaries.  The replay reaches that sum only with
    the token embedding's gradient (EmbeddingBackward's dense vocab x hidden tensor,
    1002 MiB for llama-3.1-8b, untied); llama-3.2-1b ties it to the LM head, whose
    gradient the engine sums with it out of place.  Without them it was 1.3% / 4.2% low,
    and so was the real op order on meta replayed through the same allocator."""
    run = prepare(
        model_facts({"preset": preset}), parse_workload({"seq_len": 512, "method": "full"})
    )
    trace = run.recipe.trace
    assert trace is not None
    allocated, _ = simulate(run.facts.arch, "full", trace)
    resident = run.static.total - run.static.gradients
    moments = allocated_moments(run.facts.arch, run.step, "full", resident, run.recipe)
    optimizer_step = moments["optimizer_step"] + 2 * trace.blas_workspace
    assert optimizer_step == max(moments.values()) + 2 * trace.blas_workspace
    assert allocated == pytest.approx(optimizer_step, rel=1e-3)


@pytest.mark.parametrize(
    ("preset", "targets"),
    [
        ("llama-3.2-1b", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"]),
        ("qwen3-8b", ["q_proj", "v_proj", "down_proj"]),
        ("phi-3-mini", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
        ("gemma-3-1b", ["q_proj", "k_proj", "v_proj", "o_proj"]),
    ],
)
def test_the_replay_loads_what_peft_holds(preset: str, targets: list[str]) -> None:
    """The replayed load holds the model's parameters, and the adapters it trains are
    PEFT's, shape by shape in ``model.parameters()`` order (the optimizer makes its
    states and steps in that order):
    Phi-3's fused projections are one adapted linear each, its o_proj first.  The
    weights of q / k and sandwich norms (a few KiB) are the only ones not replayed."""
    import torch
    from peft import LoraConfig, get_peft_model

    from ckpt_core._configs.model_config import build_meta_model, load_model_config
    from ckpt_core._configs.presets import load_preset
    from ckpt_core._memory.step_trace import _load

    model_input = {"config": {**load_preset(preset), "num_hidden_layers": 2}}
    base = build_meta_model(load_model_config(model_input), attention="sdpa").to(torch.bfloat16)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.0)
    model = get_peft_model(base, lora)
    trainable = [(p.element_size(), *p.shape) for p in model.parameters() if p.requires_grad]
    held = sum(p.nbytes for p in model.parameters())

    workload = {"method": "lora", "lora_rank": 8, "lora_targets": targets, "seq_len": 512}
    run = prepare(model_facts(model_input), parse_workload(workload))
    assert run.recipe.trace is not None
    sim = Sim()
    assert [tuple(tensor) for tensor in _load(sim, run.facts.arch, run.recipe.trace)] == trainable
    assert sum(sim.size(tid) for tid in sim.tensors) == pytest.approx(held, rel=1e-4)


@pytest.mark.parametrize("method", ["lora", "qlora"])
@pytest.mark.parametrize("tier", ["off", "full"])
def test_the_closed_form_takes_the_softcapped_loss_backward_as_the_replay_does(
    method: str, tier: str
) -> None:
    """gemma-2-9b caps its logits (`/ cap`, `tanh`, `* cap`).  Their gradients come after
    the loss's two fp32 logits-sized gradients are freed, one at a time, so the closed
    form (block-level plans, the search's quick estimate) peaks where the replay does:
    with a logits-sized softcap gradient added to the loss backward it was up to 15%
    high (QLoRA seq 8192, full tier: the fp32 logits are 8 GiB)."""
    workload = {"seq_len": 8192, "method": method}
    run = prepare(model_facts({"preset": "gemma-2-9b"}), parse_workload(workload), "H200")
    closed = tier_memory(run.facts.arch, run.step, tier, run.static, run.recipe, replay=False)
    replayed = tier_memory(run.facts.arch, run.step, tier, run.static, run.recipe)
    assert closed.allocated_bytes == pytest.approx(replayed.allocated_bytes, rel=0.01)


def test_a_plan_between_the_tiers_adds_what_it_keeps_to_the_full_tiers_replayed_peak() -> None:
    """The search's model of a block-level plan (``plans_from_full``).  gemma-2-9b QLoRA
    seq 8192: the closed form misses 0.08% of the full tier's replayed peak.  A plan that
    checkpoints all blocks but one sliding block keeps that block's activations beyond
    full: its peak is the full tier's replayed one plus that difference, not the closed
    form's."""
    from ckpt_core._memory.activations import mode_counts

    workload = parse_workload({"seq_len": 8192, "method": "qlora"})
    run = prepare(model_facts({"preset": "gemma-2-9b"}), workload, "H200")
    arch = run.facts.arch
    ((_, sliding), count), global_blocks = mode_counts(arch, "full")
    plan = ((("full", sliding), count - 1), (("off", sliding), 1), global_blocks)

    def peak(assignment: object, *, replay: bool = True) -> int:
        memory = tier_memory(
            arch, run.step, assignment, run.static, run.recipe, replay=replay, plans_from_full=True
        )
        return memory.allocated_bytes

    kept_beyond_full = peak(plan, replay=False) - peak("full", replay=False)
    assert peak("full") > peak("full", replay=False)  # what the closed form misses
    assert kept_beyond_full > 0
    assert peak(plan) == peak("full") + kept_beyond_full


@pytest.mark.parametrize(
    "model_input", [{"preset": "gemma-3-4b"}, {"config": MISTRAL3}], ids=["gemma3", "mistral3"]
)
def test_the_replay_loads_the_vision_tower_and_trains_none_of_it(
    model_input: dict[str, Any],
) -> None:
    """gemma-3-4b is Gemma3ForConditionalGeneration, Mistral 3 is
    Mistral3ForConditionalGeneration: their vision tower and projector (SigLIP: 420M
    parameters; Pixtral: 439M) are loaded with the text model.  Text-only training never
    runs them, so a full fine-tune gives them no gradient, and AdamW makes no state for
    a parameter whose ``.grad`` is None: the replay loads them and trains the rest."""
    import torch

    from ckpt_core._configs.model_config import build_meta_model, load_model_config
    from ckpt_core._memory.step_trace import _load

    model = build_meta_model(load_model_config(model_input), attention="sdpa").to(torch.bfloat16)
    held = sum(p.nbytes for p in model.parameters())
    towers = ("vision_tower", "multi_modal_projector")
    idle = sum(p.nbytes for n, p in model.named_parameters() if any(t in n for t in towers))
    assert idle > 800 * MIB

    run = prepare(model_facts(model_input), parse_workload({"method": "full", "seq_len": 512}))
    assert run.recipe.trace is not None
    sim = Sim()
    trainable = _load(sim, run.facts.arch, run.recipe.trace)
    assert sum(sim.size(tid) for tid in sim.tensors) == pytest.approx(held, rel=1e-4)
    assert sum(tensor.nbytes for tensor in trainable) == pytest.approx(held - idle, rel=1e-4)


def test_a_device_map_load_puts_the_whole_model_in_its_warm_up_block() -> None:
    """``from_pretrained`` with a device map reserves the model's size (vision tower
    included) in one block and loads every large tensor into it: gemma-3-4b's load
    reserves that one segment, where moved with ``.to()`` each tensor takes its own."""
    from ckpt_core._memory.step_trace import _load

    segments: dict[str, list[int]] = {}
    for path in ("device_map", "to_device"):
        workload = {**LORA, "seq_len": 512, "load_path": path}
        run = prepare(model_facts({"preset": "gemma-3-4b"}), parse_workload(workload))
        assert run.recipe.trace is not None
        sim = Sim()
        _load(sim, run.facts.arch, run.recipe.trace)
        segments[path] = [
            sum(size for size, _ in blocks.values())
            for blocks, pool in zip(sim.allocator._segments, sim.allocator._pools, strict=True)
            if pool == 1
        ]
    assert len(segments["device_map"]) == 1
    assert len(segments["to_device"]) > 100
    # the weights but the adapters (fp32) and the small tensors (norms, biases)
    weights = run.static.weights - 4 * run.static.trainable_parameters
    assert segments["device_map"][0] == pytest.approx(weights, rel=0.01)


def test_a_repeated_request_takes_its_peaks_from_the_cache() -> None:
    """Two preparations of one LoRA workload give equal steps (their adapters a set, not a
    bound method compared by identity), so the second asks the cached peaks."""
    workload = {"seq_len": 1024, "method": "lora", "lora_targets": ["q_proj", "v_proj"]}
    first, second = (
        prepare(model_facts({"preset": "llama-3.2-1b"}), parse_workload(workload)) for _ in range(2)
    )
    assert first.step == second.step and hash(first.step) == hash(second.step)
    first.peak.of(first.facts.arch, first.step, "full")
    hits = tier_memory.cache_info().hits
    second.peak.of(second.facts.arch, second.step, "full")
    assert tier_memory.cache_info().hits == hits + 1
