"""The ``ckpt`` command, run as a real process: outputs, JSON, exit codes.

Expected answers come from the Python API in this process, so the tests check
that the CLI is a faithful front end, not the tier rules themselves (those
have their own tests).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ckpt_core import Workload, describe_tier, make_plan
from ckpt_core._configs.presets import preset_names

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUTF8": "1"}


def ckpt(*args: str, entry: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    command = entry or [sys.executable, "-m", "ckpt_core"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=ENV, timeout=120, check=False
    )


def ckpt_json(*args: str) -> Any:
    result = ckpt(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_bad_input(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr naming the problem, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def closed_port() -> int:
    """A loopback port with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_help_lists_every_command_and_examples() -> None:
    result = ckpt("--help")
    assert result.returncode == 0
    for command in ("resolve", "describe", "dry-run", "presets", "detect"):
        assert command in result.stdout
    assert "examples:" in result.stdout
    assert "ckpt resolve --tier auto --gpu A100-80GB" in result.stdout


def test_console_script_is_the_same_program() -> None:
    script = Path(sys.executable).with_name("ckpt")
    result = ckpt("resolve", "--tier", "full", "--json", entry=[str(script)])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == make_plan("full").to_dict()


OLD = "--transformers-version"


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (["--tier", "auto", "--gpu-memory-gb", "79.2"], {"gpu_memory_gb": 79.2}),
        (["--tier", "auto", "--gpu", "A100-80GB"], {"gpu": "A100-80GB"}),
        (["--tier", " Selective", OLD, "4.40.0"], {"transformers_version": "4.40.0"}),
        (["--tier", "medium", OLD, "5.15.0"], {"transformers_version": "5.15.0"}),
        (["--tier", "off"], {}),
    ],
)
def test_resolve_json_is_the_plan(args: list[str], kwargs: dict[str, Any]) -> None:
    tier = args[1]
    assert ckpt_json("resolve", *args) == make_plan(tier, **kwargs).to_dict()


def test_resolve_with_a_model_is_the_model_aware_plan() -> None:
    args = ["--tier", "auto", "--gpu", "L4", "--model", "llama-3.1-8b", "--seq-len", "8192"]
    answer = ckpt_json("resolve", *args, "--method", "qlora")
    expected = make_plan(
        "auto",
        gpu="L4",
        model={"preset": "llama-3.1-8b"},
        workload={"seq_len": 8192, "method": "qlora"},
    )
    assert answer == expected.to_dict()
    assert set(answer["estimate"]["tiers"]) == {"off", "selective", "medium", "full"}
    assert "what would fit" in answer["reason"]  # nothing fits: says what would
    assert answer["estimate"]["alternatives"] == expected.estimate["alternatives"]


def test_every_workload_field_has_a_resolve_flag() -> None:
    """What the Python API and the service take, a person can say on the command line."""
    result = ckpt("resolve", "--help")
    assert result.returncode == 0, result.stderr
    flags = set(re.findall(r"--[a-z-]+", result.stdout))
    for field in dataclasses.fields(Workload):
        assert "--" + field.name.replace("_", "-") in flags, field.name


# The real recipe's flags: a QLoRA step on an RTX 4090, each against its workload field.
RECIPE = ["--tier", "auto", "--gpu", "RTX 4090", "--model", "llama-3.2-1b", "--seq-len", "4096"]


@pytest.mark.parametrize(
    ("flags", "fields"),
    [
        (["--double-quant"], {"double_quant": True}),
        (["--kbit-preparation", "none"], {"kbit_preparation": "none"}),
        (["--no-logits-held"], {"logits_held": False}),
        (
            ["--sdpa-backend", "efficient", "--load-path", "to_device"],
            {
                "sdpa_backend": "efficient",
                "load_path": "to_device",
            },
        ),
        (["--gradients", "accumulate", "--method", "full"], {"gradients": "accumulate"}),
        (["--compute", "autocast", "--method", "lora"], {"compute": "autocast"}),
    ],
)
def test_recipe_flags_reach_the_estimate(flags: list[str], fields: dict[str, Any]) -> None:
    answer = ckpt_json("resolve", *RECIPE, "--method", "qlora", *flags)
    method = flags[flags.index("--method") + 1] if "--method" in flags else "qlora"
    base = {"seq_len": 4096, "method": method}
    model = {"preset": "llama-3.2-1b"}
    expected = make_plan("auto", gpu="RTX 4090", model=model, workload={**base, **fields})
    assert answer == expected.to_dict()
    default = make_plan("auto", gpu="RTX 4090", model=model, workload=base).to_dict()
    assert answer["estimate"]["tiers"] != default["estimate"]["tiers"]  # the flag did something


def test_a_bad_recipe_value_names_its_flag() -> None:
    assert_bad_input(ckpt("resolve", *RECIPE, "--compute", "fp8"), "--compute", "autocast")
    assert_bad_input(ckpt("resolve", *RECIPE, "--kbit-preparation", "x"), "--kbit-preparation")


