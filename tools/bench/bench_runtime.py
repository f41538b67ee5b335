"""Side-by-side latency and throughput: cgc vs Ray Compiled Graph vs classic Ray actor calls.

Runs every graph on every system in one process and one Ray cluster, one system at a time
(each torn down before the next starts, so Ray CG's busy-polling readers do not steal the
CPU from the others), for `--rounds` alternating rounds, and reports the median p50/p99
over rounds plus the cgc/Ray-CG ratio. Absolute times drift on shared machines: read the
ratios.

    python tools/bench/bench_runtime.py                # all graphs, markdown table
    python tools/bench/bench_runtime.py --quick        # fewer iterations (smoke test)
    python tools/bench/bench_runtime.py --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from ray.dag import InputNode


@ray.remote(num_cpus=0)
class Echo:
    def echo(self, x):
        return x


@ray.remote(num_cpus=0)
class Stage:
    def step(self, x):
        return x


@ray.remote(num_cpus=0)
class Gather:
    def gather(self, *xs):
        return xs[0]


def _echo_dag(bind: Callable[[type], Any]):
    a = bind(Echo)
    with InputNode() as inp:
        return a.echo.bind(inp)


def _chain_dag(bind: Callable[[type], Any]):
    a, b, c = bind(Stage), bind(Stage), bind(Stage)
    with InputNode() as inp:
        return c.step.bind(b.step.bind(a.step.bind(inp)))


def _pass2_dag(bind: Callable[[type], Any]):
    a, b = bind(Stage), bind(Stage)
    with InputNode() as inp:
        return b.step.bind(a.step.bind(inp))


def _fanout_dag(bind: Callable[[type], Any]):
    workers = [bind(Stage) for _ in range(3)]
    g = bind(Gather)
    with InputNode() as inp:
        return g.gather.bind(*[w.step.bind(inp) for w in workers])


@dataclass
class Case:
    name: str
    build: Callable[[Callable[[type], Any]], Any]
    make_input: Callable[[], Any]
    iters: int
    pipelined: int = 0  # >0: throughput with this many executions in flight
    idle: bool = False  # measure the CPU an idle started graph burns instead


CASES = [
    Case("echo, int", _echo_dag, lambda: 1, 2000),
    Case("echo, 1 KiB bytes", _echo_dag, lambda: b"x" * 1024, 2000),
    Case("echo, 1 MiB numpy", _echo_dag, lambda: np.ones(1 << 18, np.float32), 500),
    Case("echo, 16 MiB numpy", _echo_dag, lambda: np.ones(1 << 22, np.float32), 100),
    Case("16 MiB numpy through 2 actors (pass-through)", _pass2_dag,
         lambda: np.ones(1 << 22, np.float32), 100),
    Case("chain of 3 actors", _chain_dag, lambda: 1, 2000),
    Case("fan-out to 3 + gather", _fanout_dag, lambda: 1, 2000),
    Case("chain, pipelined (4 in flight)", _chain_dag, lambda: 1, 2000, pipelined=4),
    Case("idle chain: CPU per actor", _chain_dag, lambda: 1, 1, idle=True),
]


@dataclass
class Result:
    p50_us: list[float] = field(default_factory=list)
    p99_us: list[float] = field(default_factory=list)
    per_s: list[float] = field(default_factory=list)


def _percentiles(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return s[len(s) // 2] * 1e6, s[min(len(s) - 1, int(len(s) * 0.99))] * 1e6


def _time_loop(run_one: Callable[[], Any], iters: int, warmup: int) -> tuple[float, float]:
    for _ in range(warmup):
        run_one()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run_one()
        samples.append(time.perf_counter() - t0)
    return _percentiles(samples)


def _throughput(
    submit: Callable[[], Any], get: Callable[[Any], Any], iters: int, depth: int
) -> float:
    pending: list[Any] = []
    for _ in range(min(depth, iters)):  # warm
        pending.append(submit())
    for ref in pending:
        get(ref)
    pending.clear()
    t0 = time.perf_counter()
    done = 0
    while done < iters:
        while len(pending) < depth and done + len(pending) < iters:
            pending.append(submit())
        get(pending.pop(0))
        done += 1
    return iters / (time.perf_counter() - t0)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (no psutil needed)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu_percent(handles: list[Any], seconds: float = 2.0) -> float:
    """Mean CPU use of the actors' processes, in % of one core, while the graph is idle."""
    pids = ray.get([h.__ray_call__.remote(lambda self: os.getpid()) for h in handles])
    time.sleep(0.5)  # let the last execution's spinning and bookkeeping settle
    before = [_cpu_seconds(p) for p in pids]
    time.sleep(seconds)
    used = [_cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
    return 100.0 * sum(used) / seconds / len(pids)


def run_classic(case: Case, iters: int) -> tuple[float, float, float]:
    if case.idle:
        return float("nan"), 0.0, 0.0  # classic actors have no compiled loop to idle
    handles: list[Any] = []

    def bind(cls):
        h = cls.remote()
        handles.append(h)
        return h

    # Classic calls: the same graph as nested .remote() calls, one round trip per execution.
    x = case.make_input()
    if case.build is _echo_dag:
        a = bind(Echo)
        call = lambda: a.echo.remote(x)  # noqa: E731
    elif case.build is _pass2_dag:
        a, b = bind(Stage), bind(Stage)
        call = lambda: b.step.remote(a.step.remote(x))  # noqa: E731
    elif case.build is _chain_dag:
        a, b, c = bind(Stage), bind(Stage), bind(Stage)
        call = lambda: c.step.remote(b.step.remote(a.step.remote(x)))  # noqa: E731
    else:
        ws, g = [bind(Stage) for _ in range(3)], bind(Gather)
        call = lambda: g.gather.remote(*[w.step.remote(x) for w in ws])  # noqa: E731
    try:
        if case.pipelined:
            return 0.0, 0.0, _throughput(call, ray.get, iters, case.pipelined)
        p50, p99 = _time_loop(lambda: ray.get(call()), iters, 20)
        return p50, p99, 0.0
    finally:
        for h in handles:
            ray.kill(h)


def run_ray_cgraph(case: Case, iters: int) -> tuple[float, float, float]:
    handles: list[Any] = []

    def bind(cls):
        h = cls.remote()
        handles.append(h)
        return h

    dag = case.build(bind)
    compiled = dag.experimental_compile(_max_inflight_executions=max(10, case.pipelined))
    x = case.make_input()
    try:
        if case.idle:
            ray.get(compiled.execute(x))
            return idle_cpu_percent(handles), 0.0, 0.0
        if case.pipelined:
            return (
                0.0,
                0.0,
                _throughput(lambda: compiled.execute(x), ray.get, iters, case.pipelined),
            )
        p50, p99 = _time_loop(lambda: ray.get(compiled.execute(x), timeout=120), iters, 50)
        return p50, p99, 0.0
    finally:
        # Why a thread with a bound: Ray CG's teardown can hang after a large value passed
        # through an actor-to-actor channel (shared/ANCHORS.md); the actors are killed next.
        t = threading.Thread(target=compiled.teardown, daemon=True)
        t.start()
        t.join(timeout=20)
        for h in handles:
            ray.kill(h)


def run_cgc(case: Case, iters: int, **start_kw: Any) -> tuple[float, float, float]:
    """cgc on ``case``; ``start_kw`` goes to ``plan.start`` (e.g. ``spin_us=0``)."""
    import cgc

    dag = case.build(lambda cls: cls.bind())  # lazy actors: cgc creates them
    plan = cgc.compile(dag)
    x = case.make_input()
    with plan.start(**start_kw) as graph:
        if case.idle:
            graph.execute(x).get()
            return idle_cpu_percent(list(graph.actors.values())), 0.0, 0.0
        if case.pipelined:
            return (
                0.0,
                0.0,
                _throughput(lambda: graph.execute(x), lambda r: r.get(), iters, case.pipelined),
            )
        p50, p99 = _time_loop(lambda: graph.execute(x).get(), iters, 50)
        return p50, p99, 0.0


SYSTEMS = {"classic": run_classic, "ray_cgraph": run_ray_cgraph, "cgc": run_cgc}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the iterations")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per case")
    parser.add_argument("--cases", default="", help="comma-separated substrings of case names")
    parser.add_argument("--systems", default="classic,ray_cgraph,cgc")
    parser.add_argument("--json", dest="json_out", help="write raw results here")
    args = parser.parse_args()

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    systems = [s for s in args.systems.split(",") if s]
    cases = [c for c in CASES if not args.cases or any(k in c.name for k in args.cases.split(","))]
    results: dict[str, dict[str, Result]] = {c.name: {s: Result() for s in systems} for c in cases}
    for case in cases:
        iters = max(20, case.iters // 10) if args.quick else case.iters
        for rnd in range(args.rounds):
            order = systems if rnd % 2 == 0 else systems[::-1]  # alternate who goes first
            for system in order:
                gc.collect()
                p50, p99, per_s = SYSTEMS[system](case, iters)
                r = results[case.name][system]
                r.p50_us.append(p50)
                r.p99_us.append(p99)
                r.per_s.append(per_s)
                print(
                    f"  {case.name:32s} {system:10s} round {rnd}: p50 {p50:8.1f} us  p99 "
                    f"{p99:8.1f} us  {per_s:8.0f}/s",
                    file=sys.stderr,
                    flush=True,
                )
    ray.shutdown()
    print(_table(results, systems))
    if args.json_out:
        raw = {c: {s: vars(r) for s, r in per.items()} for c, per in results.items()}
        with open(args.json_out, "w") as f:
            json.dump({"machine": platform.node(), "results": raw}, f, indent=2)
    return 0


def _table(results: dict[str, dict[str, Result]], systems: list[str]) -> str:
    med = statistics.median
    head = "| graph | " + " | ".join(f"{s} p50 / p99" for s in systems) + " | cgc ÷ Ray CG |"
    lines = [head, "|" + "---|" * (len(systems) + 2)]
    idle_cases = {c.name for c in CASES if c.idle}
    for case, per in results.items():
        if case in idle_cases:
            cells = [f"{med(per[s].p50_us):.1f}% of a core" for s in systems]
            lines.append(f"| {case} | " + " | ".join(cells).replace("nan% of a core", "—") + " | |")
            continue
        pipelined = any(med(r.per_s) > 0 for r in per.values())
        cells = []
        for s in systems:
            r = per[s]
            cells.append(
                f"{med(r.per_s):,.0f}/s"
                if pipelined
                else f"{med(r.p50_us):,.0f} / {med(r.p99_us):,.0f} µs"
            )
        ratio = ""
        if "cgc" in per and "ray_cgraph" in per:
            a, b = per["cgc"], per["ray_cgraph"]
            if pipelined and med(b.per_s):
                ratio = f"{med(a.per_s) / med(b.per_s):.2f}× throughput"
            elif med(b.p50_us):
                ratio = f"{med(a.p50_us) / med(b.p50_us):.2f}× p50"
        lines.append(f"| {case} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import ray_leftovers  # Ray CG's named semaphores of our Ray go at exit

    ray_leftovers.install()
    sys.exit(main())
