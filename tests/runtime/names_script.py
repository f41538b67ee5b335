"""Run a plan on a fresh local Ray with its dashboard and print what Ray shows of its actors.

Usage: ``python names_script.py PLAN``. Prints one JSON object: the state API's rows for
the live actors (class name, Ray name, pid, process title) and the log prefix tokens Ray
recorded for each actor's worker. A separate process because the state API needs the
dashboard, which the test session's shared cluster runs without.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import ray
from ray.util.state import get_log, list_actors
from ray.util.state.exception import RayStateApiException, ServerUnavailable

import cgc
from cgc.plan_schema.values import decode_value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive_actors(api: str, deadline: float) -> list:
    while True:  # the dashboard comes up a little after ray.init returns
        try:
            return list_actors(address=api, filters=[("state", "=", "ALIVE")], detail=True)
        except (ServerUnavailable, RayStateApiException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def main(path: str) -> None:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # Other Ray clusters may run on this machine: name this one's dashboard, never "auto".
    ctx = ray.init(num_cpus=8, include_dashboard=True, dashboard_port=_free_port(),
                   configure_logging=False, log_to_driver=False)
    api = ctx.address_info["gcs_address"]
    plan = cgc.load(path)
    deadline = time.monotonic() + 120
    with plan.start() as graph:
        args = [decode_value(v) for v in plan.proto.example_args]
        graph.execute(*args).get(timeout=120)  # every actor is up and has run
        rows = []
        for a in _alive_actors(api, deadline):
            log = "".join(get_log(address=api, actor_id=a.actor_id, tail=-1))
            prefix = [ln for ln in log.splitlines() if ln.startswith(":actor_name:")]
            rows.append({"class_name": a.class_name, "name": a.name, "pid": a.pid,
                         "title": _title(a.pid), "log_prefix": prefix})
    print(json.dumps(sorted(rows, key=lambda r: r["name"])))
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