def test_resolve_table_shows_kwargs_hooks_and_reason() -> None:
    plan = make_plan("selective", transformers_version="5.15.0")
    result = ckpt("resolve", "--tier", "selective", "--transformers-version", "5.15.0")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert rows["granularity"].split()[-1] == "selective"
    assert rows["hooks"].split()[-1] == "selective"
    assert "gradient_checkpointing=false" in rows["TrainingArguments"]
    assert plan.reason in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tier", "fulll"], "fulll"),
        (["--tier", "0"], "unknown tier"),
        (["--tier", "auto", "--gpu-memory-gb", "nan"], "--gpu-memory-gb"),
        (["--tier", "auto", "--gpu-memory-gb", "-8"], "--gpu-memory-gb"),
        (["--tier", "auto", "--gpu-memory-gb", "eighty"], "--gpu-memory-gb"),
        (["--tier", "auto", "--gpu", "Z9000"], "Z9000"),
        (["--tier", "auto", "--gpu", "A100-80GB", "--gpu-memory-gb", "80"], "not both"),
        (["--tier", "auto", "--gpu", "A100"], "A100-40GB or A100-80GB"),
        (["--tier", "full", "--transformers-version", "4.30.0"], "too old"),
        (["--tier", "full", "--transformers-version", "five"], "five"),
        (["--gpu", "L4"], "--tier"),
        (["--tier", "auto", "--model", "no-such-dir/config.json"], "no-such-dir/config.json"),
        (["--tier", "auto", "--service", "ftp://example"], "http"),
    ],
)
def test_resolve_bad_input_exits_2_with_one_line(args: list[str], needle: str) -> None:
    assert_bad_input(ckpt("resolve", *args), needle)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--gpu-memory-gb", "-8"], "--gpu-memory-gb"),
        (["--gpu", "L4", "--gpu-memory-gb", "8"], "--gpu"),
        (["--gpu", "L4", "--model", "gpt2", "--seq-len", "0"], "--seq-len"),
        (
            ["--gpu", "L4", "--model", "gpt2", "--seq-len", "8", "--micro-batch-size", "0"],
            "--micro",
        ),
        (["--gpu", "L4", "--model", "gpt2", "--seq-len", "8", "--lora-rank", "0"], "--lora-rank"),
        (["--gpu", "L4", "--model", "gpt2", "--seq-len", "8", "--headroom", "2"], "--headroom"),
    ],
)
def test_errors_name_flags_not_request_fields(args: list[str], flag: str) -> None:
    result = ckpt("resolve", "--tier", "auto", *args)
    assert_bad_input(result, flag)
    assert "workload." not in result.stderr
    for field in ("gpu_memory_gb", "seq_len", "micro_batch_size", "lora_rank"):
        assert field not in result.stderr


def test_unknown_command_exits_2() -> None:
    assert_bad_input(ckpt("resolv", "--tier", "full"), "resolv")


def test_model_file_that_is_not_a_json_object_exits_2(tmp_path: Path) -> None:
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    assert_bad_input(ckpt("resolve", "--tier", "auto", "--model", str(broken)), "not valid JSON")
    broken.write_text("[1, 2]")
    assert_bad_input(ckpt("resolve", "--tier", "auto", "--model", str(broken)), "JSON object")


