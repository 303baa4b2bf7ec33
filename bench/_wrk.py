"""Drive one endpoint with wrk (Debian's ``wrk`` package) and read its numbers back as JSON.

Why wrk: it is a C load generator on an event loop (one thread keeps 64
connections busy and can send tens of thousands of requests a second), so on
a 2-CPU machine it stays far from being the bottleneck of a Python server
answering a few thousand; a Python client would compete with the server for
the same interpreter-speed budget.  It keeps every connection open
(keep-alive) and sends the next request as soon as the answer arrives
(closed loop): concurrency = connections.  Latency percentiles are wrk's own
histogram, per request, in microseconds.

A small Lua script sets the method, body and headers and prints the summary
as one JSON line from wrk's ``done`` hook.  A body containing `COUNTER` gets
a fresh integer there on every request (1024, 1025, ...), so each request is
distinct (no cache can answer it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

COUNTER = "@COUNTER@"

_SCRIPT = """\
wrk.method = {method}
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json"
{request}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '@@{{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, '
    .. '"socket_errors": %d, "non_2xx": %d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""


@dataclass(frozen=True, slots=True)
class Result:
    """One wrk run: throughput and latency of every request it sent."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    socket_errors: int
    non_2xx: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def require_wrk() -> str:
    """The wrk executable, or an error saying how to get it."""
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk (Debian's package)")
    return path


# With a COUNTER in the body: a new request each time, the counter spliced in.
_COUNTING_REQUEST = """\
local head, tail = {head}, {tail}
local n = 1023
request = function()
  n = n + 1
  return wrk.format(nil, nil, nil, head .. n .. tail)
end
"""


def _lua_string(text: str) -> str:
    return "[==[" + text + "]==]"  # a long bracket: no escaping of the JSON body


def _request_function(body: str | None) -> str:
    if body is None or COUNTER not in body:
        return ""
    head, tail = body.split(COUNTER, 1)
    return _COUNTING_REQUEST.format(head=_lua_string(head), tail=_lua_string(tail))


def run_wrk(
    url: str, *, connections: int, seconds: float, body: str | None = None, timeout_s: int = 10
) -> Result:
    """Load `url` from `connections` keep-alive connections for `seconds`: POST `body` if given."""
    script = _SCRIPT.format(
        method=_lua_string("POST" if body is not None else "GET"),
        body=_lua_string(body) if body is not None else "nil",
        request=_request_function(body),
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "load.lua"
        path.write_text(script)
        command = [
            require_wrk(),
            "-t1",  # one thread: ample for a few thousand requests/s, leaves a CPU
            f"-c{connections}",
            f"-d{seconds:g}s",
            f"--timeout={timeout_s}s",
            "-s",
            str(path),
            url,
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=seconds + 60
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("@@")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    data = json.loads(lines[-1][2:])
    return Result(
        requests=data["requests"],
        seconds=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1e3,
        p99_ms=data["p99_us"] / 1e3,
        socket_errors=data["socket_errors"],
        non_2xx=data["non_2xx"],
    )
