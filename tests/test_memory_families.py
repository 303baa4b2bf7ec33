"""The family registry: each model type belongs to exactly one family, reached by name."""

from __future__ import annotations

import pytest

from ckpt_core._configs.model_config import hf_config_from_dict, load_model_config
from ckpt_core._configs.presets import preset_names
from ckpt_core._errors import ModelConfigError
from ckpt_core._memory.families import FAMILIES, arch_of, family_of, supported_model_types
from ckpt_core._memory.family import Family


def test_each_model_type_has_exactly_one_family() -> None:
    claimed = [model_type for family in FAMILIES for model_type in family.model_types]
    assert len(claimed) == len(set(claimed))
    assert sorted(claimed) == supported_model_types()
    assert len({family.name for family in FAMILIES}) == len(FAMILIES)


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_is_read_by_the_family_that_claims_its_type(preset: str) -> None:
    config = hf_config_from_dict(load_model_config({"preset": preset}).config)
    arch = arch_of(config)
    family = family_of(arch)
    assert isinstance(family, Family)
    assert config.model_type in family.model_types
    assert family.read_arch(config, config.model_type) == arch


def test_an_unknown_model_type_names_the_supported_ones() -> None:
    config = hf_config_from_dict(
        {
            "model_type": "bloom",
            "hidden_size": 64,
            "n_head": 4,
            "n_layer": 2,
            "vocab_size": 100,
        }
    )
    with pytest.raises(ModelConfigError) as caught:
        arch_of(config)
    assert caught.value.field == "model.config.model_type"
    assert all(name in str(caught.value) for name in supported_model_types())
