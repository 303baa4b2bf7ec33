"""The contract of a model family: what the memory model must know about it.

Each family lives in one module of `ckpt_core._memory.families` and ends with a
``FAMILY = Family(...)``; the registry there lists each family once.  Every
piece of model-specific knowledge - reading its configs, its parameters, what
each op of its forward keeps, its FLOPs - is reached through this record, so
the estimate itself never asks which family it has.

Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt_core._memory.arch import Arch, BlockKind
from ckpt_core._memory.costs import BlockFlops
from ckpt_core._memory.ledger import BlockMode, Ledger, Step
from ckpt_core._memory.model_trace import LLAMA, TraceModel
from ckpt_core._memory.param_layout import ParamLayout


@dataclass(frozen=True, slots=True)
class Family:
    """One model family's memory-model knowledge.

    - ``model_types``: the HF ``model_type`` values it describes;
    - ``read_arch(config, model_type)``: the `Arch` of a transformers config;
    - ``param_layout(arch)``: where its parameters are (exact counts);
    - ``stacks(arch)``: blocks per stack, in module order (T5: encoder, decoder);
    - ``block_kind(arch, stack, index)``: what sets a block apart;
    - ``embed_ledger`` / ``head_ledger`` / ``block_ledger``: what the
      embeddings, the head with its loss, and a block in a mode keep;
    - ``block_flops(arch, step, kind)`` and ``head_flops(arch, step)``: forward
      FLOPs as FlopCounterMode counts them;
    - ``loss_in_fp32``: transformers' loss upcasts the logits (causal LMs) rather
      than taking them in the dtype (BERT, T5);
    - ``no_sdpa`` / ``no_flash``: model types whose classes transformers runs
      without sdpa / flash attention (checked against the classes by a test);
    - ``moe_types``: model types whose configs give their layers experts (stacked
      3-D tensors in transformers 5), which ``optimizer: adafactor`` is not
      modelled for;
    - ``keep_in_fp32``: names of the linears transformers keeps in fp32 when it
      loads the model in fp16 (the classes' ``_keep_in_fp32_modules``, checked
      by a test): T5's ``wo``;
    - ``trace(arch)``: the forward the allocator replay runs around and in its
      blocks (`ckpt_core._memory.model_trace.TraceModel`; Llama-style unless said);
    - ``replayed_exactly(arch)``: the replay's ``trace`` is this model's own
      forward, so its allocated peak is taken from the replay; other models
      take only the replay's fragmentation;
    - ``idle_tensors(arch)``: parameters loaded but never run by text-only
      training (Gemma 3's vision tower), per tensor in module order, (elements,
      a linear weight's output rows or 0): the replay loads them (bitsandbytes
      quantizes the linears' weights), and they get no gradient and no
      optimizer state;
    """

    name: str
    model_types: tuple[str, ...]
    read_arch: Callable[[Any, str], Arch]
    param_layout: Callable[[Arch], ParamLayout]
    stacks: Callable[[Arch], tuple[int, ...]]
    block_kind: Callable[[Arch, int, int], BlockKind]
    embed_ledger: Callable[[Arch, Step], Ledger]
    head_ledger: Callable[[Arch, Step], Ledger]
    block_ledger: Callable[[Arch, Step, BlockMode, BlockKind], Ledger]
    block_flops: Callable[[Arch, Step, BlockKind], BlockFlops]
    head_flops: Callable[[Arch, Step], int]
    loss_in_fp32: bool = True
    no_sdpa: frozenset[str] = frozenset()
    no_flash: frozenset[str] = frozenset()
    moe_types: frozenset[str] = frozenset()
    keep_in_fp32: frozenset[str] = frozenset()
    trace: Callable[[Arch], TraceModel] = lambda arch: LLAMA
    replayed_exactly: Callable[[Arch], bool] = lambda arch: False
    idle_tensors: Callable[[Arch], tuple[tuple[int, int], ...]] = lambda arch: ()


def single_stack(arch: Arch) -> tuple[int, ...]:
    """One stack of ``arch.layers`` blocks (every family but encoder-decoders)."""
    return (arch.layers,)


def uniform_blocks(arch: Arch, stack: int, index: int) -> BlockKind:
    """Every block keeps the same storages."""
    return BlockKind()
