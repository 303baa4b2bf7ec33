"""Which modules each granularity hooks, per architecture, asserted by name."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from torch import nn

from ckpt_core._hooks.blocks import find_attention, find_blocks, is_attention_module
from ckpt_core._hooks.install import install_checkpoint_hooks
from tests._tiny_models import ARCHS, DEFAULT_LAYERS, tiny_model

_DECODER = {"model.layers": ("self_attn",)}
# Per architecture: each stack (block container) and the outermost attention
# module(s) expected inside each of its blocks, self and cross.
STACKS: dict[str, dict[str, tuple[str, ...]]] = {
    "llama": _DECODER,
    "mistral": _DECODER,
    "granite": _DECODER,
    "smollm3": _DECODER,
    "qwen2": _DECODER,
    "qwen3": _DECODER,
    "qwen2_moe": _DECODER,
    "qwen3_moe": _DECODER,
    "olmoe": _DECODER,
    "glm4_moe": _DECODER,
    "deepseek_v3": _DECODER,
    "deepseek_v2": _DECODER,
    "mixtral": _DECODER,
    "gemma": _DECODER,
    "seed_oss": _DECODER,
    "ernie4_5": _DECODER,
    "gemma2": _DECODER,
    "gemma3": _DECODER,
    "phi3": _DECODER,
    "olmo3": _DECODER,
    "ministral3": _DECODER,
    "ministral": _DECODER,
    "exaone4": _DECODER,
    "glm4": _DECODER,
    "glm": _DECODER,
    "starcoder2": _DECODER,
    "cohere": _DECODER,
    "cohere2": _DECODER,
    "stablelm": _DECODER,
    "phi": _DECODER,
    "hunyuan_v1_dense": _DECODER,
    "gpt_oss": _DECODER,
    "gpt2": {"transformer.h": ("attn",)},
    "gpt_neox": {"gpt_neox.layers": ("attention",)},
    "opt": {"model.decoder.layers": ("self_attn",)},
    "falcon": {"transformer.h": ("self_attention",)},
    "t5": {"encoder.block": ("layer.0",), "decoder.block": ("layer.0", "layer.1")},
    "bart": {
        "model.encoder.layers": ("self_attn",),
        "model.decoder.layers": ("self_attn", "encoder_attn"),
    },
    "bert": {"bert.encoder.layer": ("attention",)},
    "llava": {
        "model.vision_tower.encoder.layers": ("self_attn",),
        "model.language_model.layers": ("self_attn",),
    },
}
# Never hooked at any granularity: projections, norms, MLPs, experts, the
# children of an attention module (T5's inner SelfAttention / EncDecAttention,
# BERT's attention.self).
FORBIDDEN = re.compile(
    r"(proj|norm|mlp|expert|dropout|\.(q|k|v|o|wi|wo)$|SelfAttention$|EncDecAttention$"
    r"|attention\.self$|embed)",
    re.IGNORECASE,
)
# A T5 sub-layer (`block.N.layer.M`) is never a block.
T5_SUBLAYER = re.compile(r"block\.\d+\.layer\.\d+$")


def test_every_arch_has_an_expectation() -> None:
    assert set(STACKS) == set(ARCHS)


def _blocks_of(arch: str, layers: int = DEFAULT_LAYERS) -> list[str]:
    return [f"{stack}.{i}" for stack in STACKS[arch] for i in range(layers)]


def _hf_marked(model: nn.Module, every_n_layers: int) -> set[str]:
    """Names of the layers HF's own activation checkpointing switches on."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.activation_checkpointing_enable(every_n_layers=every_n_layers)
    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing
    }


@pytest.mark.parametrize("arch", ARCHS)
def test_full_hooks_every_block_of_every_stack(arch: str) -> None:
    model = tiny_model(arch)
    report = install_checkpoint_hooks(model, "full")
    assert report.stacks == tuple(STACKS[arch])
    assert list(report.blocks) == _blocks_of(arch)
    assert list(report.hooked) == _blocks_of(arch)
    assert report.count == len(report.hooked)
    assert set(report.hooked) == _hf_marked(tiny_model(arch), every_n_layers=1)


@pytest.mark.parametrize("arch", ARCHS)
def test_selective_hooks_the_outermost_attention_of_every_block(arch: str) -> None:
    model = tiny_model(arch)
    report = install_checkpoint_hooks(model, "selective")
    expected = [
        f"{stack}.{i}.{attn}"
        for stack, attns in STACKS[arch].items()
        for i in range(DEFAULT_LAYERS)
        for attn in attns
    ]
    assert list(report.hooked) == expected
    modules = dict(model.named_modules())
    assert all("Attention" in type(modules[name]).__name__ for name in report.hooked)


