"""The ``ckpt`` command line: resolve, describe, dry-run, presets, detect.

Standard-library argparse only, so a worker gets no new dependency, and only
the sub-command that needs torch imports it (``dry-run`` and ``detect``):
``ckpt resolve`` answers without loading torch or transformers.

Exit status: 0 on success, 2 on bad input (one line on stderr, no
traceback), 1 when the service was asked with ``--no-fallback`` and could not
answer.  ``--json`` prints exactly the object the Python API returns
(`Plan.to_dict()`, `DryRunReport.to_dict()`), whether it came from the
service, its fallback or the local library.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any, NoReturn

from ckpt_core._cli_flags import WORKLOAD_FIELDS, add_workload_args, workload_of_args
from ckpt_core._cli_text import plan_text, report_text
from ckpt_core._dry_run import MEASURE_FIELDS
from ckpt_core._errors import CkptError, ModelConfigError, UnknownGpuError
from ckpt_core._plan import make_plan
from ckpt_core._planning.gpus import lookup_gpu
from ckpt_core._planning.tiers import parse_tier
from ckpt_core._seed_api import describe_tier
from ckpt_core.client import ServiceUnavailableError, local_plan

EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 1

_EPILOG = """\
examples:
  ckpt resolve --tier auto --gpu A100-80GB
  ckpt resolve --tier auto --gpu-memory-gb 23.6 --transformers-version 4.57.0 --json
  ckpt resolve --tier auto --gpu H100-80GB --model llama-3.1-8b --seq-len 4096 --method lora
  ckpt resolve --tier auto --gpu H100-80GB --model llama-3.1-70b --seq-len 8192 --method lora \
      --world-size 8 --sharding zero3
  ckpt describe --tier medium
  ckpt dry-run --model ./config.json --tier selective --json
  ckpt presets
  ckpt detect
  ckpt resolve --tier auto --gpu L4 --service http://ckpt-advisor:8000

gpu memory is in GiB as torch reports it (an "80 GB" A100 reports ~79.2 GiB);
name the GPU with --gpu to avoid the question.
"""

# Request field names that the CLI spells as flags.
_API_NAMES: tuple[str, ...] = (
    "tier",
    "gpu",
    "gpu_memory_gb",
    "transformers_version",
    *WORKLOAD_FIELDS,
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line, with the same exit status."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The full ``ckpt`` parser (exposed for docs and tests)."""
    parser = _Parser(
        prog="ckpt",
        description="Decide and apply activation checkpointing for HuggingFace training jobs.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    resolve = _command(commands, "resolve", "the plan: tier, TrainingArguments kwargs, hooks")
    _add_plan_args(resolve)
    _add_model_arg(resolve, required=False)
    add_workload_args(resolve)
    _add_service_args(resolve)
    describe = _command(commands, "describe", "a one-line description of a tier")
    _add_tier_args(describe)
    _add_service_args(describe)
    dry = _command(commands, "dry-run", "build the model on the meta device and hook it")
    _add_plan_args(dry)
    _add_model_arg(dry, required=True)
    add_workload_args(
        dry, names=MEASURE_FIELDS, title="measurement (with --seq-len: activation bytes)"
    )
    _add_service_args(dry)
    _command(commands, "presets", "the bundled model presets")
    _command(commands, "detect", "this machine's GPUs, as the tiers see them")
    return parser


def _command(commands: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    sub = commands.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.add_argument("--json", action="store_true", help="print JSON for scripts")
    return sub


def _add_tier_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tier", required=True, help="off | full | medium | selective | auto")
    parser.add_argument(
        "--gpu", help="GPU model name, e.g. A100-80GB, H100-80GB, L4 (see `ckpt detect`)"
    )
    parser.add_argument("--gpu-memory-gb", type=float, help="GPU memory in GiB (not with --gpu)")


def _add_plan_args(parser: argparse.ArgumentParser) -> None:
    _add_tier_args(parser)
    parser.add_argument(
        "--transformers-version", help="the worker's transformers (default: the installed one)"
    )


def _add_model_arg(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--model",
        required=required,
        help="a bundled preset name (see `ckpt presets`) or a path to a config.json",
    )


def _add_service_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("service")
    group.add_argument("--service", metavar="URL", help="ask the ckpt-advisor service at URL")
    group.add_argument("--timeout", type=float, default=30.0, help="seconds per request (30)")
    group.add_argument("--retries", type=int, default=3, help="retries after the first try (3)")
    group.add_argument(
        "--no-fallback",
        action="store_true",
        help="fail instead of answering locally when the service is unreachable",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ckpt`` and ``python -m ckpt_core``; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="ckpt: %(levelname)s: %(message)s")
    handler = _HANDLERS[args.command]
    try:
        handler(args)
    except BrokenPipeError:  # `ckpt presets | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_UNAVAILABLE
    except ServiceUnavailableError as exc:  # --no-fallback and the service did not answer
        return _fail(EXIT_UNAVAILABLE, exc)
    except ImportError as exc:  # dry-run without torch, --service without httpx, a model
        # without torch under transformers: a library this command needs is missing
        return _fail(EXIT_UNAVAILABLE, f"{exc}: `ckpt {args.command}` needs it installed")
    except NotImplementedError as exc:  # a dry-run measurement this build cannot do
        return _fail(EXIT_UNAVAILABLE, exc)
    except CkptError as exc:
        return _fail(EXIT_BAD_INPUT, _in_flags(exc))
    except ValueError as exc:
        return _fail(EXIT_BAD_INPUT, exc)
    return 0


def _in_flags(exc: CkptError) -> str:
    """The error as a CLI user reads it: ``--seq-len ...``, not ``workload.seq_len ...``."""
    message = str(exc)
    head, _, leaf = (exc.field or "").partition(".")
    if head == "model":
        return f"--model: {message}"  # a config key, named as the config names it
    own = leaf.partition(".")[0] if head in ("workload", "measure") else head
    if exc.field and own and exc.field != own:  # the whole workload has no flag of its own
        message = message.replace(exc.field, own)
    # The error's own field, and any other API name a message mentions in passing.
    # Names with an underscore are field names wherever they appear; plain words
    # (tier, gpu, weights) are also prose, so those errors get the flag in front.
    for name in sorted((n for n in {own, *_API_NAMES} if "_" in n), key=len, reverse=True):
        flag = "--" + name.replace("_", "-")
        message = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w])", flag, message)
    flag = "--" + own.replace("_", "-")
    named = re.search(rf"{re.escape(flag)}(?![\w-])", message)
    return message if not own or named else f"{flag}: {message}"


