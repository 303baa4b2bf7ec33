"""GPUs by name: where each lands, name normalisation, and the unit (GiB)."""

from __future__ import annotations

import pytest

import ckpt_core

# Where each card lands with the seed thresholds, memory in GiB as torch reports it.
LANDS = {
    "T4": "full",
    "V100-16GB": "full",
    "P100-16GB": "full",
    "L4": "full",
    "A10": "full",
    "A10G": "full",
    "RTX 2080 Ti": "full",
    "RTX 3080-10GB": "full",
    "RTX 3060-12GB": "full",
    "RTX 3080 Ti": "full",
    "RTX 4060 Ti-16GB": "full",
    "RTX 4000 Ada": "full",
    "RTX 3060 Ti": "full",
    "RTX 3070": "full",
    "RTX 4070 Ti SUPER": "full",
    "RTX 4080": "full",
    "RTX 4080 SUPER": "full",
    "P40": "full",
    "RTX 3090": "full",
    "RTX 4090": "full",
    "RTX 3090 Ti": "full",
    "RTX A5000": "full",
    "V100-32GB": "medium",
    "RTX 5090": "medium",
    "A100-40GB": "medium",
    "A40": "medium",
    "L40S": "medium",
    "RTX A6000": "medium",
    "Quadro RTX 8000": "medium",
    "RTX 6000 Ada": "medium",
    "A100-80GB": "medium",
    "H100-80GB": "medium",
    "H100-NVL": "selective",
    "GH200": "selective",
    "RTX PRO 6000 Blackwell": "selective",
    "H20": "selective",
    "H200": "selective",
    "B200": "selective",
    "MI300X": "selective",
}


@pytest.mark.parametrize(("gpu", "granularity"), LANDS.items())
def test_where_each_gpu_lands(gpu: str, granularity: str) -> None:
    assert ckpt_core.resolve_granularity("auto", gpu=gpu) == granularity
    spec = ckpt_core.lookup_gpu(gpu)
    # Reported memory is below the marketed decimal GB, and never near a threshold.
    assert spec.memory_gib < spec.marketed_gb
    assert abs(spec.memory_gib - ckpt_core.AUTO_FULL_THRESHOLD_GB) > 0.3
    assert abs(spec.memory_gib - ckpt_core.AUTO_SELECTIVE_THRESHOLD_GB) > 0.3
    assert ckpt_core.resolve_granularity("auto", spec.memory_gib) == granularity


def test_the_table_covers_the_issue_list() -> None:
    assert set(LANDS) == {spec.name for spec in ckpt_core.GPUS}


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("a100 80gb", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("rtx-3090", "RTX 3090"),
        ("Tesla T4", "T4"),
        ("Tesla P100-PCIE-16GB", "P100-16GB"),
        ("AMD Instinct MI300X", "MI300X"),
        ("  h200 ", "H200"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA GeForce RTX 5090", "RTX 5090"),
        ("GeForce RTX 2080 Ti", "RTX 2080 Ti"),
    ],
)
def test_names_as_torch_and_people_write_them(name: str, canonical: str) -> None:
    assert ckpt_core.lookup_gpu(name).name == canonical


@pytest.mark.parametrize("name", ["A100", "H100", "V100", "RTX 9090", "", "   ", "80GB"])
def test_ambiguous_or_unknown_names_are_errors(name: str) -> None:
    with pytest.raises(ckpt_core.UnknownGpuError, match="gpu") as raised:
        ckpt_core.lookup_gpu(name)
    assert raised.value.field == "gpu"


def test_an_80gb_card_is_medium_in_gib_but_would_be_selective_in_decimal_gb() -> None:
    spec = ckpt_core.lookup_gpu("A100-80GB")
    decimal_gb = spec.memory_gib * 2**30 / 1e9
    assert ckpt_core.resolve_granularity("auto", spec.memory_gib) == "medium"
    assert ckpt_core.resolve_granularity("auto", decimal_gb) == "selective"


def test_gpu_and_memory_together_is_an_error() -> None:
    with pytest.raises(ckpt_core.InvalidGpuMemoryError, match="not both"):
        ckpt_core.make_plan("auto", 40, gpu="A100-80GB")


def test_plan_carries_the_canonical_gpu_name() -> None:
    plan = ckpt_core.make_plan("auto", gpu="nvidia h100 80gb hbm3")
    assert plan.gpu == "H100-80GB"
    assert plan.gpu_memory_gb == ckpt_core.lookup_gpu("H100-80GB").memory_gib
    assert "H100-80GB" in plan.reason


@pytest.mark.parametrize(
    ("name", "candidates"),
    [
        ("A100", ("A100-40GB", "A100-80GB")),
        ("h100", ("H100-80GB", "H100-NVL")),
        ("V100", ("V100-16GB", "V100-32GB")),
    ],
)
def test_an_ambiguous_name_lists_the_candidates(name: str, candidates: tuple[str, ...]) -> None:
    with pytest.raises(ckpt_core.UnknownGpuError) as caught:
        ckpt_core.lookup_gpu(name)
    assert "ambiguous" in str(caught.value)
    assert all(candidate in str(caught.value) for candidate in candidates)
    assert caught.value.field == "gpu"


def test_a_unique_prefix_is_a_question_not_a_guess() -> None:
    # torch names the 8 GB and the 12 GB RTX 3060 alike: answering 12 GB could be wrong.
    with pytest.raises(ckpt_core.UnknownGpuError, match=r"did you mean RTX 3060-12GB\?") as raised:
        ckpt_core.lookup_gpu("NVIDIA GeForce RTX 3060")
    assert "3060 Ti" not in str(raised.value)  # another card, not a size of this one


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4070 Ti", "NVIDIA GeForce RTX 2080"])
def test_a_card_is_never_offered_its_ti_or_super(name: str) -> None:
    # The RTX 4070 Ti (12 GB) is no 4070 Ti SUPER (16 GB), the 2080 (8 GB) no 2080 Ti.
    with pytest.raises(ckpt_core.UnknownGpuError, match="; known: ") as raised:
        ckpt_core.lookup_gpu(name)
    assert "did you mean" not in str(raised.value)


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("H20", "H20"), ("H200", "H200"), ("NVIDIA GeForce RTX 4060 Ti", None)],
)
def test_a_name_is_never_taken_for_a_longer_one(name: str, canonical: str | None) -> None:
    # H20 is a 96 GB card of its own, not an H200; the 4060 Ti comes in 8 and 16 GB.
    if canonical is None:
        with pytest.raises(ckpt_core.UnknownGpuError, match="did you mean RTX 4060 Ti-16GB"):
            ckpt_core.lookup_gpu(name)
    else:
        assert ckpt_core.lookup_gpu(name).name == canonical
