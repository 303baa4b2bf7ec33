"""transformers' Adafactor (``optimizer: adafactor``): its states and its step's allocations.

The step's sequence (`ckpt_core._memory.adafactor.step_events`) is held to the
installed transformers' ``Adafactor`` run on CPU, every storage's allocation and
free logged by a dispatch mode; the states to the parameters of the built model;
the replay and the closed form to each other.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers.optimization import Adafactor

import ckpt_core
from ckpt_core import InvalidWorkloadError, make_plan
from ckpt_core._configs.model_config import build_meta_model, load_model_config
from ckpt_core._configs.presets import load_preset
from ckpt_core._memory.adafactor import Trained, step_events
from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
from ckpt_core._memory.peak import allocated_moments
from ckpt_core._memory.peak_model import tier_memory
from ckpt_core._memory.step_trace import simulate

KIB = 1024


class _Allocations(TorchDispatchMode):
    """Each new storage's bytes (+) and, once unreferenced, its bytes again (-), in order;
    storages alive before (``known``) are not new."""

    def __init__(self, known: list[torch.Tensor]) -> None:
        super().__init__()
        self.known = {
            t.untyped_storage()._cdata: StorageWeakRef(t.untyped_storage()) for t in known
        }
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.events: list[int] = []

    def poll(self) -> None:
        for key in [key for key, (ref, _) in self.live.items() if ref.expired()]:
            self.events.append(-self.live.pop(key)[1])

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        self.poll()
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key = storage._cdata
                if key in self.known and self.known[key].expired():
                    del self.known[key]  # freed, and its address reused
                if key not in self.live and key not in self.known:
                    self.live[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.events.append(storage.nbytes())
        return out


def _alive_at_each_allocation(events: list[int]) -> list[tuple[int, int]]:
    """(bytes, bytes alive after it) per allocation of at least 1 KiB: frees between two
    allocations count whatever their order (a dispatch mode sees them at the next op)."""
    alive, out = 0, []
    for size in events:
        if abs(size) < KIB:
            continue
        alive += size
        if size > 0:
            out.append((size, alive))
    return out


def _modelled(tensors: list[Trained], *, first: bool) -> list[int]:
    sizes: dict[object, int] = {}
    events = []
    for kind, key, size in step_events(tensors, first=first):
        if kind == "new":
            sizes[key] = size
            events.append(size)
        else:
            events.append(-sizes.pop(key, 4))  # the last step's RMS scalar
    return events


def test_the_step_allocates_what_transformers_adafactor_allocates() -> None:
    """16-bit and fp32 matrices in turn, as HF Trainer builds the optimizer: the first step
    (which makes the states) and a later one allocate the modelled tensors in the same
    order, with the same bytes alive at each."""
    shapes = [(torch.bfloat16, 512, 768), (torch.bfloat16, 768, 640)]
    shapes += [(torch.float32, 640, 512), (torch.float16, 512, 512)]
    params = [torch.nn.Parameter(torch.randn(rows, cols, dtype=d)) for d, rows, cols in shapes]
    optimizer = Adafactor(params, scale_parameter=False, relative_step=False, lr=1e-3)
    for param in params:
        param.grad = torch.randn_like(param)
    tensors = [Trained(d.itemsize, rows, cols) for d, rows, cols in shapes]
    for first in (True, False):
        states = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        log = _Allocations([*params, *(p.grad for p in params), *states])
        with log:
            optimizer.step()
        log.poll()
        modelled = _alive_at_each_allocation(_modelled(tensors, first=first))
        assert _alive_at_each_allocation(log.events) == modelled
        assert len(modelled) >= 8 * len(tensors)


@pytest.mark.parametrize(
    ("preset", "method"),
    [
        ("llama-3.2-1b", "full"),
        ("qwen2.5-0.5b", "full"),
        ("phi-3-mini", "full"),
        ("llama-3.2-1b", "lora"),
    ],
)
def test_the_states_are_what_adafactor_keeps_for_the_built_model(preset: str, method: str) -> None:
    """A matrix's fp32 row and column vectors, a vector's whole fp32 second moment, over
    every trained parameter of the built model (two layers; biases: Qwen2.5; fused
    projections: Phi-3; the adapters of a LoRA model)."""
    from peft import LoraConfig, get_peft_model

    model_input = {"config": {**load_preset(preset), "num_hidden_layers": 2}}
    model = build_meta_model(load_model_config(model_input), attention="sdpa")
    if method == "lora":
        model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    expected = sum(
        4 * (p.shape[0] + p.shape[1]) if p.dim() == 2 else 4 * p.numel()
        for p in model.parameters()
        if p.requires_grad
    )
    workload = {"seq_len": 512, "method": method, "optimizer": "adafactor", "lora_rank": 8}
    run = prepare(model_facts(model_input), parse_workload(workload))
    assert run.static.optimizer == expected


def test_a_full_fine_tune_peaks_in_the_step_with_four_fp32_copies_of_the_largest_matrix() -> None:
    """llama-3.2-1b's tied embedding is its first and largest matrix: at its outer product
    the step holds the gradient's and the parameter's fp32 copies, the sum and the new
    update, and the row and column factors.  The replay and the closed form agree; the
    states are a few MiB, AdamW's two copies of the model."""
    workload = {"seq_len": 512, "method": "full"}
    run = prepare(
        model_facts({"preset": "llama-3.2-1b"}),
        parse_workload({**workload, "optimizer": "adafactor"}),
    )
    assert run.recipe.optimizer_temporary == 4 * 4 * 128256 * 2048 + 4 * (128256 + 2048)
    assert run.recipe.trace is not None
    closed = tier_memory(run.facts.arch, run.step, "full", run.static, run.recipe, replay=False)
    replayed = simulate(run.facts.arch, "full", run.recipe.trace)[0]
    assert closed.allocated_bytes == pytest.approx(replayed, rel=1e-3)
    resident = run.static.total - run.static.gradients
    moments = allocated_moments(run.facts.arch, run.step, "full", resident, run.recipe)
    assert max(moments, key=moments.__getitem__) == "optimizer_step"
    adamw = prepare(model_facts({"preset": "llama-3.2-1b"}), parse_workload(workload))
    assert run.static.optimizer < 0.001 * adamw.static.optimizer


