"""The curl examples of the README and docs/ still get the answers pasted there.

Every ``$ curl ... localhost:8000...`` line of README.md and docs/*.md (with its
``\\`` continuation lines) is replayed through the app:

- an answer shown whole on the next line (no ``-i``, no pipe, no ``...``) is
  compared, as JSON when it is JSON (a dry run's ``elapsed_ms`` aside: it is
  a time), else as text;
- ``-i`` examples must get the status of their ``HTTP/1.1`` line (a 401 from an
  app with a bearer token configured, as the example is about), and the JSON
  body shown, if whole;
- a pipe into ``python3 -c`` runs that program on the answer and compares what
  it prints; any other example must be accepted (2xx).

Commands with ``...`` in them are elided by hand and cannot be replayed.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import service_client

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOKEN = "readme-" + "0123456789abcdef" * 2


@dataclass(frozen=True)
class Example:
    doc: str
    command: str
    answer: tuple[str, ...]

    @property
    def whole(self) -> bool:
        """The answer is one whole line to compare."""
        words = shlex.split(self.command)
        return (
            len(self.answer) == 1
            and "-i" not in words
            and "|" not in words
            and "..." not in self.answer[0]
        )


def _examples(doc: Path) -> list[Example]:
    lines = doc.read_text("utf-8").splitlines()
    found = []
    for number, line in enumerate(lines):
        if not line.startswith("$ curl ") or "localhost:8000" not in line:
            continue
        command, after = line.removeprefix("$ "), number + 1
        while command.endswith("\\"):
            command = command.removesuffix("\\") + " " + lines[after].strip()
            after += 1
        answer = []
        for following in lines[after:]:
            if not following or following.startswith(("$ ", "```")):
                break
            answer.append(following)
        if "..." not in command:
            found.append(Example(doc.name, command, tuple(answer)))
    return found


EXAMPLES = [example for doc in DOCS for example in _examples(doc)]


def test_the_docs_have_examples_to_replay() -> None:
    whole = [e for e in EXAMPLES if e.whole]
    assert len([e for e in whole if e.doc == "service.md"]) >= 6, EXAMPLES
    assert [e for e in whole if e.doc == "README.md"], "the README shows a real answer"
    assert len(EXAMPLES) > len(whole), "the -i, piped and shortened examples are replayed too"


def _request(command: str) -> tuple[str, str, dict[str, str], bytes | None, list[str]]:
    """Method, path, headers, body, and the pipe's command after ``|`` (or [])."""
    words = shlex.split(command)[1:]
    pipe: list[str] = []
    if "|" in words:
        at = words.index("|")
        words, pipe = words[:at], words[at + 1 :]
    headers: dict[str, str] = {}
    data: bytes | None = None
    url = ""
    words = [w for w in words if w not in ("-s", "-i")]
    while words:
        word = words.pop(0)
        if word == "-H":
            name, _, value = words.pop(0).partition(":")
            headers[name.strip()] = value.strip()
        elif word == "-d":
            data = words.pop(0).encode()
            headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        else:
            url = word
    path = url.removeprefix("localhost:8000")
    return ("POST" if data is not None else "GET"), path, headers, data, pipe


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k != "elapsed_ms"}
    return value


@pytest.fixture(scope="module")
def authed() -> Any:
    with service_client(auth_tokens=TOKEN) as client:
        yield client


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{e.doc}: {e.command}" for e in EXAMPLES])
def test_a_documented_example_gets_its_answer(
    api: TestClient, authed: TestClient, example: Example
) -> None:
    method, path, headers, data, pipe = _request(example.command)
    status_line = next((a for a in example.answer if a.startswith("HTTP/1.1 ")), None)
    expected = int(status_line.split()[1]) if status_line else None
    client = authed if expected == 401 else api
    response = client.request(method, path, headers=headers, content=data)
    if example.whole:
        answer = example.answer[0]
        if answer.startswith("{"):
            assert _without_times(response.json()) == _without_times(json.loads(answer))
        else:
            assert response.text == answer
        return
    if expected is not None:
        assert response.status_code == expected, response.text
        bodies = [a for a in example.answer if a.startswith("{") and "..." not in a]
        for body in bodies:
            assert _without_times(response.json()) == _without_times(json.loads(body))
        return
    assert 200 <= response.status_code < 300, response.text
    if pipe[:2] == ["python3", "-c"]:
        done = subprocess.run(
            [sys.executable, "-c", pipe[2]],
            input=response.text,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert json.loads(done.stdout) == json.loads(example.answer[0])
