"""One 2-stage pipeline through cgc's own API and through the Ray drop-in, side by side.

    python tools/bench/bench_api_pipeline.py [--device cuda|cpu] [--iters 400] [--rounds 3]

The program (issue 37 item 4): stage 0 keeps a bf16 activation ``x`` (rows x 4096) and a
weight on its device and returns ``relu((x + i) @ w)`` for the execution's integer ``i``
(16 MiB per hop at 2048 rows) over a ``with_tensor_transport("nccl")`` edge; stage 1
returns ``float((h @ w).sum())``. Both actors ask for ``num_gpus=0.5`` (one GPU shared:
CUDA IPC binds; ``--device cpu`` declares one logical GPU and binds the CPU communicator).
Capacity 4, 4 executions in flight.

Systems, each on fresh actors, one alive at a time, rounds interleaved:
- ``cgc``: Ray's DAG API on ``Actor.bind()`` actors, ``cgc.compile(dag).start()``;
- ``cgc_builder``: cgc's own builder, ``@cgc.actor(num_gpus=0.5)`` classes (no other
  option) and ``cgc.InputNode``, ``cgc.compile(dag).start()``;
- ``cgc_live``: the same through ``cgc.compile`` on live actors (``Actor.remote()``);
- ``dropin``: live actors, ``dag.experimental_compile()`` with ``cgc.ray_compat`` installed.

Every result is checked against the first system's (bf16 sums: equal within 1%); a wrong
result is reported instead of a rate. Prints executions/s and p50 µs per system and round,
then the median of rounds and each system's ratio to ``dropin``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import ray
import torch

SYSTEMS = ("cgc", "cgc_builder", "cgc_live", "dropin")


class Stage0:
    def __init__(self, rows: int, device: str) -> None:
        g = torch.Generator().manual_seed(0)
        dt = torch.bfloat16
        self.x = (torch.randn(rows, 4096, generator=g) / 8).to(device, dt)
        self.w = (torch.randn(4096, 1024, generator=g) / 64).to(device, dt)

    def fwd(self, i: int) -> torch.Tensor:
        return torch.relu((self.x + i) @ self.w)


class Stage1:
    def __init__(self, device: str) -> None:
        g = torch.Generator().manual_seed(1)
        self.w = (torch.randn(1024, 64, generator=g) / 32).to(device, torch.bfloat16)

    def fwd(self, h: torch.Tensor) -> float:
        return float((h @ self.w.to(h.device)).float().sum())


def _dag(system: str, rows: int, device: str) -> tuple[Any, list[Any]]:
    from ray.dag import InputNode

    if system == "cgc_builder":
        import cgc

        a, b = cgc.actor(num_gpus=0.5)(Stage0).bind(rows, device), \
            cgc.actor(num_gpus=0.5)(Stage1).bind(device)
        with cgc.InputNode() as inp:
            return b.fwd.bind(a.fwd.bind(inp).with_tensor_transport("nccl")), []
    s0 = ray.remote(num_gpus=0.5, num_cpus=0)(Stage0)
    s1 = ray.remote(num_gpus=0.5, num_cpus=0)(Stage1)
    if system == "cgc":
        a, b = s0.bind(rows, device), s1.bind(device)
        live: list[Any] = []
    else:
        a, b = s0.remote(rows, device), s1.remote(device)
        live = [a, b]
    with InputNode() as inp:
        dag = b.fwd.bind(a.fwd.bind(inp).with_tensor_transport("nccl"))
    return dag, live


def run(system: str, rows: int, device: str, iters: int, inflight: int) -> dict[str, Any]:
    """Start ``system``'s graph, time ``iters`` executions with ``inflight`` in flight."""
    import cgc

    dag, live = _dag(system, rows, device)
    comm = "cpu" if device == "cpu" else "auto"
    if system == "dropin":
        import cgc.ray_compat

        cgc.ray_compat.install()
        try:
            compiled = dag.experimental_compile(_max_inflight_executions=inflight)
        finally:
            cgc.ray_compat.uninstall()
        submit, fetch, stop = compiled.execute, ray.get, compiled.teardown
        bindings = compiled.graph.comm_bindings
    else:
        graph = cgc.compile(dag, capacity=inflight).start(communicator=comm)
        submit, fetch, stop = graph.execute, (lambda r: r.get()), graph.teardown
        bindings = graph.comm_bindings
    try:
        results: list[float] = []
        for i in range(inflight * 2):  # warm-up
            fetch(submit(i % 7))
        lat: list[float] = []
        pending: list[tuple[Any, float]] = []
        t0 = time.perf_counter()
        for i in range(iters):
            if len(pending) == inflight:
                ref, ts = pending.pop(0)
                results.append(fetch(ref))
                lat.append(time.perf_counter() - ts)
            pending.append((submit(i % 7), time.perf_counter()))
        for ref, ts in pending:
            results.append(fetch(ref))
            lat.append(time.perf_counter() - ts)
        wall = time.perf_counter() - t0
    finally:
        stop()
        for h in live:
            ray.kill(h)
    return {"rate": iters / wall, "p50_us": statistics.median(lat) * 1e6,
            "results": results[:14],
            "bindings": sorted({b.transport for b in bindings.values()})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--rows", type=int, default=0, help="rows of x (default 2048 cuda, 64 cpu)")
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--inflight", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    args = ap.parse_args()
    rows = args.rows or (2048 if args.device == "cuda" else 64)
    systems = args.systems.split(",")
    ray.init(num_gpus=None if args.device == "cuda" else 1, include_dashboard=False,
             log_to_driver=False)
    rates: dict[str, list[float]] = {s: [] for s in systems}
    p50s: dict[str, list[float]] = {s: [] for s in systems}
    ref: list[float] | None = None
    wrong = False
    for r in range(args.rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for s in order:
            out = run(s, rows, args.device, args.iters, args.inflight)
            if ref is None:
                ref = out["results"]
            ok = all(abs(a - b) <= 0.01 * max(1.0, abs(b)) for a, b in zip(out["results"], ref,
                                                                             strict=True))
            wrong |= not ok
            rates[s].append(out["rate"])
            p50s[s].append(out["p50_us"])
            print(f"round {r} {s:9s} {out['rate']:9.1f}/s p50 {out['p50_us']:8.1f} us "
                  f"bindings {out['bindings']}{'' if ok else '  WRONG RESULT'}",
                  file=sys.stderr, flush=True)
    base = statistics.median(rates["dropin"]) if "dropin" in rates else None
    print(f"| system | executions/s (median of {args.rounds}) | p50 µs | ÷ dropin |")
    print("|---|---|---|---|")
    for s in systems:
        rate = statistics.median(rates[s])
        ratio = f"{rate / base:.2f}x" if base else "-"
        print(f"| {s} | {rate:,.0f} | {statistics.median(p50s[s]):,.0f} | {ratio} |")
    ray.shutdown()
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    import ray_leftovers  # Ray CG's named semaphores of our Ray go at exit

    ray_leftovers.install()
    main()
