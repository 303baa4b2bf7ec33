"""Network guard for a test's service process: any attempt to leave loopback fails and is logged.

Put this directory first on ``PYTHONPATH`` and name a log file in
``NETGUARD_LOG``: every Python process started that way - the service, its
multiprocessing forkserver and the dry-run workers forked from it - installs
an audit hook (PEP 578) that refuses ``connect`` / ``sendto`` to a
non-loopback address and any name lookup other than ``localhost``, with
`PermissionError`, and appends one JSON line per attempt to the log.  A test
then proves "nothing was attempted" by the log staying empty.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from typing import Any

_LOG = os.environ.get("NETGUARD_LOG")
_INET = (socket.AF_INET, socket.AF_INET6)
_LOOKUPS = frozenset(
    {
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyname_ex",
        "socket.gethostbyaddr",
        "socket.getnameinfo",
    }
)


def _is_loopback(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False  # a name: looking it up already leaves the machine


def _refuse(event: str, target: Any) -> None:
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps({"pid": os.getpid(), "event": event, "target": repr(target)}))
            log.write("\n")
    raise PermissionError(f"netguard: {event} to {target!r} refused (loopback only)")


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        sock, address = args[0], args[1]
        if sock.family in _INET and not _is_loopback(address[0]):
            _refuse(event, address)
    elif event in _LOOKUPS:
        host = args[0]
        if event == "socket.getnameinfo":
            host = host[0] if isinstance(host, tuple) else host
        if host is not None and not _is_loopback(host):
            _refuse(event, host)


if _LOG:
    sys.addaudithook(_hook)
    # Which processes are guarded (a fork inherits the hook without running this again).
    with open(f"{os.path.splitext(_LOG)[0]}.processes", "a", encoding="utf-8") as loaded:
        loaded.write(f"{os.getpid()}\n")
