"""The seed's public names keep their answers for every valid input (docs/design.md §1, 7).

The oracle is a verbatim copy of the seed module: for valid inputs our
`resolve_granularity` and `describe_tier` must answer exactly as it does, and
`resolve_gradient_checkpointing` must differ only by the documented fixes.
Every invalid input the seed silently accepted now raises.
"""

from __future__ import annotations

import itertools
import math

import pytest

import ckpt_core
from tests import _seed_gradient_ckpt as seed

VALID_TIERS = (False, None, "", True, "full", "medium", "selective", "auto")
VALID_MEMORY = (
    None,
    0.5,
    8,
    15.9,
    23.99,
    24,
    24.0,
    24.01,
    40,
    79.2,
    79.99,
    80,
    80.0,
    80.01,
    141,
    192,
)


@pytest.mark.parametrize(("tier", "memory"), list(itertools.product(VALID_TIERS, VALID_MEMORY)))
def test_granularity_and_description_match_the_seed(tier: object, memory: float | None) -> None:
    assert ckpt_core.resolve_granularity(tier, memory) == seed.resolve_granularity(tier, memory)
    assert ckpt_core.describe_tier(tier, memory) == seed.describe_tier(tier, memory)


def test_thresholds_keep_their_names_and_values() -> None:
    assert ckpt_core.AUTO_FULL_THRESHOLD_GB == seed.AUTO_FULL_THRESHOLD_GB == 24.0
    assert ckpt_core.AUTO_SELECTIVE_THRESHOLD_GB == seed.AUTO_SELECTIVE_THRESHOLD_GB == 80.0


@pytest.mark.parametrize(("tier", "memory"), list(itertools.product(VALID_TIERS, VALID_MEMORY)))
def test_kwargs_differ_from_the_seed_only_by_the_fixes(tier: object, memory: float | None) -> None:
    """Seed: gradient_checkpointing=True for every tier. Now: exactly the tier (5.24 names)."""
    ours = ckpt_core.resolve_gradient_checkpointing(tier, memory, transformers_version="5.24.0")
    granularity = seed.resolve_granularity(tier, memory)
    non_reentrant = {"use_reentrant": False}
    if granularity is None or granularity == "selective":
        assert ours == {"activation_checkpointing": False}
    elif granularity == "full":
        assert ours == {
            "activation_checkpointing": True,
            "activation_checkpointing_kwargs": non_reentrant,
        }
    else:
        assert ours == {
            "activation_checkpointing": True,
            "activation_checkpointing_kwargs": {**non_reentrant, "every_n_layers": 2},
        }
    # With the old field names the seed's full answer is reproduced exactly.
    old = ckpt_core.resolve_gradient_checkpointing(tier, memory, transformers_version="5.22.2")
    if granularity == "full":
        assert old == seed.resolve_gradient_checkpointing(tier, memory)


# Inputs the seed silently turned into "off" (or accepted) and that now raise.
INVALID_TIERS = (
    "fulll",
    "ful",
    "selective-ish",
    "0",
    "1",
    "yes",
    "on",
    "auto!",
    "medium.",
    0,
    1,
    1.0,
    0.0,
    [],
    ["full"],
    {"tier": "full"},
    b"full",
    "selecti ve",
)


@pytest.mark.parametrize("tier", INVALID_TIERS, ids=repr)
def test_every_invalid_tier_raises_naming_the_valid_tiers(tier: object) -> None:
    for call in (
        ckpt_core.resolve_granularity,
        ckpt_core.describe_tier,
        ckpt_core.resolve_gradient_checkpointing,
    ):
        with pytest.raises(ValueError, match="valid tiers") as raised:
            call(tier)
        assert isinstance(raised.value, ckpt_core.InvalidTierError)
        assert raised.value.field == "tier"


INVALID_MEMORY = (math.nan, math.inf, -math.inf, -1, 0, 0.0, -0.0, "24", True, False, [24], 1e12)


@pytest.mark.parametrize("memory", INVALID_MEMORY, ids=repr)
def test_invalid_gpu_memory_raises(memory: object) -> None:
    for tier in ("auto", "full", None):
        with pytest.raises(ckpt_core.InvalidGpuMemoryError) as raised:
            ckpt_core.resolve_granularity(tier, memory)
        assert raised.value.field == "gpu_memory_gb"
        assert isinstance(raised.value, ValueError)
