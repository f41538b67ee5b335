"""Echo latency idle vs with one CPU-bound process beside it: cgc and Ray Compiled Graph.

The issue-15 target: on the 2-core machine, cgc's echo (one actor, a small int) with one
busy process running beside it stays within 2x its idle p50. The busy process is a plain
Python spin loop in a subprocess, started before and killed after each busy cell. Same
process and Ray cluster for everything, one system alive at a time (Ray CG's busy-polling
readers would otherwise steal the CPU from cgc), alternating the order per round; the
table shows the median p50/p99 over rounds and busy/idle ratios per system.

    python tools/bench/bench_busy.py                     # 3 rounds, markdown table
    python tools/bench/bench_busy.py --rounds 1 --iters 500 --systems cgc
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_runtime import CASES, run_cgc, run_ray_cgraph  # noqa: E402


def cgc_with_spin(spin_us: float) -> Callable[[Any, int], tuple[float, float, float]]:
    """A cgc runner with the plan's ``spin_us`` overridden (0: every channel wait sleeps on
    its futex at once; the adaptive spin grows from this floor otherwise).

    Example: ``SYSTEMS["cgc_spin0"] = cgc_with_spin(0)``.
    """
    return functools.partial(run_cgc, spin_us=spin_us)


SYSTEMS: dict[str, Callable] = {"ray_cgraph": run_ray_cgraph, "cgc": run_cgc,
                                "cgc_spin0": cgc_with_spin(0), "cgc_spin200": cgc_with_spin(200)}
LABEL = {"ray_cgraph": "Ray CG", "cgc": "cgc", "cgc_spin0": "cgc, spin_us=0",
         "cgc_spin200": "cgc, spin_us=200"}

# Why a bare interpreter loop: it is the plainest CPU-bound neighbour (no syscalls, never
# sleeps), the case a futex wake-up has to compete with for a core.
_SPIN = "while True:\n    pass\n"


@contextmanager
def busy_process(n: int = 1) -> Iterator[list[int]]:
    """Run ``n`` CPU-bound spin processes for the duration of the block; yield their pids.

    Example::

        with busy_process() as pids:
            ...  # measure with one core taken by a spinning Python process
    """
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(n)]
    try:
        time.sleep(0.5)  # let the scheduler see it as a CPU hog before measuring
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> int:
    """Measure and print the idle / busy table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--busy", type=int, default=1, help="spin processes beside the graph")
    parser.add_argument("--systems", default="ray_cgraph,cgc")
    args = parser.parse_args()

    case = next(c for c in CASES if c.name == "echo, int")
    systems = [s for s in args.systems.split(",") if s]
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    res: dict[tuple[str, str], tuple[list[float], list[float]]] = {
        (s, cond): ([], []) for s in systems for cond in ("idle", "busy")}
    for rnd in range(args.rounds):
        order = systems if rnd % 2 == 0 else systems[::-1]
        for system in order:
            for cond in ("idle", "busy"):
                gc.collect()
                if cond == "busy":
                    with busy_process(args.busy):
                        p50, p99, _ = SYSTEMS[system](case, args.iters)
                else:
                    p50, p99, _ = SYSTEMS[system](case, args.iters)
                res[system, cond][0].append(p50)
                res[system, cond][1].append(p99)
                print(f"  {system:10s} {cond} round {rnd}: p50 {p50:8.1f} us  p99 {p99:9.1f} us"
                      f"  (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    ray.shutdown()
    med = statistics.median
    print(f"| system | idle p50 / p99 | {args.busy} busy process p50 / p99 | busy ÷ idle "
          "(p50 / p99) |")
    print("|---|---|---|---|")
    for s in systems:
        i50, i99 = med(res[s, "idle"][0]), med(res[s, "idle"][1])
        b50, b99 = med(res[s, "busy"][0]), med(res[s, "busy"][1])
        print(f"| {LABEL[s]} | {i50:,.0f} / {i99:,.0f} µs | {b50:,.0f} / {b99:,.0f} µs | "
              f"{b50 / i50:.2f}× / {b99 / i99:.2f}× |")
    return 0


if __name__ == "__main__":
    import ray_leftovers  # Ray CG's named semaphores of our Ray go at exit

    ray_leftovers.install()
    sys.exit(main())
