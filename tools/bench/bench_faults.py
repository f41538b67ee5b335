"""Repeated actor kills: SIGKILL one actor of a 3-actor chain at a random position while an
execution is pending, many times; count hangs, time to the typed error, and leftovers.

Each round starts the chain, runs one execution, keeps one pending (the first stage sleeps
far longer than the get timeout), kills a random stage, and measures how long the pending
``get()`` takes to raise ``ActorDiedError``; then tears down and checks that no segment,
thread or actor process is left. A round that ends in anything but ActorDiedError counts
as a hang. Not a test: a tool whose figures go into BENCHMARKS.md.

    python tools/bench/bench_faults.py --kills 50
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import threading
import time

import ray

import cgc
from cgc import InputNode
from cgc.runtime import ActorDiedError
from cgc.runtime.channels import list_segments


@ray.remote(num_cpus=0)
class Stage:
    def step(self, x):
        if isinstance(x, float):
            time.sleep(x)
        return x

    def pid(self):
        return os.getpid()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] not in "ZX"
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    ray.init(include_dashboard=False, log_to_driver=False)
    times, hangs, leftovers = [], 0, 0
    threads_before = {t.name for t in threading.enumerate()}
    for k in range(args.kills):
        s = [Stage.bind() for _ in range(3)]
        with InputNode() as inp:
            dag = s[2].step.bind(s[1].step.bind(s[0].step.bind(inp)))
        g = cgc.compile(dag, name=f"kill{k}").start(get_timeout=30)
        pids = [ray.get(h.pid.remote()) for h in g.actors.values()]
        assert g.execute(1).get() == 1
        pending = g.execute(120.0)
        pos = rng.randrange(3)
        t0 = time.perf_counter()
        os.kill(pids[pos], signal.SIGKILL)
        took = -1.0
        try:
            pending.get()
            hangs += 1
        except ActorDiedError:
            took = time.perf_counter() - t0
            times.append(took)
        except Exception as exc:  # noqa: BLE001 - a timeout or a wrong error counts as a hang
            print(f"round {k}: {type(exc).__name__}: {exc}")
            hangs += 1
        g.teardown()
        end = time.monotonic() + 20
        while time.monotonic() < end and any(_alive(p) for p in pids):
            time.sleep(0.05)
        threads = {t.name for t in threading.enumerate()} - threads_before
        if list_segments(g.prefix) or any(_alive(p) for p in pids) or \
                any(n.startswith("cgc-") for n in threads):
            leftovers += 1
        print(f"round {k}: killed stage{pos}, error after {took:.3f} s", flush=True)
    ray.shutdown()
    print()
    print("| kills | hangs | rounds with leftovers | time to ActorDiedError p50 / max |")
    print("|---|---|---|---|")
    print(f"| {args.kills} | {hangs} | {leftovers} | {statistics.median(times):.2f} / "
          f"{max(times):.2f} s |")


if __name__ == "__main__":
    main()
