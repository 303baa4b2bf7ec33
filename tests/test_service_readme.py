"""The README's service examples still get the answers pasted there.

Every ``$ curl -s localhost:8000...`` line of the README's Service section whose
next line is the whole answer (no ``...``, no ``-i``, no pipe) is replayed
through the app, and the answer compared: as JSON when it is JSON (a dry run's
``elapsed_ms`` aside: it is a time), else as text.
"""

from __future__ import annotations

import itertools
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

README = Path(__file__).resolve().parents[1] / "README.md"


def _examples() -> list[tuple[str, str]]:
    text = README.read_text("utf-8")
    lines = text[text.index("## Service") :].splitlines()
    found = []
    for line, answer in itertools.pairwise(lines):
        if not line.startswith("$ curl -s ") or "localhost:8000" not in line or line.endswith("\\"):
            continue
        if " -i " in line or "|" in line or "..." in line or "..." in answer:
            continue
        found.append((line.removeprefix("$ "), answer))
    return found


EXAMPLES = _examples()


def test_the_readme_has_examples_to_replay() -> None:
    assert len(EXAMPLES) >= 6, EXAMPLES


def _request(command: str) -> tuple[str, str, dict[str, str], bytes | None]:
    words = shlex.split(command)[1:]
    headers: dict[str, str] = {}
    data: bytes | None = None
    url = ""
    words = [w for w in words if w != "-s"]
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
    return ("POST" if data is not None else "GET"), path, headers, data


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k != "elapsed_ms"}
    return value


@pytest.mark.parametrize(("command", "answer"), EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_a_readme_example_gets_its_answer(api: TestClient, command: str, answer: str) -> None:
    method, path, headers, data = _request(command)
    response = api.request(method, path, headers=headers, content=data)
    if answer.startswith("{"):
        assert _without_times(response.json()) == _without_times(json.loads(answer))
    else:
        assert response.text == answer
