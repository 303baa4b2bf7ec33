#!/usr/bin/env python3
"""Write openapi/openapi.json from the app (deterministic: sorted keys, indent 2, newline).

Usage: .venv/bin/python scripts/gen_openapi.py [--check]
With --check, write nothing and exit 1 when the committed file is out of date.
tests/test_service_openapi.py runs the same comparison.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "openapi" / "openapi.json"


def render() -> str:
    """The OpenAPI document of `create_app()` as committed text."""
    sys.path.insert(0, str(REPO))
    from service.app import create_app

    return json.dumps(create_app().openapi(), sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        current = OUTPUT.read_text("utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(REPO)} is out of date: run scripts/gen_openapi.py")
            return 1
        return 0
    if argv:
        print(__doc__)
        return 2
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(text, "utf-8")
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
