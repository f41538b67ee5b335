"""Where the eager pipelined decode's time goes (issue 22), on the GPU machine.

Two measurements, one call::

    python tools/bench/decode_breakdown.py side   # stage halves as plain processes
    python tools/bench/decode_breakdown.py trace  # cgc's 2-stage decode, per-op spans

``side``: GPT-2-small halves (``tinygpt.GPTStage``, batch 8) as bare processes (no Ray, no
cgc), each running decode steps with a host wait after every step (as a pipeline stage
must: the last stage sends tokens to the host, the first waits for them): one half alone,
the two halves side by side, the whole model alone. Shows what two CUDA contexts sharing
one GPU give when each waits on its own work every step.

``trace``: ``examples/llm_decode.py``'s 2-stage decode through cgc with ``trace=``, then
per actor and op kind the count, mean and total of the spans, and the share of the wall
time each actor spent in no op (waiting in its loop), so compute (kernel launches), hand-offs
and waits are separated.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

SIZE, BATCH, STEPS, TOKENS = "gpt2-small", 8, 200, 48


def _steps(first: int, last: int, start: mp.Barrier | None, out: mp.Queue) -> None:
    import tinygpt
    import torch

    torch.set_num_threads(1)
    cfg = tinygpt.SIZES[SIZE]
    st = tinygpt.GPTStage(cfg, first, last, 1, BATCH)
    d = cfg["d_model"]
    x = (torch.randint(0, cfg["vocab"], (BATCH, 1)) if st.is_first
         else torch.randn(BATCH, 1, d, device=st.device, dtype=st.dtype))
    for pos in range(8):  # warm-up
        st.forward(x, 0, pos)
    torch.cuda.synchronize()
    if start is not None:
        start.wait()
    t0 = time.perf_counter()
    for i in range(STEPS):
        y = st.forward(x, 0, 8 + i % 200)
        if st.is_last:
            y.cpu()
        else:
            torch.cuda.current_stream().synchronize()
    out.put((first, last, STEPS / (time.perf_counter() - t0)))


def _spawn(spans: list[tuple[int, int]]) -> list[tuple[int, int, float]]:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    barrier = ctx.Barrier(len(spans)) if len(spans) > 1 else None
    procs = [ctx.Process(target=_steps, args=(a, b, barrier, q)) for a, b in spans]
    for p in procs:
        p.start()
    got = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    return sorted(got)


def side() -> None:
    import tinygpt

    n = tinygpt.SIZES[SIZE]["n_layers"]
    (a0, a1), (b0, b1) = tinygpt.split_layers(n, 2)
    print(f"{SIZE}, batch {BATCH}, {STEPS} steps, a host wait after every step")
    print("| run | steps/s per process |")
    print("|---|---|")
    for label, spans in [("first half alone", [(a0, a1)]), ("second half alone", [(b0, b1)]),
                         ("both halves side by side", [(a0, a1), (b0, b1)]),
                         ("whole model alone", [(0, n)])]:
        rates = ", ".join(f"{r:,.0f}" for _, _, r in _spawn(spans))
        print(f"| {label} | {rates} |", flush=True)


def _summary(trace_path: str) -> None:
    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    spans = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            spans[(names.get(e["pid"], str(e["pid"])), e["cat"], e["name"])].append(e["dur"])
    per_actor: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e["cat"] != "driver":
            per_actor[names.get(e["pid"], str(e["pid"]))].append((e["ts"], e["ts"] + e["dur"]))
    print("| actor | op | count | mean us | total ms |")
    print("|---|---|---|---|---|")
    for (actor, cat, name), durs in sorted(spans.items()):
        print(f"| {actor} | {cat} {name} | {len(durs)} | {sum(durs) / len(durs):,.0f} | "
              f"{sum(durs) / 1e3:,.1f} |")
    for actor, ss in sorted(per_actor.items()):
        ss.sort()
        wall = ss[-1][1] - ss[0][0]
        in_ops = sum(b - a for a, b in ss)
        print(f"{actor}: {len(ss)} ops over {wall / 1e3:,.1f} ms, in ops {100 * in_ops / wall:.0f}%")


def _time_steps(n_layers: int, steps: int) -> float:
    """Whole-model decode steps per second in this process (a host wait per step)."""
    import tinygpt
    import torch

    cfg = tinygpt.SIZES[SIZE]
    st = tinygpt.GPTStage(cfg, 0, n_layers, 1, BATCH)
    x = torch.randint(0, cfg["vocab"], (BATCH, 1))
    for pos in range(8):
        st.forward(x, 0, pos).cpu()
    t0 = time.perf_counter()
    for i in range(steps):
        st.forward(x, 0, 8 + i % 200).cpu()
    return steps / (time.perf_counter() - t0)


class _Timer:
    """A plain Ray actor (no cgc) that times the whole model's steps, on Ray's task thread
    or on a thread of its own (as cgc's executor loop runs)."""

    def steps(self, in_thread: bool) -> float:
        import threading

        import tinygpt

        n = tinygpt.SIZES[SIZE]["n_layers"]
        if not in_thread:
            return _time_steps(n, STEPS)
        out: list[float] = []
        th = threading.Thread(target=lambda: out.append(_time_steps(n, STEPS)))
        th.start()
        th.join()
        return out[0]


    def start_background(self, switch_interval: float | None) -> None:
        """The loop on a thread of its own while Ray's task returns at once (what cgc's
        executor does); ``switch_interval`` sets ``sys.setswitchinterval`` first."""
        import threading

        import tinygpt

        if switch_interval is not None:
            sys.setswitchinterval(switch_interval)
        n = tinygpt.SIZES[SIZE]["n_layers"]
        self._out: list[float] = []
        self._th = threading.Thread(target=lambda: self._out.append(_time_steps(n, STEPS)))
        self._th.start()

    def background_result(self) -> float:
        self._th.join()
        sys.setswitchinterval(0.005)
        return self._out[0]


def actor() -> None:
    import ray
    import tinygpt

    n = tinygpt.SIZES[SIZE]["n_layers"]
    print(f"whole model, batch {BATCH}, {STEPS} steps, .cpu() after each")
    print(f"| plain process, main thread | {_time_steps(n, STEPS):,.0f} steps/s |", flush=True)
    # The workers import this module and the examples; keep the caller's path too (on the
    # GPU machine Ray itself comes from it).
    path = [str(EXAMPLES), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    ray.init(log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in path if p)}})
    gpus = 0.3 if ray.cluster_resources().get("GPU") else 0
    timer = ray.remote(num_gpus=gpus)(_Timer).remote()
    for in_thread in (False, True, False):
        rate = ray.get(timer.steps.remote(in_thread))
        where = "a thread of its own" if in_thread else "Ray's task thread"
        print(f"| Ray actor, {where} | {rate:,.0f} steps/s |", flush=True)
    for switch in (None, 0.05, None):
        ray.get(timer.start_background.remote(switch))
        rate = ray.get(timer.background_result.remote())
        what = f", switch interval {switch * 1e3:.0f} ms" if switch else ""
        print(f"| Ray actor, own thread, task returned{what} | {rate:,.0f} steps/s |", flush=True)
    ray.shutdown()


