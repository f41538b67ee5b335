"""Ctrl-C in a user's Python program while ``plan.start()`` or ``ref.get()`` waits.

    python interrupt_script.py start|get GCS_ADDRESS

Sends itself SIGINT 1.5 s into the wait and prints one JSON object: the exception type
that came out, seconds from the signal to it, the graphs still live, the graph's actors
still alive and its shared-memory segments left (after the ``with`` block's teardown).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import ray

import cgc
from cgc import InputNode
from cgc.runtime.channels import list_segments
from cgc.runtime.driver.graph import live_graphs


@cgc.actor(num_cpus=0)
class Slow:
    def __init__(self, start_s: float) -> None:
        time.sleep(start_s)

    def work(self, x: float) -> float:
        time.sleep(x)
        return x


def main() -> None:
    mode, address = sys.argv[1], sys.argv[2]
    ray.init(address=address, log_to_driver=False)
    slow = Slow.bind(30.0 if mode == "start" else 0.0)
    with InputNode() as inp:
        plan = cgc.compile(slow.work.bind(inp), name=f"interrupt_{mode}")
    sent: list[float] = []

    def interrupt() -> None:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    graph = None
    came = "nothing"
    try:
        if mode == "start":
            threading.Timer(1.5, interrupt).start()
            graph = plan.start(teardown_timeout=1)
        else:
            with plan.start(teardown_timeout=1) as graph:
                ref = graph.execute(30.0)
                threading.Timer(1.5, interrupt).start()
                ref.get(timeout=60)
    except BaseException as exc:  # noqa: BLE001 - the point: which type comes out
        came = type(exc).__name__
    after = time.monotonic() - sent[0] if sent else -1.0
    from ray._private import state

    alive = [a["Name"] for a in state.actors().values()
             if a["State"] != "DEAD" and a["Name"].startswith(f"interrupt_{mode}.")]
    prefix = graph.prefix if graph is not None else ""
    print(json.dumps({"came": came, "after_s": round(after, 2), "live_graphs": len(live_graphs()),
                      "alive": alive, "segments": list_segments(prefix) if prefix else []}))


if __name__ == "__main__":
    main()
