"""CPU instructions per request of the service and of a bare FastAPI app, under callgrind.

Run: ``.venv/bin/python -m bench.instructions`` (needs ``apt-get install -y
valgrind``; about a minute per variant); ``--requests`` (1000) per count.

Wall-clock figures on a shared machine move with its load (``bench/http_load.py``
runs each pair back to back for that reason); instruction counts do not:
callgrind counts what the interpreter executes, in every thread, whatever
else the machine does.  Each variant runs twice in a fresh interpreter under
``valgrind --tool=callgrind``, with 50 and with 50 + ``--requests`` requests
handed to the ASGI app in a loop (no server, no sockets: uvicorn's own work,
the same for both apps, is left out), and the difference over ``--requests``
is its cost per request.  The access log, where it is on, goes to
``/dev/null`` through the service's own logging, its writer thread included.
The worker pools are not started (requests without a model never use them).

Variants: the bare app of ``bench/_http_server.py``; the service as
configured by default; with its access log off; without its body-limit
middleware; without its request-context middleware (id, metrics, access
log); without both.  Differences between rows are the cost of what a row
removes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import subprocess
import sys
from typing import Any, Final

from bench._common import ROOT, table

WARM_UP_REQUESTS: Final = 50
# name -> (request kind, log level, middlewares removed)
VARIANTS: Final[dict[str, tuple[str, str, tuple[str, ...]]]] = {
    "bare POST": ("bare_post", "INFO", ()),
    "service POST /resolve": ("resolve", "INFO", ()),
    "  access log off": ("resolve", "WARNING", ()),
    "  no body-limit middleware": ("resolve", "INFO", ("BodyLimitMiddleware",)),
    "  no request-context middleware": ("resolve", "INFO", ("RequestContextMiddleware",)),
    "  neither": ("resolve", "INFO", ("BodyLimitMiddleware", "RequestContextMiddleware")),
    "bare GET": ("bare_get", "INFO", ()),
    "service GET /describe": ("describe", "INFO", ()),
    "  access log off ": ("describe", "WARNING", ()),
}
_COLLECTED = re.compile(r"Collected\s*:\s*([\d,]+)")


def _instructions(kind: str, count: int, level: str, strip: tuple[str, ...]) -> int:
    """Instructions callgrind counts for a fresh interpreter answering `count` requests."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "bench.instructions",
        "--child",
        kind,
        str(count),
        level,
        ",".join(strip),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"no callgrind total in:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


async def _answer(kind: str, count: int, level: str, strip: tuple[str, ...]) -> None:
    """The child: `count` requests of one kind, in process (see the module docstring)."""
    import service.app

    async def no_pools(state: Any) -> None:  # the request path only
        return None

    service.app._warm_up = no_pools  # type: ignore[attr-defined]
    from bench._http_server import BARE_DESCRIBE, BARE_RESOLVE, bare_app
    from bench.asgi_layers import _STATES, BODY, QUERY, _call, _service
    from service.logs import flush_logs

    requests = {
        "bare_post": ("POST", BARE_RESOLVE, b"", BODY),
        "bare_get": ("GET", BARE_DESCRIBE, QUERY, b""),
        "resolve": ("POST", "/resolve", b"", BODY),
        "describe": ("GET", "/describe", QUERY, b""),
    }
    bare = kind.startswith("bare")
    app = bare_app() if bare else _service(strip)
    async with contextlib.AsyncExitStack() as stack:
        if not bare:
            _STATES[id(app)] = await stack.enter_async_context(app.router.lifespan_context(app))
        logging.getLogger("service").setLevel(level)
        for _ in range(count):
            await _call(app, *requests[kind])
        flush_logs()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, count, level, strip = args.child
        with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
            asyncio.run(_answer(kind, int(count), level, tuple(filter(None, strip.split(",")))))
        return
    rows: list[list[object]] = []
    bare: dict[str, int] = {}
    for name, (kind, level, strip) in VARIANTS.items():
        low = _instructions(kind, WARM_UP_REQUESTS, level, strip)
        high = _instructions(kind, WARM_UP_REQUESTS + args.requests, level, strip)
        per_request = (high - low) // args.requests
        if kind.startswith("bare"):
            bare[kind.removeprefix("bare_")] = per_request
        base = bare["post" if kind in ("bare_post", "resolve") else "get"]
        rows.append([name.rstrip(), per_request, f"{per_request / base:.2f}"])
        print(f"{name.rstrip():34} {per_request:>9,} instructions/request", flush=True)
    print()
    print(table(["variant", "instructions / request", "x bare"], rows))


if __name__ == "__main__":
    main()
