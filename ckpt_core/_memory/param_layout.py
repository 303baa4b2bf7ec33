"""Exact parameter counts without building a model: the layout each family describes.

A `ParamLayout` splits a model's parameters the way the memory model needs
them: the linear layers inside the transformer blocks and a head's own (what
LoRA targets and bitsandbytes quantizes), MoE expert tensors (3-D parameters
in transformers 5.24: bitsandbytes leaves them unquantized), embeddings / LM
head, and the rest (norms, biases, routers, position tables).  Each family
builds its own (`Family.param_layout`); the total equals ``sum(p.numel() for
p in model.parameters())`` of the meta-built model (tied weights once) - a
test checks it for every bundled preset.  (`ckpt_core._configs.size_bounds` is the
other counter: a rough bound from raw config keys, before anything is built.)

Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_core._memory.arch import Arch


@dataclass(frozen=True, slots=True)
class Linear:
    """A group of identical linear layers: ``count`` copies of ``fan_in`` x ``fan_out``.

    ``name`` is the module path inside a block (``"self_attn.q_proj"``); LoRA
    targets match it by suffix, as PEFT's ``target_modules`` do.
    """

    name: str
    fan_in: int
    fan_out: int
    count: int
    bias: bool = False

    @property
    def weights(self) -> int:
        return self.fan_in * self.fan_out * self.count

    @property
    def parameters(self) -> int:
        return (self.fan_in * self.fan_out + (self.fan_out if self.bias else 0)) * self.count


@dataclass(frozen=True, slots=True)
class AdaptedParameter:
    """A parameter PEFT adapts where a model once had linear modules: transformers 5 stacks
    an MoE layer's experts into 3-D tensors and makes the router a module of its own, and
    PEFT maps the old modules' names in ``target_modules`` (or ``all-linear``) onto them.

    ``targets``: those names, which PEFT takes together only (gate and up fused into
    one tensor: the adapter's rank is the LoRA rank times their number); ``experts``
    stacked matrices of ``fan_in`` x ``fan_out`` in each of ``count`` layers.
    """

    name: str
    targets: tuple[str, ...]
    experts: int
    fan_in: int
    fan_out: int
    count: int

    def adapter_parameters(self, rank: int) -> int:
        """lora_A and lora_B: the rank per expert, each expert's in and out features."""
        return rank * len(self.targets) * self.experts * (self.fan_in + self.fan_out) * self.count


@dataclass(frozen=True, slots=True)
class ParamLayout:
    """Where a model's parameters are; all counts in parameters (not bytes)."""

    linears: tuple[Linear, ...]  # attention and MLP projections, a head's own (BERT's transform)
    experts: int  # MoE expert tensors
    embeddings: int  # input embeddings, plus the LM head when it is not tied
    other: int  # norms, biases of non-linear modules, routers, position tables
    # Loaded, never run by text-only training (a vision tower): no gradient, no state.
    idle: int = 0
    # Its linears, in module order (per layer, then the projector's): an adapter target
    # matching one by suffix gets an adapter there too (PEFT), which never trains.
    idle_linears: tuple[Linear, ...] = ()
    # Parameters PEFT adapts in place of the modules a LoRA target names (fused experts).
    adapted_parameters: tuple[AdaptedParameter, ...] = ()
    # Of ``other``: kept in fp32 in any load (``_keep_in_fp32_modules_strict``).
    fp32_other: int = 0

    @property
    def linear_parameters(self) -> int:
        return sum(linear.parameters for linear in self.linears)

    @property
    def total(self) -> int:
        return self.linear_parameters + self.experts + self.embeddings + self.other + self.idle

    @property
    def trained(self) -> int:
        """What a full fine-tune trains: every parameter the step runs."""
        return self.total - self.idle


def matches_target(name: str, target: str) -> bool:
    """PEFT's ``target_modules`` match: the module name, or a dotted suffix of it."""
    return name == target or name.endswith("." + target)


def embedding_parameters(arch: Arch) -> int:
    """Input embeddings plus an untied LM head."""
    return arch.vocab * arch.hidden * (1 if arch.tied else 2)
