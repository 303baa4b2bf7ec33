"""The service uses only public modules of its dependencies and of ckpt_core.

Every import in ``service/`` is read with `ast`: a module path with a component
that starts with ``_`` (``fastapi._compat``, ``ckpt_core._tiers``,
``json.encoder.c_make_encoder``'s kind of internals reached through a private
name) fails, as do the modules known to be internal although their names are
not marked (FastAPI's dependency solver and route internals, prometheus_client's
utils).  Relative imports and the service's own modules are the service's
business.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[1] / "service"
# Internal although not underscored: what the direct route handler once called.
INTERNAL = {
    "fastapi.dependencies",
    "fastapi.dependencies.utils",
    "fastapi.dependencies.models",
    "fastapi.routing.serialize_response",
    "prometheus_client.utils",
    "json.encoder.c_make_encoder",
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every module and imported name in `path`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _private(name: str) -> bool:
    parts = name.split(".")
    if parts[0] == "service":
        return False
    dunder = {"__future__", "__main__"}
    return any(p.startswith("_") and p not in dunder for p in parts) or any(
        name == internal or name.startswith(internal + ".") for internal in INTERNAL
    )


FILES = sorted(SERVICE.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SERVICE)))
def test_service_imports_only_public_modules(path: Path) -> None:
    bad = [f"{path.name}:{line} {name}" for line, name in _imports(path) if _private(name)]
    assert not bad, f"private modules or names imported: {bad}"


@pytest.mark.parametrize(
    "name",
    [
        "ckpt_core._tiers",
        "ckpt_core._tiers.parse_tier",
        "fastapi.dependencies.utils.request_body_to_args",
        "fastapi.routing.serialize_response",
        "prometheus_client.utils.floatToGoString",
        "json.encoder.c_make_encoder",
        "pydantic_core._pydantic_core",
    ],
)
def test_the_check_catches_private_imports(name: str) -> None:
    assert _private(name)


def test_the_check_passes_public_imports() -> None:
    for name in ("ckpt_core.parse_tier", "fastapi.routing.APIRoute", "logging.handlers"):
        assert not _private(name)
