"""The ``ckpt`` commands the README, docs/ and ``ckpt --help`` show are real.

Every command line in a code block (``ckpt ...``, ``.venv/bin/ckpt ...``, with or
without a ``$`` prompt) and every inline code span with flags is parsed by the
CLI's own argparse parser; the README's and the help's examples are also run,
and where the README shows the output, the lines shown are the lines printed
(in order; a line ending in ``...`` is cut there).  ``--service URL``
examples are run against a closed loopback port (the fallback answers), and
``./config.json`` is written from a bundled preset: nothing reaches the network.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
from pathlib import Path

import pytest

from ckpt_core import cli
from ckpt_core._configs.presets import load_preset
from tests.test_cli import ckpt

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

_PROGRAM = re.compile(r"^(?:\$ )?(?:\.venv/bin/)?ckpt (?=\S)")
_INLINE = re.compile(r"`((?:\.venv/bin/)?ckpt [^`]+)`")
_SUBCOMMANDS = ("resolve", "describe", "dry-run", "presets", "detect")


def _block_commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown after it) for each ckpt line in a code block."""
    found: list[tuple[str, list[str]]] = []
    in_block = False
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if line.startswith("```"):
            in_block = not in_block
            continue
        if not in_block or not _PROGRAM.match(line):
            continue
        command = line.split("  #")[0].strip()
        output: list[str] = []
        if command.startswith("$ "):
            for after in lines[number + 1 :]:
                if after.startswith(("```", "$ ")):
                    break
                output.append(after)
        found.append((_PROGRAM.sub("", command), output))
    return found


def _inline_commands(text: str) -> list[str]:
    return [
        _PROGRAM.sub("", " ".join(span.split())) for span in _INLINE.findall(text) if "--" in span
    ]


def _help_examples() -> list[str]:
    epilog = cli.build_parser().epilog or ""
    body = epilog.split("examples:", 1)[1].split("\n\n", 1)[0]
    joined = body.replace("\\\n", " ")
    return [_PROGRAM.sub("", " ".join(line.split())) for line in joined.splitlines() if line]


BLOCKS = [
    (doc.name, command, output)
    for doc in DOCS
    for command, output in _block_commands(doc.read_text("utf-8"))
]
INLINE = [
    (doc.name, command) for doc in DOCS for command in _inline_commands(doc.read_text("utf-8"))
]
HELP = _help_examples()
README_COMMANDS = [(command, output) for name, command, output in BLOCKS if name == "README.md"]


def test_there_are_examples_to_check() -> None:
    assert len(README_COMMANDS) >= 7, README_COMMANDS
    assert any(output for _, output in README_COMMANDS), "the README shows one real answer"
    assert len(HELP) >= 8, HELP
    assert INLINE, "docs/ name commands inline"


@pytest.mark.parametrize(
    "command",
    [command for _, command, _ in BLOCKS] + [command for _, command in INLINE] + HELP,
)
def test_every_documented_command_parses(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = shlex.split(command)
    assert args[0] in (*_SUBCOMMANDS, "--help"), command
    try:
        cli.build_parser().parse_args(args)
    except SystemExit as exc:  # argparse exits on an unknown flag or a missing one
        if exc.code != 0 or "--help" not in args:
            pytest.fail(f"`ckpt {command}` does not parse (exit {exc.code})")
        assert "usage: ckpt" in capsys.readouterr().out


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _runnable(command: str, tmp_path: Path) -> list[str]:
    """The command's words, with what only the reader's machine has replaced."""
    words = shlex.split(command)
    for index, word in enumerate(words):
        if word.startswith("http://") and words[index - 1] == "--service":
            words[index] = f"http://127.0.0.1:{_closed_port()}"
        elif word == "./config.json":
            path = tmp_path / "config.json"
            path.write_text(json.dumps(load_preset("llama-3.2-1b")))
            words[index] = str(path)
    return words


@pytest.mark.parametrize(
    ("command", "shown"),
    README_COMMANDS + [(command, []) for command in HELP],
    ids=[c for c, _ in README_COMMANDS] + [f"help: {c}" for c in HELP],
)
def test_the_readme_and_help_examples_run(command: str, shown: list[str], tmp_path: Path) -> None:
    result = ckpt(*_runnable(command, tmp_path))
    assert result.returncode == 0, (command, result.stderr)
    missing = _not_printed(shown, result.stdout.splitlines())
    assert missing is None, f"`ckpt {command}` no longer prints {missing!r}:\n{result.stdout}"


def _not_printed(shown: list[str], printed: list[str]) -> str | None:
    """The first shown line not printed in order (``...`` at its end: a prefix), or None."""
    lines = iter(printed)
    for line in shown:
        want = line.removesuffix("...")
        cut = line.endswith("...")
        if not any(got.startswith(want) if cut else got == want for got in lines):
            return line
    return None
