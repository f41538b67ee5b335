"""Run a plan on a fresh local Ray with its dashboard and print what Ray shows of its actors.

Usage: ``python names_script.py PLAN``. Prints, as the last line, one JSON list: for each
live actor the state API's class name and Ray name, its process title, and the prefix
Ray's log forwarding put before a line the actor printed. A separate process because the
state API needs the dashboard, which the test session's shared cluster runs without.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

os.environ["RAY_DEDUP_LOGS"] = "0"  # one forwarded line per actor, never merged

import ray  # noqa: E402
from ray.util.state import list_actors  # noqa: E402
from ray.util.state.exception import RayStateApiException, ServerUnavailable  # noqa: E402

import cgc  # noqa: E402
from cgc.plan_schema.values import decode_value  # noqa: E402

MARK = "cgc-names-marker"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class _Tee(io.TextIOBase):
    """Stdout that also keeps what Ray's log forwarding writes to it."""

    def __init__(self, inner: io.TextIOBase) -> None:
        self.inner, self.seen = inner, []

    def write(self, s: str) -> int:
        self.seen.append(s)
        return self.inner.write(s)

    def flush(self) -> None:
        self.inner.flush()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(api: str, deadline: float) -> list:
    while True:  # the dashboard comes up a little after ray.init returns
        try:
            return list_actors(address=api, filters=[("state", "=", "ALIVE")], detail=True)
        except (ServerUnavailable, RayStateApiException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _prefixes(tee: _Tee, pids: set[int], deadline: float) -> dict[int, str]:
    """pid -> the "(Class pid=N)" prefix of its marker line, waiting for every pid."""
    found: dict[int, str] = {}
    while set(found) != pids and time.monotonic() < deadline:
        for line in _ANSI.sub("", "".join(tee.seen)).splitlines():
            m = re.match(r"\((.+?) pid=(\d+)(?:, ip=[^)]*)?\) " + MARK, line)
            if m:
                found[int(m.group(2))] = m.group(0)[: -len(MARK) - 1]
        time.sleep(0.2)
    return found


def _title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def main(path: str) -> None:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    # Other Ray clusters may run on this machine: a new one, its own dashboard port.
    ctx = ray.init(address="local", num_cpus=8, include_dashboard=True,
                   dashboard_port=_free_port(), configure_logging=False, log_to_driver=True)
    api = ctx.address_info["gcs_address"]
    plan = cgc.load(path)
    deadline = time.monotonic() + 120
    with plan.start() as graph:
        args = [decode_value(v) for v in plan.proto.example_args]
        graph.execute(*args).get(timeout=120)  # every actor is up and has run
        ray.get([h.__ray_call__.remote(lambda self: print(MARK, flush=True))
                 for h in graph.actors.values()], timeout=120)
        alive = _alive(api, deadline)
        prefix = _prefixes(tee, {a.pid for a in alive}, deadline)
        rows = [{"class_name": a.class_name, "name": a.name, "pid": a.pid,
                 "title": _title(a.pid), "log_prefix": prefix.get(a.pid, "")} for a in alive]
    sys.stdout = tee.inner
    print(json.dumps(sorted(rows, key=lambda r: r["name"])))
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
