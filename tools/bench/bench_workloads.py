"""The three workloads side by side: cgc's API, cgc's Ray drop-in, Ray Compiled Graph and a
single-process floor (the same compute, no actors), with every result checked against the
floor's.

    python tools/bench/bench_workloads.py                        # CPU sizes, all systems
    python tools/bench/bench_workloads.py --size gpu --gpus 0.5  # the GPU sizes, one GPU
    python tools/bench/bench_workloads.py --workloads decode --systems cgc,floor --rounds 3

Workloads (examples/): ``decode`` (llm_decode: tokens/s and per-token p50/p99 at the
sequences' pace, prefill excluded), ``train`` (train_1f1b: steps/s), ``rl`` (rl_loop:
iterations/s). Systems: ``cgc`` (``cgc.compile(dag).start()``), ``dropin`` (the Ray
program of examples/ray_*.py through ``cgc.ray_compat.install()``), ``ray_cgraph`` (the
same Ray program on Ray Compiled Graph), ``floor`` (one process, no Ray); for decode also
``cgc_graph`` (each stage's step a CUDA graph: ``build_dag(cuda_graph=True)``) and
``floor_graph`` (the whole model's step captured and replayed in one process,
``cgc.runtime.gpu.cuda_graphs.CapturedCall``). ``--stages 1`` gives the one-actor rows.

Every (workload, system) runs in a child process with a deadline, on one Ray cluster the
parent starts: a system that hangs or crashes is reported as such and the others go on.
Rounds alternate the systems' order (forward, then reversed, so none always runs first
on a cold or warm machine); the table gives medians over rounds and the ratios against
Ray CG and the floor, and each system's range (min – max) over rounds; a line per workload
then says whether cgc's own API or the drop-in measured faster (only where their ranges do
not overlap) and one line answers "which API?" from those figures. Each run prints a
progress line on stderr with the time elapsed and an estimate of the time left. The default is 3 rounds: one round once showed the drop-in 2.06x
faster than cgc on ``train`` where three rounds found both at 351 steps/s (one run is at
the mercy of whatever else the machine did then); ``--rounds 1`` for a quick look only. ``busy`` is the share of wall time in which some actor was inside a
method call (from cgc's ``--trace``, one extra short run per round; on a GPU it counts
host time, which for these workloads includes the wait for the last stage's tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

WORKLOADS = ("decode", "train", "rl")
SYSTEMS = ("cgc", "dropin", "ray_cgraph", "floor")
# decode only: each stage's step replayed as a CUDA graph (cgc), and the same capture in one
# process (the replay floor)
GRAPH_SYSTEMS = ("cgc_graph", "floor_graph")
UNITS = {"decode": "tokens/s", "train": "steps/s", "rl": "iterations/s"}
# Enough rounds for a median that one disturbed run does not decide (module docstring).
DEFAULT_ROUNDS = 3


# ---------------------------------------------------------------- sizes


def settings(workload: str, size: str) -> dict[str, Any]:
    """The knobs of one workload at one size (``tiny`` for 2 CPU cores, ``gpu`` for one
    H200 shared by the actors)."""
    if workload == "decode":
        if size == "gpu":
            return dict(model="gpt2-small", stages=2, microbatches=2, batch=8, prompt=32,
                        tokens=96, warm_tokens=8)
        return dict(model="tiny", stages=2, microbatches=2, batch=2, prompt=8, tokens=32,
                    warm_tokens=4)
    if workload == "train":
        return dict(model="gpu" if size == "gpu" else "tiny", stages=2,
                    steps=30 if size == "gpu" else 20, warm=3)
    return dict(model="gpu" if size == "gpu" else "tiny",
                iterations=30 if size == "gpu" else 40, warm=3)


# ---------------------------------------------------------------- one run (child process)


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def _busy(trace_path: str) -> float:
    """Share of the traced span in which some actor ran a COMPUTE op."""
    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("ph") == "X" and e.get("cat") == "COMPUTE")
    if not spans:
        return float("nan")
    covered, cur_a, cur_b = 0.0, spans[0][0], spans[0][1]
    for a, b in spans[1:]:
        if a > cur_b:
            covered += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    covered += cur_b - cur_a
    return covered / (spans[-1][1] - spans[0][0])


class _Runner:
    """Runs one workload on one system (inside the child)."""

    def __init__(self, workload: str, system: str, size: str, gpus: float,
                 address: str | None, stages: int | None = None,
                 microbatches: int | None = None) -> None:
        sys.path.insert(0, str(EXAMPLES))
        self.workload, self.system, self.size, self.gpus = workload, system, size, gpus
        self.s = settings(workload, size)
        if stages:
            self.s["stages"] = stages
        if microbatches and workload == "decode":
            self.s["microbatches"] = microbatches
        self.address = address
        self.teardown: list[Any] = []

    # ---- graph construction per system
    def _ray(self) -> None:
        import ray

        if self.system == "dropin":
            import cgc.ray_compat

            cgc.ray_compat.install()
        ray.init(address=self.address, log_to_driver=False)

    def _start_cgc(self, dag: Any, name: str, trace: str | None = None) -> Any:
        import cgc

        g = cgc.compile(dag, name=name).start(address=self.address, trace=trace,
                                              get_timeout=600)
        self.teardown.append(g.teardown)
        return g

    def _compiled(self, dag: Any) -> Any:
        c = dag.experimental_compile()
        self.teardown.append(c.teardown)
        return c

    # ---- decode
    def decode(self, trace: str | None) -> dict[str, Any]:
        import tinygpt

        s = self.s
        cfg = tinygpt.SIZES[s["model"]]
        ps = tinygpt.prompts(cfg, s["microbatches"], s["batch"], s["prompt"])
        if self.system in ("floor", "floor_graph"):
            stage = tinygpt.GPTStage(cfg, 0, cfg["n_layers"], s["microbatches"], s["batch"])
            step = stage.forward
            if self.system == "floor_graph" and stage.device.type == "cuda":
                from cgc.runtime.gpu.cuda_graphs import CapturedCall

                step = CapturedCall(stage.forward, "floor")

            def submit(mb: int, tok: Any, pos: Any) -> Any:
                return step(tok, mb, pos)

            def fetch(r: Any) -> Any:
                return r
        elif self.system in ("cgc", "cgc_graph"):
            import llm_decode

            dag = llm_decode.build_dag(s["model"], s["stages"], s["microbatches"], s["batch"],
                                       self.gpus, cuda_graph=self.system == "cgc_graph")
            g = self._start_cgc(dag, "decode", trace)
            submit, fetch = g.execute, (lambda r: r.get())
        else:
            import ray
            import ray_llm_decode

            self._ray()
            actors = ray_llm_decode.make_stages(s["model"], s["stages"], s["microbatches"],
                                                s["batch"], self.gpus)
            c = self._compiled(ray_llm_decode.build_dag(actors))
            submit, fetch = c.execute, ray.get
        tinygpt.generate(submit, fetch, ps, s["warm_tokens"])  # warm-up (caches refilled)
        arrivals: dict[int, list[float]] = {}
        t0 = time.perf_counter()

        def on_token(mb: int, step: int) -> None:
            arrivals.setdefault(mb, []).append(time.perf_counter())

        n_tokens = min(16, s["tokens"]) if trace else s["tokens"]
        out = tinygpt.generate(submit, fetch, ps, n_tokens, on_token)
        wall = time.perf_counter() - t0
        # Per-token latency at each sequence's pace; the first arrival includes prefill.
        gaps = [b - a for ts in arrivals.values() for a, b in zip(ts[1:-1], ts[2:], strict=False)]
        first = max(ts[0] for ts in arrivals.values()) - t0
        decode_wall = wall - first
        tokens = s["microbatches"] * s["batch"] * (n_tokens - 1)
        return {"rate": tokens / decode_wall if decode_wall > 0 else float("nan"),
                "p50_ms": 1e3 * _percentile(gaps, 0.5), "p99_ms": 1e3 * _percentile(gaps, 0.99),
                "prefill_ms": 1e3 * first,
                "result": [t.tolist() for t in out]}

    # ---- 1F1B training
    def train(self, trace: str | None) -> dict[str, Any]:
        import pipe_train

        s = self.s
        cfg = pipe_train.SIZES[s["model"]]
        total = s["warm"] + (5 if trace else s["steps"])
        data = [pipe_train.batch(cfg, k) for k in range(total)]  # made before timing
        if self.system == "floor":
            stages = [pipe_train.TrainStage(cfg, i, s["stages"]) for i in range(s["stages"])]

            def step(k: int) -> list[float]:
                return pipe_train.local_step(stages, cfg, k, data[k])
        elif self.system == "cgc":
            import train_1f1b

            g = self._start_cgc(train_1f1b.build_dag(s["model"], s["stages"], self.gpus),
                                "train", trace)

            def step(k: int) -> list[float]:
                return [r.get() for r in g.execute(*data[k])]
        else:
            import ray
            import ray_train_1f1b

            self._ray()
            actors = ray_train_1f1b.make_stages(s["model"], s["stages"], self.gpus)
            c = self._compiled(ray_train_1f1b.build_dag(actors, cfg["microbatches"]))

            def step(k: int) -> list[float]:
                return ray.get(c.execute(*data[k]))
        rows = [step(k) for k in range(s["warm"])]
        t_start = time.perf_counter()
        rows += [step(k) for k in range(s["warm"], total)]
        wall = time.perf_counter() - t_start
        return {"rate": (total - s["warm"]) / wall, "result": rows}

    # ---- RL
    def rl(self, trace: str | None) -> dict[str, Any]:
        import rl_policy

        s = self.s
        cfg = rl_policy.SIZES[s["model"]]
        total = s["warm"] + (5 if trace else s["iterations"])
        if self.system == "floor":
            rollouts = [rl_policy.Rollout(cfg, r) for r in range(cfg["rollouts"])]
            learner = rl_policy.Learner(cfg)

            def one(it: int) -> list[float]:
                w = learner.update(*[r.sample(it) for r in rollouts])
                return [r.load(w) for r in rollouts]
        elif self.system == "cgc":
            import rl_loop

            g = self._start_cgc(rl_loop.build_dag(s["model"], self.gpus), "rl", trace)

            def one(it: int) -> list[float]:
                return [r.get() for r in g.execute(it)]
        else:
            import ray
            import ray_rl_loop

            self._ray()
            rollouts_h, learner_h = ray_rl_loop.make_actors(s["model"], self.gpus)
            c = self._compiled(ray_rl_loop.build_dag(rollouts_h, learner_h))

            def one(it: int) -> list[float]:
                return ray.get(c.execute(it))
        rows = [one(it) for it in range(s["warm"])]
        t_start = time.perf_counter()
        rows += [one(it) for it in range(s["warm"], total)]
        wall = time.perf_counter() - t_start
        return {"rate": (total - s["warm"]) / wall, "result": rows}

    def run(self, trace: str | None = None) -> dict[str, Any]:
        try:
            return getattr(self, self.workload)(trace)
        finally:
            for td in reversed(self.teardown):
                try:
                    td()
                except Exception as exc:  # noqa: BLE001 - report, do not mask the result
                    print(f"teardown: {type(exc).__name__}: {exc}", file=sys.stderr)


def child(args: argparse.Namespace) -> None:
    if args.child[1].startswith("floor"):
        import torch

        # Ray gives each actor one intra-op thread (OMP_NUM_THREADS from num_cpus); the
        # floor gets the same, so it measures the compute and not thread contention.
        torch.set_num_threads(1)
    runner = _Runner(args.child[0], args.child[1], args.size, args.gpus, args.address,
                     args.stages, args.microbatches)
    res = runner.run()
    if args.child[1] == "cgc" and args.busy:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            again = _Runner(args.child[0], "cgc", args.size, args.gpus, args.address,
                            args.stages, args.microbatches)
            again.run(trace=path)
            res["busy"] = _busy(path)
    print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------- the table (parent)


def _same(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= tol
    return a == b


def _run_child(workload: str, system: str, args: argparse.Namespace,
               address: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", workload, system, "--size", args.size,
           "--gpus", str(args.gpus), "--address", address]
    if args.stages:
        cmd += ["--stages", str(args.stages)]
    if args.microbatches:
        cmd += ["--microbatches", str(args.microbatches)]
    if args.busy:
        cmd.append("--busy")
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.deadline)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-400:] if isinstance(exc.stderr, bytes) else ""
        return {"error": f"did not finish in {args.deadline:.0f} s (hung){' ' + str(tail)}"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
            res["seconds"] = time.monotonic() - t0
            return res
    err = (done.stderr.strip().splitlines() or ["no output"])
    last = [ln for ln in err if "Error" in ln or "error" in ln][-1:] or err[-1:]
    return {"error": f"exit {done.returncode}: {last[0][:300]}"}


def parser() -> argparse.ArgumentParser:
    """The command line (``parser().parse_args([]).rounds == DEFAULT_ROUNDS``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--size", default="tiny", choices=["tiny", "gpu"])
    ap.add_argument("--gpus", type=float, default=0.0, help="num_gpus per actor")
    ap.add_argument("--stages", type=int, default=0, help="pipeline stages (0: the size's)")
    ap.add_argument("--microbatches", type=int, default=0,
                    help="decode microbatches in flight (0: the size's)")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                    help="rounds, the systems' order alternating; the table shows medians "
                    f"(default {DEFAULT_ROUNDS}: one round is not a stable median)")
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds per run")
    ap.add_argument("--busy", action="store_true", help="also measure busy share (cgc)")
    ap.add_argument("--json", type=Path, help="write every run here")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.child:
        child(args)
        return
    import ray

    # Ray's workers (started by this cluster's raylet) and the children import the
    # workload modules from examples/.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(EXAMPLES), os.environ.get("PYTHONPATH", "")) if p)
    info = ray.init(address="local", include_dashboard=False, log_to_driver=False)
    address = info.address_info["gcs_address"]
    workloads = args.workloads.split(",")
    systems = args.systems.split(",")
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    plan = [(r, w, s) for r in range(args.rounds)
            for w in workloads
            for s in (systems if r % 2 == 0 else list(reversed(systems)))
            if not (s in GRAPH_SYSTEMS and w != "decode")]
    print(f"{len(plan)} runs ({args.rounds} round(s) of {len(plan) // max(1, args.rounds)}, "
          "each in a child process, the systems' order alternating between rounds)",
          file=sys.stderr, flush=True)
    t_all = time.monotonic()
    for i, (r, w, s) in enumerate(plan):
        res = _run_child(w, s, args, address)
        runs.setdefault((w, s), []).append(res)
        shown = f"{res['rate']:.1f} {UNITS[w]}" if "rate" in res else res["error"]
        print(f"[{i + 1}/{len(plan)}] round {r} {w:6} {s:10} {shown}   "
              f"{progress(i + 1, len(plan), time.monotonic() - t_all)}",
              file=sys.stderr, flush=True)
    ray.shutdown()
    if args.json:
        args.json.write_text(json.dumps({f"{w}/{s}": v for (w, s), v in runs.items()},
                                        indent=1))
    print(table(runs, workloads, systems, args))