def _fail(status: int, exc: BaseException | str) -> int:
    message = " ".join(str(exc).split())  # one line, whatever the message held
    print(f"ckpt: error: {message}", file=sys.stderr)
    return status


def _cmd_resolve(args: argparse.Namespace) -> None:
    kwargs = {
        "gpu": args.gpu,
        "transformers_version": args.transformers_version,
        "model": _model_spec(args.model) if args.model else None,
        "workload": workload_of_args(args),
    }
    if args.service:
        plan = _ask_service(args, lambda c: c.resolve(args.tier, args.gpu_memory_gb, **kwargs))
    else:
        plan = local_plan(args.tier, args.gpu_memory_gb, **kwargs)
    _emit(args, plan.to_dict(), plan_text(plan))


def _cmd_describe(args: argparse.Namespace) -> None:
    if args.service:
        text = _ask_service(args, lambda c: c.describe(args.tier, args.gpu_memory_gb, gpu=args.gpu))
    else:
        text = describe_tier(args.tier, args.gpu_memory_gb, gpu=args.gpu)
    _emit(args, {"tier": parse_tier(args.tier), "description": text}, text)


def _cmd_dry_run(args: argparse.Namespace) -> None:
    model = _model_spec(args.model)
    measure = workload_of_args(args)
    kwargs = {"gpu": args.gpu, "transformers_version": args.transformers_version}
    if args.service:
        report = _ask_service(
            args,
            lambda c: c.dry_run(model, args.tier, args.gpu_memory_gb, measure=measure, **kwargs),
        )
    else:
        from ckpt_core._dry_run import dry_run

        report = dry_run(model, args.tier, args.gpu_memory_gb, measure=measure, **kwargs)
    _emit(args, report.to_dict(), report_text(report.to_dict()))


def _cmd_presets(args: argparse.Namespace) -> None:
    from ckpt_core._configs.presets import list_presets

    presets = [preset.to_dict() for preset in list_presets()]
    lines = [f"{'name':<20} {'model_type':<12} {'architecture':<32} {'parameters':>10}"]
    lines += [
        f"{p['name']:<20} {p['model_type']:<12} {p['architecture'] or '-':<32} "
        f"{p['published_parameters'] / 1e9:>9.2f}B"
        for p in presets
    ]
    _emit(args, presets, "\n".join(lines))


def _cmd_detect(args: argparse.Namespace) -> None:
    gpus, note = detect_gpus()
    if not gpus:
        _emit(args, {"gpus": [], "note": note}, f"no GPU ({note})")
        return
    lines = [f"{'#':<3} {'device':<28} {'GiB':>7}  {'GPU table':<14} auto"]
    for gpu in gpus:
        lines.append(
            f"{gpu['index']:<3} {gpu['name']:<28} {gpu['memory_gib']:>7.2f}  "
            f"{gpu['gpu_table'] or '(not listed)':<14} {gpu['auto']}"
        )
    _emit(args, {"gpus": gpus, "note": note}, "\n".join(lines))


def detect_gpus() -> tuple[list[dict[str, Any]], str]:
    """This machine's GPUs: name, GiB as torch reports it, GPU-table match, auto's pick."""
    if find_spec("torch") is None:
        return [], "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return [], "torch.cuda reports no device"
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        memory_gib = props.total_memory / 2**30
        try:
            table_name: str | None = lookup_gpu(props.name).name
        except UnknownGpuError:
            table_name = None
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "memory_gib": round(memory_gib, 3),
                "gpu_table": table_name,
                "auto": make_plan("auto", memory_gib).granularity,
            }
        )
    return gpus, f"torch {torch.__version__}, memory in GiB (2**30 bytes)"


def _ask_service(args: argparse.Namespace, call: Callable[[Any], Any]) -> Any:
    """Run one client call; the client logs a fallback answer as a warning on stderr."""
    from ckpt_core.client import CkptClient

    client = CkptClient(
        args.service, timeout=args.timeout, retries=args.retries, fallback=not args.no_fallback
    )
    with client:
        return call(client).value


def _model_spec(value: str) -> dict[str, Any]:
    """``--model``: a path to a config.json (inline config) or a preset name."""
    path = Path(value)
    if not (value.endswith(".json") or path.is_file()):
        return {"preset": value}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelConfigError(f"cannot read model config {value!r}: {exc}", field="model") from exc
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{value!r} is not valid JSON: {exc}", field="model") from exc
    if not isinstance(config, dict):
        raise ModelConfigError(f"{value!r} must hold a JSON object", field="model")
    return {"config": config}


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(text)


_HANDLERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "resolve": _cmd_resolve,
    "describe": _cmd_describe,
    "dry-run": _cmd_dry_run,
    "presets": _cmd_presets,
    "detect": _cmd_detect,
}