@pytest.mark.parametrize("granularity", ["full", "medium", "selective"])
@pytest.mark.parametrize("arch", ARCHS)
def test_never_hooks_projections_norms_experts_or_sublayers(arch: str, granularity: str) -> None:
    report = install_checkpoint_hooks(tiny_model(arch), granularity)
    assert report.hooked
    assert not [name for name in report.hooked if FORBIDDEN.search(name)]
    if granularity != "selective":
        assert not [name for name in report.hooked if T5_SUBLAYER.search(name)]
    # No hooked module inside another hooked module.
    for name in report.hooked:
        assert not [o for o in report.hooked if name.startswith(o + ".")], name


@pytest.mark.parametrize("arch", ARCHS)
def test_medium_hooks_exactly_what_hf_every_n_layers_2_marks(arch: str) -> None:
    report = install_checkpoint_hooks(tiny_model(arch), "medium")
    assert set(report.hooked) == _hf_marked(tiny_model(arch), every_n_layers=2)


@pytest.mark.parametrize(
    ("arch", "layers", "expected"),
    [
        # One stack: indices 0, 2.
        ("llama", 3, ["model.layers.0", "model.layers.2"]),
        # Even stacks: 0, 2 of each stack.
        ("bart", 4, [f"model.{s}.layers.{i}" for s in ("encoder", "decoder") for i in (0, 2)]),
        # Odd stacks: HF counts ONE index across stacks, so the decoder starts at 1.
        ("bart", 3, ["model.encoder.layers.0", "model.encoder.layers.2", "model.decoder.layers.1"]),
        (
            "llava",
            3,
            [
                "model.vision_tower.encoder.layers.0",
                "model.vision_tower.encoder.layers.2",
                "model.language_model.layers.1",
            ],
        ),
    ],
)
def test_medium_counts_blocks_across_stacks_like_hf(arch: str, layers: int, expected: list) -> None:
    model = tiny_model(arch, num_layers=layers)
    report = install_checkpoint_hooks(model, "medium")
    assert list(report.hooked) == expected
    assert set(expected) == _hf_marked(tiny_model(arch, num_layers=layers), every_n_layers=2)


def test_report_is_json_serialisable() -> None:
    report = install_checkpoint_hooks(tiny_model("bart"), "selective")
    data = json.loads(json.dumps(dataclasses.asdict(report)))
    assert data["granularity"] == "selective"
    assert data["count"] == len(data["hooked"]) == 9
    assert data["stacks"] == ["model.encoder.layers", "model.decoder.layers"]
    assert data["skipped"] == [] and data["already_installed"] == 0
    assert data == json.loads(json.dumps(report.to_dict()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.count = 0  # type: ignore[misc]


def test_attention_never_a_norm_or_a_child_projection() -> None:
    layer = tiny_model("qwen3").model.layers[0]
    assert [name for name, _ in find_attention(layer)] == ["self_attn"]
    assert not is_attention_module("post_attention_layernorm", layer.post_attention_layernorm)
    assert not is_attention_module("q_norm", layer.self_attn.q_norm)
    assert not is_attention_module("q_proj", layer.self_attn.q_proj)


# --- models transformers does not mark ------------------------------------------


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 8)


class _Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)


class _Block(nn.Module):
    def __init__(self, experts: int) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(8)  # attention-ish NAME, but a norm
        self.mixer = _Attention()  # attention CLASS under a neutral name
        self.experts = nn.ModuleList(_Expert() for _ in range(experts))


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)


class _Plain(nn.Module):
    """Two blocks of six experts each, plus two prediction heads: no HF marks."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block(experts=6) for _ in range(2))
        self.heads = nn.ModuleList(_Head() for _ in range(2))


def test_fallback_takes_outermost_same_class_lists_never_experts() -> None:
    blocks = find_blocks(_Plain())
    # More experts than layers, yet experts are never blocks.
    assert {s: [n for n, _ in b] for s, b in blocks.items()} == {
        "layers": ["layers.0", "layers.1"],
        "heads": ["heads.0", "heads.1"],
    }
    assert [n for n, _ in find_attention(blocks["layers"][0][1])] == ["mixer"]


def test_no_split_modules_names_blocks_but_not_single_modules() -> None:
    model = _Plain()
    model._no_split_modules = ["_Block", "_Attention"]  # as HF lists them
    blocks = find_blocks(model)
    # `_Attention` is not repeated in a ModuleList: not a block; heads are not named.
    assert {s: [n for n, _ in b] for s, b in blocks.items()} == {"layers": ["layers.0", "layers.1"]}


def test_stack_hf_does_not_mark_is_added_from_no_split_modules() -> None:
    container = nn.Module()
    container.text = tiny_model("llama", num_layers=2)
    container.tower = _Plain()
    container._no_split_modules = ["_Block"]
    blocks = find_blocks(container)
    assert list(blocks) == ["text.model.layers", "tower.layers"]
    report = install_checkpoint_hooks(container, "full")
    assert report.hooked == (
        "text.model.layers.0",
        "text.model.layers.1",
        "tower.layers.0",
        "tower.layers.1",
    )


def test_model_without_blocks_hooks_nothing() -> None:
    report = install_checkpoint_hooks(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), "full")
    assert report.count == 0
    assert report.blocks == ()