def _traced(label: str, dag: object) -> None:
    import tinygpt

    import cgc

    ps = tinygpt.prompts(tinygpt.SIZES[SIZE], 2, BATCH, 32)
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "run.json")
        with cgc.compile(dag, name="decode").start(trace=path) as g:
            tinygpt.generate(g.execute, lambda r: r.get(), ps, 8)  # warm-up
            t0 = time.perf_counter()
            tinygpt.generate(g.execute, lambda r: r.get(), ps, TOKENS)
            dt = time.perf_counter() - t0
        print(f"\n{label}: 2 x {BATCH} sequences x {TOKENS} tokens in {dt:.3f} s "
              f"({2 * BATCH * TOKENS / dt:,.0f} tokens/s with tracing on)")
        _summary(path)


def trace() -> None:
    """Two stages, hidden states over CUDA IPC (what the benchmark runs)."""
    import llm_decode

    _traced("2 stages, CUDA IPC", llm_decode.build_dag(SIZE, 2, 2, BATCH, num_gpus=0.3))


def trace_one() -> None:
    """One actor holding the whole model."""
    import llm_decode

    _traced("1 stage", llm_decode.build_dag(SIZE, 1, 2, BATCH, num_gpus=0.3))


def trace_host() -> None:
    """Two stages, hidden states through host memory (no GPU-side wait across processes)."""
    import llm_decode
    import tinygpt

    from cgc import InputNode

    cfg = tinygpt.SIZES[SIZE]
    actors = [llm_decode.Stage.options(num_gpus=0.3).bind(cfg, a, b, 2, BATCH)
              for a, b in tinygpt.split_layers(cfg["n_layers"], 2)]
    with InputNode() as inp:
        x = actors[0].forward.bind(inp[1], inp[0], inp[2]).with_tensor_transport(device="cpu")
        dag = actors[1].forward.bind(x, inp[0], inp[2]).with_tensor_transport(device="cpu")
    _traced("2 stages, hidden states via host", dag)


if __name__ == "__main__":
    for what in sys.argv[1:] or ["side", "trace", "trace_one", "trace_host"]:
        globals()[what]()
