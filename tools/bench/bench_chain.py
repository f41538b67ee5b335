"""Chain scaling, side by side with the floor: raw processes, Ray Compiled Graph and cgc.

For each chain length N (``--actors``), in one run and one Ray cluster, one system alive at
a time (each torn down before the next starts):

- ``raw``: N plain processes passing a counter through shared memory + futex, no Ray and
  no cgc (``raw_chain.py``): the floor for N + 1 hops;
- ``ray_cgraph``: a chain of N Ray actors, ``dag.experimental_compile()``;
- ``cgc``: the same chain compiled and run by cgc.

A chain of 1 is always measured first: for ``raw`` that is the two-process shared-memory +
futex ping-pong, for the others an echo through one actor. Each cell is the mean and p50
per execution (a small int through the chain, one execution in flight), from at most
``--iters`` executions or ``--seconds`` of them, whichever ends first. A row is printed as
soon as it is measured (a markdown table on stdout), so a run cut short still reports; a
system that fails on a row says so in its cell and the run goes on; rows left when
``--budget-s`` runs out are reported as skipped.

    python tools/bench/bench_chain.py --actors 8,16 --quick
    python tools/bench/bench_chain.py --actors 8,16,32,64,128     # the GPU host (16 cores)
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))
from raw_chain import RawChain  # noqa: E402


@ray.remote(num_cpus=0)
class Stage:
    def step(self, x):
        return x + 1


# {"mean_us", "p50_us", "n", "setup_s"}, {"error": str} or {"skipped": True}
Cell = dict[str, Any]


def _stats(samples: list[float], setup_s: float) -> Cell:
    return {"mean_us": statistics.mean(samples) * 1e6,
            "p50_us": statistics.median(samples) * 1e6, "n": len(samples), "setup_s": setup_s}


def _timed(run_one: Callable[[], Any], iters: int, seconds: float, warmup: int) -> list[float]:
    for _ in range(warmup):
        run_one()
    out: list[float] = []
    end = time.perf_counter() + seconds
    for _ in range(iters):
        t0 = time.perf_counter()
        run_one()
        t1 = time.perf_counter()
        out.append(t1 - t0)
        if t1 > end:
            break
    return out


def run_raw(n: int, args: argparse.Namespace) -> Cell:
    t0 = time.perf_counter()
    chain = RawChain(n, spin_us=args.raw_spin_us)
    setup = time.perf_counter() - t0
    try:
        return _stats(chain.run(args.iters, args.seconds, warmup=args.warmup), setup)
    finally:
        chain.close()


def _kill_all(handles: list[Any]) -> None:
    for h in handles:
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


def _ready(handles: list[Any]) -> None:
    """Wait until every actor is up, so the set-up figures hold compile/start only."""
    ray.get([h.__ray_call__.remote(lambda self: None) for h in handles], timeout=600)


def _chain(handles: list[Any]) -> Any:
    from ray.dag import InputNode

    with InputNode() as inp:
        x = inp
        for h in handles:
            x = h.step.bind(x)
    return x


def run_ray_cgraph(n: int, args: argparse.Namespace) -> Cell:
    handles = [Stage.remote() for _ in range(n)]
    try:
        _ready(handles)
        t0 = time.perf_counter()
        compiled = _chain(handles).experimental_compile()
        setup = time.perf_counter() - t0
        try:
            def once() -> None:
                assert ray.get(compiled.execute(1), timeout=args.get_timeout) == n + 1

            return _stats(_timed(once, args.iters, args.seconds, args.warmup), setup)
        finally:
            # Why a thread: Ray CG's teardown can hang (see shared/ANCHORS.md); its actors
            # are killed next either way.
            t = threading.Thread(target=compiled.teardown, daemon=True)
            t.start()
            t.join(timeout=30)
    finally:
        _kill_all(handles)


def run_cgc(n: int, args: argparse.Namespace, wake_ahead: int | None = None) -> Cell:
    import cgc

    handles = [Stage.remote() for _ in range(n)]
    try:
        _ready(handles)
        t0 = time.perf_counter()
        plan = cgc.compile(_chain(handles), name=f"bench_chain_{n}")
        t1 = time.perf_counter()
        with plan.start(get_timeout=args.get_timeout, wake_ahead=wake_ahead) as graph:
            setup = time.perf_counter() - t0

            def once() -> None:
                assert graph.execute(1).get() == n + 1

            cell = _stats(_timed(once, args.iters, args.seconds, args.warmup), setup)
            cell["compile_s"] = t1 - t0
            return cell
    finally:
        _kill_all(handles)


def run_cgc_no_wake(n: int, args: argparse.Namespace) -> Cell:
    """cgc with wake-ahead off (``wake_ahead=0``): what the doorbells buy."""
    return run_cgc(n, args, wake_ahead=0)


SYSTEMS: dict[str, Callable[[int, argparse.Namespace], Cell]] = {
    "raw": run_raw, "ray_cgraph": run_ray_cgraph, "cgc": run_cgc,
    "cgc_no_wake": run_cgc_no_wake}


def _system(name: str) -> Callable[[int, argparse.Namespace], Cell]:
    """A runner by name; ``cgc_k<K>`` is cgc with a wake-ahead window of K depths."""
    if name in SYSTEMS:
        return SYSTEMS[name]
    if name.startswith("cgc_k") and name[5:].isdigit():
        return lambda n, args: run_cgc(n, args, wake_ahead=int(name[5:]))
    raise SystemExit(f"unknown system {name!r}: use raw, ray_cgraph, cgc, cgc_no_wake, cgc_k<K>")


def _cell(c: Cell | None) -> str:
    if c is None:
        return "—"
    if "skipped" in c:
        return "skipped (time budget)"
    if "error" in c:
        return f"failed: {c['error']}"
    return f"{c['mean_us']:,.0f} / {c['p50_us']:,.0f} µs"


def _ratio(a: Cell | None, b: Cell | None) -> str:
    if not a or not b or "mean_us" not in a or "mean_us" not in b:
        return "—"
    return f"{a['mean_us'] / b['mean_us']:.2f}× / {a['p50_us'] / b['p50_us']:.2f}×"


def _setup(c: Cell | None) -> str:
    return f"{c['setup_s']:.2f} s" if c and "setup_s" in c else "—"


def _row(n: int, cells: dict[str, Cell | None], extra: bool) -> str:
    raw, rcg, ours = cells.get("raw"), cells.get("ray_cgraph"), cells.get("cgc")
    name = "1 (echo; raw: ping-pong)" if n == 1 else str(n)
    more = f" {_cell(cells.get('cgc_no_wake'))} |" if extra else ""
    return (f"| {name} | {_cell(raw)} | {_cell(rcg)} | {_cell(ours)} |{more} "
            f"{_ratio(ours, rcg)} | {_ratio(ours, raw)} | {_setup(rcg)} | {_setup(ours)} |")


def _header(extra: bool) -> str:
    more = " cgc, wake-ahead off |" if extra else ""
    cols = 9 if extra else 8
    return ("| actors | raw shm+futex mean / p50 | Ray CG mean / p50 | cgc mean / p50 |" + more
            + " cgc ÷ Ray CG (mean / p50) | cgc ÷ raw (mean / p50) | Ray CG compile | "
            "cgc compile + start |\n|" + "---|" * cols)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", default="8,16,32,64,128", help="comma-separated N")
    parser.add_argument("--systems", default="raw,ray_cgraph,cgc",
                        help="of raw, ray_cgraph, cgc, cgc_no_wake (cgc with wake-ahead off), "
                        "cgc_k<K> (window of K depths; printed to stderr only)")
    parser.add_argument("--quick", action="store_true", help="fewer executions per cell")
    parser.add_argument("--iters", type=int, default=1000, help="executions per cell, at most")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per cell, at most")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=380.0,
                        help="start no new cell after this many seconds")
    parser.add_argument("--get-timeout", type=float, default=60.0)
    parser.add_argument("--raw-spin-us", type=float, default=100.0,
                        help="how long a raw worker spins (yielding) before it sleeps")
    parser.add_argument("--no-echo", action="store_true", help="leave out the chain of 1")
    args = parser.parse_args()
    if args.quick:
        args.iters, args.seconds, args.warmup = min(args.iters, 200), min(args.seconds, 1.5), 10
    sizes = [int(x) for x in args.actors.split(",") if x]
    if not args.no_echo and 1 not in sizes:
        sizes.insert(0, 1)
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        _system(s)  # an unknown name fails before Ray starts
    start = time.monotonic()
    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    print(f"cores: {os.cpu_count()}; per cell at most {args.iters} executions or "
          f"{args.seconds:g} s; raw spin {args.raw_spin_us:g} µs\n", flush=True)
    extra = "cgc_no_wake" in systems
    print(_header(extra), flush=True)
    rows = []
    for n in sizes:
        cells: dict[str, Cell | None] = {}
        for system in systems:
            if time.monotonic() - start > args.budget_s:
                cells[system] = {"skipped": True}
                continue
            gc.collect()
            t0 = time.monotonic()
            try:
                cells[system] = _system(system)(n, args)
            except Exception as exc:  # noqa: BLE001 - report it in the cell, go on
                first = (str(exc).strip().splitlines() or [""])[0][:120]
                cells[system] = {"error": f"{type(exc).__name__}: {first}"}
            print(f"  n={n} {system}: {_cell(cells[system])} ({time.monotonic() - t0:.1f} s)",
                  file=sys.stderr, flush=True)
        rows.append(_row(n, cells, extra))
        print(rows[-1], flush=True)
    ray.shutdown()
    # Again in one piece: Ray's own warnings can land between the rows printed as they came.
    print("\nAll rows:\n\n" + _header(extra) + "\n" + "\n".join(rows), flush=True)
    print(f"\ntotal {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    import ray_leftovers  # Ray CG's named semaphores of our Ray go at exit

    ray_leftovers.install()
    sys.exit(main())