def progress(done: int, total: int, elapsed: float) -> str:
    """Elapsed time and the estimated time left, from the mean of the runs so far.

    >>> progress(2, 6, 60.0)
    'elapsed 1 min 0 s, about 2 min 0 s left'
    """
    def mmss(t: float) -> str:
        return f"{int(t // 60)} min {int(t % 60)} s"

    left = elapsed / done * (total - done) if done else float("nan")
    return f"elapsed {mmss(elapsed)}, " + ("done" if done >= total else f"about {mmss(left)} left")


def _spread(ok: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(median, min, max) of the rates of one system's rounds."""
    rates = [x["rate"] for x in ok]
    return statistics.median(rates), min(rates), max(rates)


def which_api(runs: dict[tuple[str, str], list[dict[str, Any]]],
              workloads: list[str]) -> list[str]:
    """One line per workload comparing cgc's own API with its Ray drop-in, from the measured
    rounds: a difference counts only where the two systems' ranges over rounds do not
    overlap; then one line of advice.

    >>> runs = {("rl", "cgc"): [{"rate": r} for r in (10, 11, 12)],
    ...         ("rl", "dropin"): [{"rate": r} for r in (20, 21, 22)]}
    >>> which_api(runs, ["rl"])[0]
    'rl: the drop-in is faster, 1.91× (median 21.0 vs 11.0 iterations/s; ranges over rounds do not overlap)'
    """
    lines, faster = [], {"cgc": 0, "dropin": 0}
    for w in workloads:
        got = {s: [x for x in runs.get((w, s), []) if "rate" in x] for s in ("cgc", "dropin")}
        if not got["cgc"] or not got["dropin"]:
            continue
        (mc, lo_c, hi_c), (md, lo_d, hi_d) = _spread(got["cgc"]), _spread(got["dropin"])
        unit = UNITS[w]
        if hi_c < lo_d or hi_d < lo_c:
            win, ratio = ("cgc", mc / md) if mc > md else ("dropin", md / mc)
            faster[win] += 1
            name = "cgc's own API" if win == "cgc" else "the drop-in"
            lines.append(f"{w}: {name} is faster, {ratio:.2f}× (median {max(mc, md):,.1f} vs "
                         f"{min(mc, md):,.1f} {unit}; ranges over rounds do not overlap)")
        else:
            lines.append(f"{w}: no measured difference (cgc {lo_c:,.1f}–{hi_c:,.1f}, drop-in "
                         f"{lo_d:,.1f}–{hi_d:,.1f} {unit}: the ranges over rounds overlap)")
    if not lines:
        return []
    if faster["cgc"] and not faster["dropin"]:
        advice = ("cgc's own API (cgc.compile(dag).start()) measured faster here; the "
                  "drop-in is for running an existing Ray Compiled Graph program unchanged")
    elif faster["dropin"] and not faster["cgc"]:
        advice = ("the drop-in measured faster here: keep the Ray program and "
                  "cgc.ray_compat.install(); cgc's own API adds plans you can save, sign "
                  "and inspect")
    elif not faster["cgc"] and not faster["dropin"]:
        advice = ("no measured speed difference: choose by what you start from (a Ray "
                  "Compiled Graph program: the drop-in; new code or plan files: cgc's own API)")
    else:
        advice = "it depends on the workload (above); more --rounds narrow the ranges"
    return lines + [f"which API: {advice}"]


def table(runs: dict[tuple[str, str], list[dict[str, Any]]], workloads: list[str],
          systems: list[str], args: argparse.Namespace) -> str:
    """The markdown table: median rate per system, ratios, exactness against the floor."""
    lines = [f"size `{args.size}`, num_gpus per actor {args.gpus}, "
             f"{args.stages or 'default'} stages, {args.microbatches or 'default'} decode "
             f"microbatches, {args.rounds} round(s); median over rounds, and their range",
             "",
             "| workload | system | rate | min – max | p50 / p99 per token | busy | ÷ Ray CG "
             "| ÷ floor | ÷ cgc | equal to floor |", "|---|---|---|---|---|---|---|---|---|---|"]
    for w in workloads:
        med: dict[str, float] = {}
        for s in systems:
            ok = [x for x in runs.get((w, s), []) if "rate" in x]
            if ok:
                med[s] = statistics.median(x["rate"] for x in ok)
        floor = runs.get((w, "floor"), [])
        want = next((x["result"] for x in floor if "result" in x), None)
        tol = 0.0 if w == "decode" else 1e-5
        for s in systems:
            if s in GRAPH_SYSTEMS and w != "decode":
                continue
            got = runs.get((w, s), [])
            ok = [x for x in got if "rate" in x]
            if not ok:
                err = got[0]["error"] if got else "not run"
                lines.append(f"| {w} | {s} | {err} | | | | | | | |")
                continue
            lat = ""
            if w == "decode":
                lat = (f"{statistics.median(x['p50_ms'] for x in ok):.2f} / "
                       f"{statistics.median(x['p99_ms'] for x in ok):.2f} ms")
            busy = [x["busy"] for x in ok if "busy" in x]
            vs_ray = f"{med[s] / med['ray_cgraph']:.2f}×" if "ray_cgraph" in med else "—"
            vs_floor = f"{med[s] / med['floor']:.2f}×" if "floor" in med else "—"
            vs_cgc = f"{med[s] / med['cgc']:.2f}×" if "cgc" in med else "—"
            same = "—" if want is None else \
                ("yes" if all(_same(x["result"], want, tol) for x in ok) else "NO")
            _, lo, hi = _spread(ok)
            lines.append(f"| {w} | {s} | {med[s]:,.1f} {UNITS[w]} | {lo:,.1f} – {hi:,.1f} | "
                         f"{lat} | "
                         f"{f'{100 * statistics.median(busy):.0f}%' if busy else ''} | "
                         f"{vs_ray} | {vs_floor} | {vs_cgc} | {same} |")
    advice = which_api(runs, workloads)
    return "\n".join(lines + ([""] + advice if advice else []))


if __name__ == "__main__":
    import ray_leftovers  # Ray CG's named semaphores of our Ray go at exit

    ray_leftovers.install()
    main()
