"""Plain Ray actor calls side by side, in one process run: eager Ray with Ray Direct
Transport hints, eager Ray through the object store, cgc's traced step, the same graph
through the DAG API (``cgc.compile(dag)``) and the single-process floor; every result
checked against the floor's.

    python tools/bench/bench_trace.py                       # CPU: echo 1 KiB / 1 MiB, the
                                                            # three workloads (gloo hints)
    python tools/bench/bench_trace.py --parts echo --rounds 3
    python tools/bench/bench_trace.py --device cuda         # one GPU: the 16 MiB bf16
                                                            # pipeline (cuda_ipc, nccl hints)
    python tools/bench/bench_trace.py --device cpu --parts pipeline   # its harness, on CPU

Parts: ``echo`` (a float32 tensor ``a.fwd -> b.fwd -> driver``, p50 of one execution at a
time), ``decode``/``train``/``rl`` (examples/rdt_*.py at CPU sizes: tokens/s, steps/s,
iterations/s; fresh actors per system, warm-up excluded), ``pipeline`` (two stages, a
16 MiB bf16 activation per hop, 4 executions in flight: executions/s). Systems: ``rdt``
(eager, ``.options(tensor_transport=T)``: gloo on the CPU; cuda_ipc and nccl on a GPU),
``store`` (eager, no hint), ``traced`` (``cgc.trace(step)``), ``dag`` (the same graph in
Ray's DAG API, compiled by cgc), ``floor`` (the same compute in this process). A system
that fails prints its error in its row and the others go on; rounds alternate systems
and the table gives medians. The last column is the traced step's speed-up over the row's
system (its time / the traced step's, or the traced rate / its rate): the targets read
there (eager RDT: >= 25x / 15x echo, >= 5x workloads; the DAG: >= 1/1.1 = 0.91x, one plan;
the floor: >= 0.6x for the GPU pipeline).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

from bench_trace_workloads import Actors, workload  # noqa: E402 - examples/ on the path

PARTS = ("echo", "decode", "train", "rl", "pipeline")
ECHO_SIZES = (1024, 1 << 20)
PIPE_BYTES = 16 << 20
IN_FLIGHT = 4


class Echo:
    """``fwd`` returns its tensor; ``make`` makes the pipeline's activation on the actor's
    device; ``finish`` reduces it to a number (what goes back to the driver)."""

    def __init__(self, device: str = "cpu", nbytes: int = PIPE_BYTES) -> None:
        import torch

        self.device = device
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        n = nbytes // (2 if device == "cuda" else 4)
        self.base = torch.ones(n, dtype=dtype, device=device) if nbytes else None

    def fwd(self, x: Any) -> Any:
        return x

    def make(self, i: Any) -> Any:
        return self.base * (1 + int(i) % 3)

    def finish(self, x: Any) -> float:
        return float(x[:8].float().sum())


# ---------------------------------------------------------------- measuring


def _p50_us(run: Callable[[], Any], iters: int, warm: int) -> tuple[float, Any]:
    out = None
    for _ in range(warm):
        out = run()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6, out


def _in_flight_rate(submit: Callable[[int], Any], fetch: Callable[[Any], Any], n: int,
                    warm: int) -> tuple[float, list[Any]]:
    """Executions/s with IN_FLIGHT submitted ahead; the fetched values in order."""
    for i in range(warm):
        fetch(submit(i))
    t0 = time.perf_counter()
    pending, got = [], []
    for i in range(n):
        pending.append(submit(i))
        if len(pending) >= IN_FLIGHT:
            got.append(fetch(pending.pop(0)))
    got.extend(fetch(p) for p in pending)
    return n / (time.perf_counter() - t0), got


GET_TIMEOUT_S = [120.0]  # --timeout: how long an eager ray.get may wait (a failing RDT
# transfer waits Ray's own 60 s otherwise)


def _get(ref: Any) -> Any:
    import ray

    return ray.get(ref, timeout=GET_TIMEOUT_S[0])


# ---------------------------------------------------------------- echo and pipeline


def _echo_class(device: str) -> Any:
    import rdt_common

    return rdt_common.actor_class(Echo, num_gpus=0.5 if device == "cuda" else 0.0,
                                  num_cpus=0.01)


def echo(system: str, nbytes: int, args: argparse.Namespace) -> dict[str, Any]:
    """p50 of one execution of ``a.fwd -> b.fwd -> driver`` (float32 CPU tensor)."""
    import rdt_common
    import torch
    from ray.dag import InputNode

    import cgc

    transport = args.cpu_transport if system in ("rdt", "traced") else "none"
    x = torch.arange(nbytes // 4, dtype=torch.float32)
    cls = _echo_class("cpu")
    with Actors(lambda: [cls.remote("cpu", 0), cls.remote("cpu", 0)], transport) as (a, b):

        def step(v):
            return b.fwd.remote(rdt_common.send(a.fwd, transport).remote(v))

        if system in ("rdt", "store"):
            us, out = _p50_us(lambda: _get(step(x)), args.iters, args.warm)
        elif system == "traced":
            traced = cgc.trace(step)
            try:
                us, out = _p50_us(lambda: traced(x).get(), args.iters, args.warm)
            finally:
                traced.teardown()
        else:  # dag
            with InputNode() as inp:
                dag = b.fwd.bind(a.fwd.bind(inp))
            with cgc.compile(dag, name="echo").start() as g:
                us, out = _p50_us(lambda: g.execute(x).get(), args.iters, args.warm)
    return {"p50_us": us, "exact": bool(torch.equal(out, x))}


def echo_floor(nbytes: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    e0, e1, x = Echo("cpu", 0), Echo("cpu", 0), torch.arange(nbytes // 4, dtype=torch.float32)
    us, out = _p50_us(lambda: e1.fwd(e0.fwd(x.clone())), args.iters, args.warm)
    return {"p50_us": us, "exact": bool(torch.equal(out, x))}


def pipeline(system: str, args: argparse.Namespace, transport: str) -> dict[str, Any]:
    """Two stages: ``s0.make(i)`` (the activation, on the stage's device) -> ``s1.finish``
    -> driver, IN_FLIGHT executions in flight; executions/s."""
    import rdt_common
    from ray.dag import InputNode

    import cgc

    dev = args.device
    hint = transport if system in ("rdt", "traced") else "none"
    cls = _echo_class(dev)
    want = [float(8 * (1 + i % 3)) for i in range(args.pipe_iters)]
    with Actors(lambda: [cls.remote(dev, PIPE_BYTES), cls.remote(dev, 0)], hint) as (s0, s1):

        def step(i):
            return s1.finish.remote(rdt_common.send(s0.make, hint).remote(i))

        if system in ("rdt", "store"):
            rate, got = _in_flight_rate(step, _get, args.pipe_iters, args.warm)
        elif system == "traced":
            traced = cgc.trace(step, capacity=IN_FLIGHT)
            try:
                rate, got = _in_flight_rate(traced, lambda r: r.get(timeout=120),
                                            args.pipe_iters, args.warm)
            finally:
                traced.teardown()
        else:
            with InputNode() as inp:
                h = s0.make.bind(inp)
                if dev == "cuda":
                    h = h.with_tensor_transport("nccl")
                dag = s1.finish.bind(h)
            with cgc.compile(dag, name="pipeline", capacity=IN_FLIGHT).start() as g:
                rate, got = _in_flight_rate(g.execute, lambda r: r.get(timeout=120),
                                            args.pipe_iters, args.warm)
    return {"rate": rate, "exact": got == want}


def pipeline_floor(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    s0, s1 = Echo(args.device, PIPE_BYTES), Echo(args.device, 0)

    def run(i: int) -> float:
        return s1.finish(s0.make(i))

    rate, got = _in_flight_rate(run, lambda v: v, args.pipe_iters, args.warm)
    if args.device == "cuda":
        torch.cuda.synchronize()
    return {"rate": rate, "exact": got == [float(8 * (1 + i % 3))
                                           for i in range(args.pipe_iters)]}



# ---------------------------------------------------------------- driver


def _cells(part: str, args: argparse.Namespace) -> list[tuple[str, str, Callable[[], dict]]]:
    """(row, system, run) of one part."""
    systems = args.systems.split(",")
    out: list[tuple[str, str, Callable[[], dict]]] = []
    if part == "echo":
        for n in ECHO_SIZES:
            row = f"echo {n // 1024} KiB" if n < 1 << 20 else f"echo {n >> 20} MiB"
            for s in systems:
                run = (lambda n=n: echo_floor(n, args)) if s == "floor" else \
                    (lambda s=s, n=n: echo(s, n, args))
                out.append((row, s, run))
    elif part == "pipeline":
        transports = [args.cpu_transport] if args.device == "cpu" else ["cuda_ipc", "nccl"]
        for s in systems:
            if s == "floor":
                out.append(("pipeline 16 MiB", s, lambda: pipeline_floor(args)))
            elif s in ("rdt", "traced"):
                for t in transports:
                    out.append(("pipeline 16 MiB", f"{s}:{t}",
                                lambda s=s, t=t: pipeline(s, args, t)))
            else:
                out.append(("pipeline 16 MiB", s, lambda s=s: pipeline(s, args, "none")))
    else:
        for s in systems:
            out.append((part, s, lambda s=s: workload(part, s, args)))
    return out


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}" if v >= 10 else f"{v:,.2f}"


def table(results: dict[tuple[str, str], list[dict]], rows: list[str]) -> str:
    """Markdown: per row, each system's median and the traced step's ratios."""
    lines = ["| case | system | median | exact | traced's speed-up over it |",
             "|---|---|---|---|---|"]
    for row in rows:
        cells = {s: r for (rw, s), r in results.items() if rw == row}
        tr = next((v for s, v in cells.items() if s.startswith("traced")), None)
        for s, runs in cells.items():
            ok = [r for r in runs if "error" not in r]
            if not ok:
                lines.append(f"| {row} | {s} | failed: {runs[-1]['error'][:120]} | | |")
                continue
            key = "p50_us" if "p50_us" in ok[0] else "rate"
            med = statistics.median(r[key] for r in ok)
            unit = " µs p50" if key == "p50_us" else "/s"
            ratio = ""
            tr_ok = [r for r in (tr or []) if "error" not in r]
            if tr_ok and not s.startswith("traced"):
                t = statistics.median(r[key] for r in tr_ok)
                x = med / t if key == "p50_us" else t / med
                ratio = f"{x:.2f}×"
            exact = all(r["exact"] for r in ok)
            lines.append(f"| {row} | {s} | {_fmt(med)}{unit} | {exact} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--parts", default=None, help=f"comma list of {','.join(PARTS)}")
    ap.add_argument("--systems", default="rdt,store,traced,dag,floor")
    ap.add_argument("--cpu-transport", default="gloo", help="the RDT hint on the CPU")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=300, help="echo executions timed")
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--pipe-iters", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds an eager ray.get waits (a failing RDT transfer)")
    ap.add_argument("--quick", action="store_true", help="few iterations (harness check)")
    ap.add_argument("--json", default=None, help="write every run here")
    args = ap.parse_args()
    GET_TIMEOUT_S[0] = args.timeout
    import torch

    # The floor computes in this process with one thread, as each actor does (Ray gives an
    # actor with num_cpus < 2 OMP_NUM_THREADS=1); more threads on 2 shared cores only thrash.
    torch.set_num_threads(1)
    # Ray warns for every RDT object passed back to its maker (the 1F1B step does that)
    warnings.filterwarnings("ignore", message="RDT ObjectRef")
    if args.quick:
        args.iters, args.warm, args.pipe_iters, args.rounds = 20, 3, 12, 1
    parts = (args.parts or ("pipeline" if args.device == "cuda" else
                            "echo,decode,train,rl")).split(",")
    import pipe_train
    import ray
    import rl_policy
    import tinygpt

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    for m in (tinygpt, pipe_train, rl_policy):  # Ray's workers cannot import examples/
        ray.cloudpickle.register_pickle_by_value(m)
    cells = [c for p in parts for c in _cells(p, args)]
    results: dict[tuple[str, str], list[dict]] = {}
    rows: list[str] = []
    for rnd in range(args.rounds):
        order = cells if rnd % 2 == 0 else list(reversed(cells))
        for row, system, run in order:
            if row not in rows:
                rows.append(row)
            t0 = time.perf_counter()
            try:
                res = run()
            except Exception as exc:  # noqa: BLE001 - a failing system is a row, not a stop
                res = {"error": f"{type(exc).__name__}: {exc}".replace("\n", " ")}
            results.setdefault((row, system), []).append(res)
            print(f"round {rnd} {row} {system}: {res} ({time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr, flush=True)
    print(table(results, [r for r in rows]))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {f"{r}|{s}": v for (r, s), v in results.items()}, indent=1))
    ray.shutdown()


if __name__ == "__main__":
    main()