@pytest.mark.parametrize(
    ("args", "tier", "memory"),
    [
        (["--tier", "medium"], "medium", None),
        (["--tier", "auto", "--gpu-memory-gb", "16"], "auto", 16),
    ],
)
def test_describe_text_and_json(args: list[str], tier: str, memory: float | None) -> None:
    expected = describe_tier(tier, memory)
    result = ckpt("describe", *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected
    assert ckpt_json("describe", *args)["description"] == expected


def test_describe_bad_tier_exits_2() -> None:
    assert_bad_input(ckpt("describe", "--tier", "selective-ish"), "selective-ish")


def test_presets_lists_every_bundled_preset() -> None:
    listed = ckpt_json("presets")
    assert [p["name"] for p in listed] == preset_names()
    assert all(p["published_parameters"] > 0 and p["model_type"] for p in listed)
    table = ckpt("presets")
    assert table.returncode == 0
    assert len(table.stdout.strip().splitlines()) == len(listed) + 1  # header + one per preset


def test_dry_run_json_is_the_report(tmp_path: Path) -> None:
    from ckpt_core._dry_run import dry_run
    from tests._tiny_models import tiny_config

    config = json.loads(tiny_config("t5").to_json_string())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    report = ckpt_json("dry-run", "--model", str(path), "--tier", "selective")
    expected = dry_run({"config": config}, "selective").to_dict()
    assert report.pop("elapsed_ms") >= 0
    del expected["elapsed_ms"]
    assert report == expected


def test_dry_run_table_shows_modules_and_measurement(tmp_path: Path) -> None:
    from tests._tiny_models import tiny_config

    path = tmp_path / "config.json"
    path.write_text(tiny_config("llama").to_json_string())
    args = ("--model", str(path), "--tier", "medium", "--seq-len", "16", "--dtype", "fp32")
    result = ckpt("dry-run", *args)
    assert result.returncode == 0, result.stderr
    assert "activation_bytes=" in result.stdout
    modules = result.stdout.split("modules:")[1].split()
    assert modules == ["model.layers.0", "model.layers.2"]  # every other block, from 0


def test_dry_run_measures_a_padded_batch() -> None:
    """--padded feeds an attention mask with padding: sdpa then keeps a float mask and
    Llama's grouped K / V repeated, per layer."""
    args = ("--model", "llama-3.2-1b", "--tier", "off", "--seq-len", "64", "--micro-batch-size")
    args = (*args, "2")
    plain, padded = ckpt_json("dry-run", *args), ckpt_json("dry-run", *args, "--padded")
    assert (plain["measured"]["padded"], padded["measured"]["padded"]) == (False, True)
    assert padded["measured"]["activation_bytes"] > plain["measured"]["activation_bytes"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "no-such-preset", "--tier", "full"], "no-such-preset"),
        (["--model", "gpt2", "--tier", "fulll"], "fulll"),
        (["--model", "gpt2", "--tier", "full", "--seq-len", "0"], "--seq-len"),
        (["--model", "gpt2", "--tier", "full", "--dtype", "fp8", "--seq-len", "8"], "--dtype"),
        (["--tier", "full"], "--model"),
    ],
)
def test_dry_run_bad_input_exits_2(args: list[str], needle: str) -> None:
    assert_bad_input(ckpt("dry-run", *args), needle)


def test_detect_reports_what_torch_sees() -> None:
    import torch

    data = ckpt_json("detect")
    if not torch.cuda.is_available():
        assert data["gpus"] == []
        assert ckpt("detect").stdout.startswith("no GPU")
        return
    assert len(data["gpus"]) == torch.cuda.device_count()
    for gpu in data["gpus"]:
        assert gpu["auto"] == make_plan("auto", gpu["memory_gib"]).granularity


def test_detect_on_gpus_matches_the_table_and_picks_auto(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The GPU branch, with torch.cuda answering as on a 2-GPU machine (CI has no GPU)."""
    import torch

    from ckpt_core.cli import detect_gpus, main

    cards = [("NVIDIA H100 80GB HBM3", 85_045_870_592), ("Acme Turbo 9000", 25 * 2**30)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(cards))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(name=cards[i][0], total_memory=cards[i][1]),
    )
    gpus, _ = detect_gpus()
    assert [g["gpu_table"] for g in gpus] == ["H100-80GB", None]
    for gpu, (_, total) in zip(gpus, cards, strict=True):
        assert gpu["memory_gib"] == pytest.approx(total / 2**30, abs=1e-3)
        assert gpu["auto"] == make_plan("auto", total / 2**30).granularity
    assert main(["detect"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 3 and "(not listed)" in table[2] and "H100-80GB" in table[1]


def test_service_unreachable_falls_back_to_the_local_answer() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    args = ("resolve", "--tier", "auto", "--gpu", "L4", "--service", url, "--retries", "0")
    result = ckpt(*args, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == make_plan("auto", gpu="L4").to_dict()
    assert "answering locally" in result.stderr


def test_service_unreachable_without_fallback_exits_1() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    result = ckpt("describe", "--tier", "full", "--service", url, "--retries", "0", "--no-fallback")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "unavailable" in result.stderr
    assert "Traceback" not in result.stderr


def test_resolve_imports_neither_torch_nor_httpx() -> None:
    """The CLI must start fast: a plain resolve loads no heavy module."""
    code = (
        "import sys; from ckpt_core.cli import main; main(['resolve', '--tier', 'auto']); "
        "print(sorted(m for m in ('torch', 'transformers', 'httpx', 'pydantic', 'fastapi') "
        "if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=ENV, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_missing_library_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers without torch raises ImportError (not ModuleNotFoundError) for a model."""
    from ckpt_core import cli

    def needs_torch(*args: object, **kwargs: object) -> None:
        raise ImportError("AutoConfig requires the PyTorch library but it was not found")

    monkeypatch.setattr(cli, "local_plan", needs_torch)
    status = cli.main(
        ["resolve", "--tier", "auto", "--gpu", "A100-80GB", "--model", "gpt2", "--seq-len", "512"]
    )
    stderr = capsys.readouterr().err
    assert status == cli.EXIT_UNAVAILABLE
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert "PyTorch" in stderr and "`ckpt resolve` needs it installed" in stderr


def test_a_model_without_a_sequence_length_names_the_flag() -> None:
    result = ckpt("resolve", "--tier", "auto", "--gpu", "A100-80GB", "--model", "gpt2")
    assert_bad_input(result, "a workload with at least --seq-len is required with a model")