@pytest.mark.parametrize(
    ("preset", "workload"),
    [
        ("llama-3.2-1b", {"sharding": "zero3", "world_size": 8}),
        ("llama-3.2-1b", {"sharding": "zero2", "world_size": 8, "engine": "deepspeed"}),
        ("qwen3-30b-a3b", {}),  # stacked experts
        ("qwen3-30b-a3b", {"method": "lora"}),
    ],
)
def test_what_is_not_modelled_is_an_error_naming_the_optimizer(
    preset: str, workload: dict[str, Any]
) -> None:
    with pytest.raises(InvalidWorkloadError) as error:
        make_plan(
            "auto",
            model={"preset": preset},
            workload={"seq_len": 512, "optimizer": "adafactor", **workload},
            gpu="H100-80GB",
        )
    assert error.value.field == "workload.optimizer"


def test_ddp_keeps_the_states_whole() -> None:
    """With DDP (sharding none) every GPU holds the whole, factored states."""
    one = {"seq_len": 512, "optimizer": "adafactor"}
    single = prepare(model_facts({"preset": "llama-3.2-1b"}), parse_workload(one))
    ddp = prepare(model_facts({"preset": "llama-3.2-1b"}), parse_workload({**one, "world_size": 4}))
    assert ddp.static.optimizer == single.static.optimizer > 0


def test_the_model_types_with_experts_are_all_listed() -> None:
    """`MOE_MODEL_TYPES` (what adafactor refuses, and the document says so) holds every
    supported type whose bundled preset or tiny test model has experts."""
    import json

    from tests._tiny_models import ARCHS, tiny_config

    configs = [{"preset": preset.name} for preset in ckpt_core.list_presets()]
    for arch in ARCHS:
        config = json.loads(json.dumps(tiny_config(arch, num_layers=2).to_dict()))
        if config.get("model_type") in ckpt_core.ESTIMATE_FAMILIES:
            configs.append({"config": config})
    with_experts = set()
    for model in configs:
        facts = model_facts(model)
        if facts.layout.experts or facts.layout.adapted_parameters:
            with_experts.add(facts.arch.model_type)
    assert with_experts
    assert with_experts <= ckpt_core.MOE_MODEL_TYPES <= set(ckpt_core.ESTIMATE_FAMILIES)
