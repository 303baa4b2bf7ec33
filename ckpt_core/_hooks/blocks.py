"""Find a model's repeated transformer blocks and the attention inside them.

Checkpointing granularities are defined on these structures (docs/design.md §3):
``full`` = every block, ``medium`` = every other block, ``selective`` = the
outermost attention module(s) of every block.  Getting them wrong is costly in
both directions: wrapping an MoE expert or a T5 sub-layer makes "every other
block" mean something else, and wrapping ``q_proj`` inside a wrapped attention
recomputes it twice.

Blocks, in order of trust:

1. What transformers itself marks: instances of
   ``transformers.modeling_layers.GradientCheckpointingLayer`` (the exact set
   HF's own ``activation_checkpointing_enable`` acts on).
2. Classes named in ``_no_split_modules`` of any ``PreTrainedModel`` inside the
   model, when they sit in a ``ModuleList`` of same-class siblings (that list
   also names embeddings or attention classes, which are not blocks).
3. Fallback: the outermost ``ModuleList`` s of two or more same-class composite
   modules.

Every rule keeps only OUTERMOST modules (never one inside another chosen block)
and never anything under an ``experts`` container.

This module never imports torch or transformers at import time.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from torch import nn

# Class names that say "attention" - and the ones that only look like it.
_ATTENTION_CLASS = re.compile(r"attention|attn", re.IGNORECASE)
_NOT_ATTENTION_CLASS = re.compile(r"norm|dropout|rotary|embedding", re.IGNORECASE)
# Attribute names HF (and torch) use for attention modules whose class name
# does not say so.  Exact matches only: `attn_dropout` or
# `post_attention_layernorm` must never qualify by name.
_ATTENTION_NAMES = frozenset(
    {
        "attn",
        "attention",
        "self_attn",
        "self_attention",
        "selfattention",
        "cross_attn",
        "cross_attention",
        "crossattention",
        "encoder_attn",
        "encdecattention",
    }
)
_EXPERTS = re.compile(r"(^|\.)experts?(\.|$)")

Blocks = dict[str, list[tuple[str, "nn.Module"]]]


def gradient_checkpointing_layer_class() -> type | None:
    """HF's ``GradientCheckpointingLayer`` class, or None on transformers without it."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # transformers missing or older than the class
        return None
    return GradientCheckpointingLayer


def _is_inside(name: str, prefix: str) -> bool:
    """True when ``name`` is a strict descendant of ``prefix`` ("" is the root)."""
    return prefix == "" or name.startswith(prefix + ".")


def _ancestors(name: str) -> Iterator[str]:
    """``"a.b.c"`` -> ``"a.b"``, ``"a"``: the named modules that contain ``name``."""
    while "." in name:
        name = _parent_name(name)
        yield name


def _not_overlapping(
    candidates: list[tuple[str, nn.Module]], taken: list[str]
) -> list[tuple[str, nn.Module]]:
    """The candidates that neither equal, contain nor sit inside a ``taken`` name.

    Set lookups along each name's ancestry: comparing every pair was quadratic
    in the number of blocks.
    """
    taken_set = set(taken)
    containing_taken = {a for name in taken for a in _ancestors(name)}
    return [
        (name, module)
        for name, module in candidates
        if name not in taken_set
        and name not in containing_taken
        and taken_set.isdisjoint(_ancestors(name))
    ]


def _parent_name(name: str) -> str:
    return name.rpartition(".")[0]


