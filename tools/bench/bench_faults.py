"""Repeated actor kills: SIGKILL one actor of a 3-actor chain at a random position while an
execution is pending, many times; count hangs, time to the typed error, and leftovers.

Each round starts the chain, runs one execution, keeps one pending (the first stage sleeps
far longer than the get timeout), kills a random stage, and measures how long the pending
``get()`` takes to raise ``ActorDiedError``; then tears down and checks that no segment,
thread or actor process is left. A round that ends in anything but ActorDiedError counts
as a hang. Not a test: a tool whose figures go into BENCHMARKS.md.

Then (``--driver-kills``) the driver itself: a child process starts the chain, sends a
16 MiB value through it (so data blocks exist besides the rings), leaves one result unread
and one execution running, and kills itself with SIGKILL; this process measures how long
until no segment of that graph is left in /dev/shm (no later start, no sweep here: the dead
driver's janitor does it) and until its actors are gone.

    python tools/bench/bench_faults.py --kills 50 --driver-kills 10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import ray

import cgc
from cgc import InputNode
from cgc.runtime import ActorDiedError
from cgc.runtime.channels import list_segments
from cgc.runtime.channels.procs import start_time


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
        return start_time(pid) is not None
    except OSError:  # /proc hides it
        return False


def _chain(name: str):
    s = [Stage.bind() for _ in range(3)]
    with InputNode() as inp:
        dag = s[2].step.bind(s[1].step.bind(s[0].step.bind(inp)))
    return cgc.compile(dag, name=name)


def _doomed_driver(address: str) -> None:
    """The child of a driver-kill round: start, leave work behind, report, SIGKILL itself."""
    ray.init(address=address, log_to_driver=False)
    g = _chain("driver_kill").start(address=address, get_timeout=30)
    big = np.ones(1 << 21)
    assert float(g.execute(big).get().sum()) == float(1 << 21)
    held, pending = g.execute(big), g.execute(120.0)  # unread, and still running
    pids = [ray.get(h.pid.remote()) for h in g.actors.values()]
    print(json.dumps({"prefix": g.prefix, "pids": pids,
                      "segments": len(list_segments(g.prefix))}), flush=True)
    del held, pending
    os.kill(os.getpid(), signal.SIGKILL)


def driver_kills(n: int, address: str) -> list[str]:
    """``n`` driver-kill rounds; returns the table rows."""
    gone, actors_gone, left = [], [], 0
    for k in range(n):
        child = subprocess.Popen([sys.executable, __file__, "--as-driver", address],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        info = json.loads(child.stdout.readline())
        child.wait()
        t0 = time.perf_counter()
        t_seg = t_act = None
        while time.perf_counter() - t0 < 60 and (t_seg is None or t_act is None):
            if t_seg is None and not list_segments(info["prefix"]):
                t_seg = time.perf_counter() - t0
            if t_act is None and not any(_alive(p) for p in info["pids"]):
                t_act = time.perf_counter() - t0
            time.sleep(0.01)
        if t_seg is None:
            left += 1
        else:
            gone.append(t_seg)
        actors_gone.append(t_act if t_act is not None else float("inf"))
        print(f"driver round {k}: {info['segments']} segments; gone after "
              f"{t_seg if t_seg is not None else -1:.3f} s, actors after {t_act if t_act is not None else -1:.3f} s",
              flush=True)
    rows = ["| driver kills | rounds with segments left after 60 s | segments gone after "
            "p50 / max | actors gone after p50 / max |", "|---|---|---|---|"]
    if gone:
        rows.append(f"| {n} | {left} | {statistics.median(gone):.2f} / {max(gone):.2f} s | "
                    f"{statistics.median(actors_gone):.2f} / {max(actors_gone):.2f} s |")
    else:
        rows.append(f"| {n} | {left} | - | - |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--driver-kills", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--as-driver", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.as_driver:
        _doomed_driver(args.as_driver)
        return
    rng = random.Random(args.seed)
    ray.init(include_dashboard=False, log_to_driver=False)
    times, hangs, leftovers = [], 0, 0
    threads_before = {t.name for t in threading.enumerate()}
    for k in range(args.kills):
        g = _chain(f"kill{k}").start(get_timeout=30)
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
    rows = driver_kills(args.driver_kills, ray.get_runtime_context().gcs_address) \
        if args.driver_kills else []
    ray.shutdown()
    print()
    print("| kills | hangs | rounds with leftovers | time to ActorDiedError p50 / max |")
    print("|---|---|---|---|")
    if times:
        print(f"| {args.kills} | {hangs} | {leftovers} | {statistics.median(times):.2f} / "
              f"{max(times):.2f} s |")
    else:
        print(f"| {args.kills} | {hangs} | {leftovers} | - |")
    if rows:
        print()
        print("\n".join(rows))


if __name__ == "__main__":
    main()
