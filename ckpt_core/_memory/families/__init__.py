"""The model families the memory model describes, one module each, registered here.

Adding a family is one new module (ending with ``FAMILY = Family(...)``, see
`ckpt_core._memory.family`) and one line in `FAMILIES`.  Any other
``model_type`` is a `ModelConfigError` naming the supported ones (no silent
guess).

Pure Python.
"""

from __future__ import annotations

from typing import Any, Final

from ckpt_core._errors import ModelConfigError
from ckpt_core._memory.arch import Arch
from ckpt_core._memory.families import bert, decoder, falcon, gpt2, gpt_neox, opt, t5
from ckpt_core._memory.family import Family
from ckpt_core._memory.param_layout import ParamLayout

FAMILIES: Final[tuple[Family, ...]] = (
    decoder.FAMILY,
    gpt2.FAMILY,
    falcon.FAMILY,
    gpt_neox.FAMILY,
    opt.FAMILY,
    bert.FAMILY,
    t5.FAMILY,
)

_BY_NAME: Final = {family.name: family for family in FAMILIES}
_BY_MODEL_TYPE: Final = {
    model_type: family for family in FAMILIES for model_type in family.model_types
}

# model_type -> the name of the family that describes it.
MODEL_TYPE_FAMILIES: Final = {
    model_type: family.name for model_type, family in _BY_MODEL_TYPE.items()
}

# Model types transformers runs without sdpa / flash attention (see `Family`).
NO_SDPA: Final = frozenset().union(*(family.no_sdpa for family in FAMILIES))
NO_FLASH: Final = frozenset().union(*(family.no_flash for family in FAMILIES))
# Model types with experts in their layers (see `Family`).
MOE_MODEL_TYPES: Final = frozenset().union(*(family.moe_types for family in FAMILIES))


def supported_model_types() -> list[str]:
    """The model types the memory model describes."""
    return sorted(_BY_MODEL_TYPE)


def family_of(arch: Arch) -> Family:
    """The family that read ``arch``."""
    return _BY_NAME[arch.family]


def arch_of(config: Any) -> Arch:
    """The `Arch` of a transformers config object (composite configs: the text model)."""
    model_type = getattr(config, "model_type", None)
    family = _BY_MODEL_TYPE.get(model_type or "")
    if family is None:
        raise ModelConfigError(
            f"no memory model for model_type {model_type!r}; the estimate knows "
            f"{', '.join(supported_model_types())} (a dry run with measure works for any)",
            field="model.config.model_type",
        )
    return family.read_arch(config, model_type)


def param_layout(arch: Arch) -> ParamLayout:
    """The parameter layout of the model class transformers builds for ``arch``."""
    return family_of(arch).param_layout(arch)