def _outermost(candidates: Iterable[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """Drop candidates nested inside earlier ones (input in ``named_modules`` pre-order).

    In pre-order a module's subtree is contiguous, and the chosen modules are
    never nested, so a candidate inside any chosen one is inside the LAST one
    chosen: one comparison per candidate (checking all of them made this
    quadratic in the number of blocks).
    """
    chosen: list[tuple[str, nn.Module]] = []
    for name, module in candidates:
        if not chosen or not _is_inside(name, chosen[-1][0]):
            chosen.append((name, module))
    return chosen


def _named(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``named_modules`` minus the root and anything under an ``experts`` container."""
    for name, module in model.named_modules():
        if name and not _EXPERTS.search(name):
            yield name, module


def _same_class_siblings(model: nn.Module, name: str, module: nn.Module) -> bool:
    """True when ``module`` sits in a ModuleList with another module of its class."""
    from torch import nn

    parent = model.get_submodule(_parent_name(name)) if "." in name else model
    if not isinstance(parent, nn.ModuleList):
        return False
    return sum(type(m) is type(module) for m in parent) >= 2


def _marked_by_hf(model: nn.Module) -> list[tuple[str, nn.Module]]:
    layer_cls = gradient_checkpointing_layer_class()
    if layer_cls is None:
        return []
    return _outermost((n, m) for n, m in _named(model) if isinstance(m, layer_cls))


def _no_split_class_names(model: nn.Module) -> set[str]:
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def _marked_no_split(model: nn.Module) -> list[tuple[str, nn.Module]]:
    classes = _no_split_class_names(model)
    return _outermost(
        (n, m)
        for n, m in _named(model)
        if type(m).__name__ in classes and _same_class_siblings(model, n, m)
    )


def _homogeneous_lists(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Items of outermost ModuleLists holding >= 2 composite modules of one class."""
    from torch import nn

    items: list[tuple[str, nn.Module]] = []
    for name, module in _named(model):
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        classes = {type(m) for m in module}
        if len(classes) == 1 and all(any(True for _ in m.children()) for m in module):
            items.extend((f"{name}.{key}", m) for key, m in module.named_children())
    by_name = dict(items)
    # Re-walk in pre-order so `_outermost` sees parents before children.
    return _outermost((n, m) for n, m in _named(model) if n in by_name)


def _group_by_stack(blocks: list[tuple[str, nn.Module]]) -> Blocks:
    stacks: Blocks = {}
    for name, module in blocks:
        stacks.setdefault(_parent_name(name), []).append((name, module))
    return stacks


def find_blocks(model: nn.Module) -> Blocks:
    """Return the repeated transformer blocks of ``model``, grouped per stack.

    The result maps each stack (the name of the container, e.g.
    ``"model.encoder.layers"``) to its blocks as ``(name, module)`` pairs, names
    as in ``model.named_modules()``, in module order.  Stacks HF does not mark
    (a vision tower without ``GradientCheckpointingLayer``) are added from
    ``_no_split_modules``; the structural fallback is used only when neither
    finds anything.  Empty for a model without repeated blocks.
    """
    chosen = _marked_by_hf(model)
    marked = [n for n, _ in chosen]
    chosen += _not_overlapping(_marked_no_split(model), marked)
    if not chosen:
        chosen = _homogeneous_lists(model)
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    chosen.sort(key=lambda item: order[item[0]])
    return _group_by_stack(chosen)


def counted_blocks(
    model: nn.Module, blocks: Blocks
) -> tuple[list[tuple[int, str, nn.Module]], int]:
    """Every block with HF's block counter, and how many blocks that counter counts.

    HF (transformers 5.24, ``PreTrainedModel._set_gradient_checkpointing``) walks
    ``self.modules()`` with ONE counter shared by all stacks, counting every
    ``GradientCheckpointingLayer`` instance.  So in an encoder-decoder with an
    odd number of encoder layers the decoder starts at its local index 1.  The
    same counter is used here (blocks HF does not mark count in module order
    too), so ``every_n_layers`` and block-level plans name the blocks HF does.
    """
    layer_cls = gradient_checkpointing_layer_class()
    wanted = {name for stack in blocks.values() for name, _ in stack}
    counted: list[tuple[int, str, nn.Module]] = []
    counter = 0
    for name, module in model.named_modules():
        is_hf_layer = layer_cls is not None and isinstance(module, layer_cls)
        if name in wanted or is_hf_layer:
            if name in wanted:
                counted.append((counter, name, module))
            counter += 1
    return counted, counter


def every_nth_block(model: nn.Module, blocks: Blocks, n: int) -> list[tuple[str, nn.Module]]:
    """The blocks HF's ``activation_checkpointing_enable(every_n_layers=n)`` picks."""
    counted, _ = counted_blocks(model, blocks)
    return [(name, module) for counter, name, module in counted if counter % n == 0]


def is_attention_module(attr_name: str, module: Any) -> bool:
    """Whether ``module`` (reached as attribute ``attr_name``) is an attention module.

    By class name (``LlamaAttention``, ``T5LayerCrossAttention``, ...) or by a
    well-known attribute name; never a norm, dropout, rotary embedding or a
    leaf module, whatever it is called.
    """
    cls_name = type(module).__name__
    if _NOT_ATTENTION_CLASS.search(cls_name):
        return False
    if not any(True for _ in module.children()):
        return False  # a real attention module owns projections
    return bool(_ATTENTION_CLASS.search(cls_name)) or attr_name.lower() in _ATTENTION_NAMES


def find_attention(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost attention module(s) of ``block``: self- and cross-attention.

    Names are relative to ``block``.  Children of a chosen attention module
    (``q_proj``, ``k_norm``, an inner ``SelfAttention``) are never returned.
    """
    candidates = (
        (name, module)
        for name, module in _named(block)
        if is_attention_module(name.rpartition(".")[2], module)
    )
    return _outermost(candidates)
