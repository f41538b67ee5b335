"""Two graphs start at once in a fresh process (two threads); then ``ray.shutdown()``.

    python two_graphs_script.py GCS_ADDRESS

Prints one JSON object: the graphs still live after ``ray.shutdown()`` (0: it tore both
down). Warnings go to stderr, where the test looks for a false one.
"""

from __future__ import annotations

import json
import sys
import threading

import ray

import cgc
from cgc import InputNode


@cgc.actor(num_cpus=0)
class Echo:
    def f(self, x: int) -> int:
        return x


def main() -> None:
    ray.init(address=sys.argv[1], log_to_driver=False)
    graphs: list = []
    errors: list = []

    def start(name: str) -> None:
        try:
            with InputNode() as inp:
                plan = cgc.compile(Echo.bind().f.bind(inp), name=name)
            g = plan.start()
            assert g.execute(3).get(timeout=60) == 3
            graphs.append(g)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=start, args=(f"g{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ray.shutdown()
    print(json.dumps({"errors": errors, "started": len(graphs),
                      "live_after_shutdown": sum(not g.closing for g in graphs)}))


if __name__ == "__main__":
    main()
