"""Where the eager pipelined decode's time goes (issue 22), on the GPU machine.

Each mode is one measurement; several run in one call, in the order given::

    python tools/bench/decode_breakdown.py side   # stage halves as plain processes
    python tools/bench/decode_breakdown.py trace  # cgc's 2-stage decode, per-op spans
    python tools/bench/decode_breakdown.py rounds # floor, hand-written pipe, cgc interleaved

The device machine's speed drifts by up to 2x between calls (and between machines), so
only figures from one call compare; ``rounds`` interleaves the three systems for that.
``DECODE_SIZE=tiny`` runs any mode at CI size on a CPU (a smoke test of the tool).

``side``: GPT-2-small halves (``tinygpt.GPTStage``, batch 8) as bare processes (no Ray, no
cgc), each running decode steps with a host wait after every step (as a pipeline stage
must: the last stage sends tokens to the host, the first waits for them): one half alone,
the two halves side by side, the whole model alone. Shows what two CUDA contexts sharing
one GPU give when each waits on its own work every step.

``pipe_bare`` / ``pipe_ray``: the same two halves as a hand-written pipeline with no cgc:
two processes (bare, or plain Ray actors running the loop on a thread of their own) joined
by named pipes; the hidden state and the tokens cross through host memory, two microbatches
in flight, the parent feeding each microbatch's next step as its tokens come back. Shows
what a pipeline of two processes sharing one GPU can reach at all, and (against
``pipe_bare``) what a Ray worker process costs; each stage reports its mean time inside
``forward`` (the launches), in its hand-off out and waiting for its input.

``spin``: cgc's 2-stage decode with its waiting defaults (bounded adaptive spin, wake-ahead),
with wake-ahead off and with no spinning. ``rounds``: the floor (whole model in this
process), the hand-written pipe on plain Ray actors and cgc's 2-stage decode, interleaved
three times; medians and ratios.

``trace``: ``examples/llm_decode.py``'s 2-stage decode through cgc with ``trace=``, then
per actor and op kind the count, median, p90, mean and total of the spans, and the share of the wall
time each actor spent in no op (waiting in its loop), so compute (kernel launches), hand-offs
and waits are separated.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import struct
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

SIZE, BATCH, STEPS, TOKENS = os.environ.get("DECODE_SIZE", "gpt2-small"), 8, 200, 48


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


_HDR = "<iiq"  # microbatch, position, payload bytes (a format: Ray ships this module by value)
_HDR_BYTES = struct.calcsize(_HDR)
PIPE_STEPS, PIPE_MB = 150, 2


def _read_exact(fd: int, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = os.read(fd, n - got)
        if not b:
            raise EOFError("pipe closed")
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def _send(fd: int, mb: int, pos: int, payload: bytes) -> None:
    os.write(fd, struct.pack(_HDR, mb, pos, len(payload)) + payload)


def _recv(fd: int) -> tuple[int, int, bytes]:
    mb, pos, n = struct.unpack(_HDR, _read_exact(fd, _HDR_BYTES))
    return mb, pos, _read_exact(fd, n)


def _pipe_stage(first: int, last: int, rx: str, tx: str) -> dict[str, float]:
    """One stage's loop: read (mb, pos, bytes), run ``forward``, write the result as bytes.

    Stops at a negative microbatch (passed on downstream). Returns the mean milliseconds per
    step in ``forward`` (launches), in the hand-off out (device -> host copy and write) and
    waiting for input.
    """
    import tinygpt
    import torch

    torch.set_num_threads(1)
    cfg = tinygpt.SIZES[SIZE]
    st = tinygpt.GPTStage(cfg, first, last, PIPE_MB, BATCH)
    d = cfg["d_model"]
    rfd, wfd = os.open(rx, os.O_RDONLY), os.open(tx, os.O_WRONLY)
    t_fwd = t_out = t_in = 0.0
    n = 0
    while True:
        t0 = time.perf_counter()
        mb, pos, data = _recv(rfd)
        t1 = time.perf_counter()
        if mb < 0:
            _send(wfd, mb, pos, b"")
            break
        if st.is_first:
            x = torch.frombuffer(bytearray(data), dtype=torch.int64).reshape(BATCH, -1)
        else:
            x = torch.frombuffer(bytearray(data), dtype=st.dtype).reshape(BATCH, -1, d)
        y = st.forward(x, mb, pos)
        t2 = time.perf_counter()
        _send(wfd, mb, pos, y.cpu().numpy().tobytes())
        t3 = time.perf_counter()
        if n >= 2 * PIPE_MB:  # after warm-up
            t_in, t_fwd, t_out = t_in + t1 - t0, t_fwd + t2 - t1, t_out + t3 - t2
        n += 1
    os.close(rfd)
    os.close(wfd)
    k = max(n - 2 * PIPE_MB, 1)
    return {"forward_ms": 1e3 * t_fwd / k, "out_ms": 1e3 * t_out / k, "in_ms": 1e3 * t_in / k}


def _pipe_proc(first: int, last: int, rx: str, tx: str, q: mp.Queue) -> None:
    q.put((first, _pipe_stage(first, last, rx, tx)))


def _pipe_drive(fifos: list[str]) -> float:
    """Feed ``PIPE_MB`` microbatches through the pipe; tokens/s after warm-up."""
    import tinygpt
    import torch

    cfg = tinygpt.SIZES[SIZE]
    to0, from1 = os.open(fifos[0], os.O_WRONLY), os.open(fifos[2], os.O_RDONLY)
    gen = torch.Generator().manual_seed(0)
    for mb in range(PIPE_MB):
        tok = torch.randint(0, cfg["vocab"], (BATCH, 1), generator=gen)
        _send(to0, mb, 0, tok.numpy().tobytes())
    done, t0 = 0, 0.0
    steps = min(PIPE_STEPS, cfg["max_seq"] - 1)
    total = PIPE_MB * steps
    while done < total:
        mb, pos, data = _recv(from1)
        done += 1
        if done == 2 * PIPE_MB:
            t0 = time.perf_counter()
        if pos + 1 < steps:
            _send(to0, mb, pos + 1, data)
    dt = time.perf_counter() - t0
    _send(to0, -1, 0, b"")
    _recv(from1)
    os.close(to0)
    os.close(from1)
    return (total - 2 * PIPE_MB) * BATCH / dt


def _fifos(d: str) -> list[str]:
    paths = [os.path.join(d, n) for n in ("to0", "to1", "out")]
    for p in paths:
        os.mkfifo(p)
    return paths


def _print_pipe(label: str, rate: float, stats: list[tuple[int, dict[str, float]]]) -> None:
    per = "; ".join(f"stage {i}: forward {s['forward_ms']:.2f}, out {s['out_ms']:.2f}, "
                    f"waiting {s['in_ms']:.2f} ms" for i, (_, s) in enumerate(sorted(stats)))
    print(f"| {label} | {rate:,.0f} tokens/s | {per} |", flush=True)


def _floor_tokens() -> float:
    import tinygpt
    import torch

    torch.set_num_threads(1)  # as a Ray actor gets (OMP_NUM_THREADS=1)
    return BATCH * _time_steps(tinygpt.SIZES[SIZE]["n_layers"], PIPE_STEPS)


def pipe_bare() -> None:
    """Two bare processes joined by named pipes (no Ray, no cgc)."""
    import tinygpt

    (a0, a1), (b0, b1) = tinygpt.split_layers(tinygpt.SIZES[SIZE]["n_layers"], 2)
    print(f"{SIZE}, batch {BATCH}, {PIPE_MB} microbatches, {PIPE_STEPS} steps each")
    print(f"| whole model, one process (floor) | {_floor_tokens():,.0f} tokens/s | |", flush=True)
    ctx = mp.get_context("spawn")
    for _ in range(2):
        with tempfile.TemporaryDirectory() as d:
            f = _fifos(d)
            q: mp.Queue = ctx.Queue()
            procs = [ctx.Process(target=_pipe_proc, args=(a0, a1, f[0], f[1], q)),
                     ctx.Process(target=_pipe_proc, args=(b0, b1, f[1], f[2], q))]
            for p in procs:
                p.start()
            rate = _pipe_drive(f)
            stats = [q.get(timeout=120) for _ in procs]
            for p in procs:
                p.join()
        _print_pipe("two bare processes, named pipes", rate, stats)


class _PipeStage:
    """A plain Ray actor running ``_pipe_stage`` on a thread of its own."""

    def start(self, first: int, last: int, rx: str, tx: str, nice: int | None) -> dict[str, Any]:
        import threading

        self._out: list[dict[str, float]] = []

        def run() -> None:
            if nice is not None:  # Linux: a thread's niceness is its own
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
            self._out.append(_pipe_stage(first, last, rx, tx))

        self._th = threading.Thread(target=run, daemon=True)
        self._th.start()
        return {"affinity": len(os.sched_getaffinity(0)), "omp": os.environ.get("OMP_NUM_THREADS"),
                "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "nice": os.nice(0)}

    def result(self) -> dict[str, float]:
        self._th.join()
        return self._out[0]


def _ray_init() -> float:
    """A local Ray whose workers can import the examples; returns the GPUs per actor."""
    import ray

    # The workers import this module and the examples; keep the caller's path too (on the
    # GPU machine Ray itself comes from it).
    path = [str(EXAMPLES), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    if ray.is_initialized():  # a cgc run before this one left its local Ray
        ray.shutdown()
    ray.init(log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in path if p)}})
    return 0.3 if ray.cluster_resources().get("GPU") else 0


def _pipe_ray_once(gpus: float, nice: int | None) -> tuple[float, list, list]:
    """One run of the pipe on two fresh plain Ray actors: (tokens/s, stage stats, env)."""
    import ray
    import tinygpt

    (a0, a1), (b0, b1) = tinygpt.split_layers(tinygpt.SIZES[SIZE]["n_layers"], 2)
    actors = [ray.remote(num_gpus=gpus)(_PipeStage).remote() for _ in range(2)]
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        f = _fifos(d)
        env = ray.get([actors[0].start.remote(a0, a1, f[0], f[1], nice),
                       actors[1].start.remote(b0, b1, f[1], f[2], nice)])
        rate = _pipe_drive(f)
        stats = list(enumerate(ray.get([a.result.remote() for a in actors])))
    for a in actors:
        ray.kill(a)
    return rate, stats, env


def pipe_ray() -> None:
    """The same pipe with each stage in a plain Ray actor (no cgc), at Ray's worker
    niceness (15) and with the loop thread at niceness 0."""
    import ray

    gpus = _ray_init()
    print(f"driver: affinity {len(os.sched_getaffinity(0))} cpus, nice {os.nice(0)}")
    for nice in (None, 0, None, 0):
        rate, stats, env = _pipe_ray_once(gpus, nice)
        print(f"actor environment: {env}")
        how = "Ray's niceness" if nice is None else f"loop thread at nice {nice}"
        _print_pipe(f"two plain Ray actors, named pipes, {how}", rate, stats)
    ray.shutdown()


def _timed_decode(graph: Any) -> tuple[int, float]:
    """Greedy decode of 2 microbatches on a started decode graph, after 8 tokens of warm-up:
    (new tokens per sequence, seconds). The tokens fit the size's ``max_seq`` (prompt 32)."""
    import tinygpt

    ps = tinygpt.prompts(tinygpt.SIZES[SIZE], 2, BATCH, 32)
    tokens = min(TOKENS, tinygpt.SIZES[SIZE]["max_seq"] - 40)
    tinygpt.generate(graph.execute, lambda r: r.get(), ps, 8)
    t0 = time.perf_counter()
    tinygpt.generate(graph.execute, lambda r: r.get(), ps, tokens)
    return tokens, time.perf_counter() - t0


def _cgc_once(plan: Any, **start: Any) -> float:
    """tokens/s of one fresh start of the 2-stage decode plan."""
    with plan.start(**start) as g:
        tokens, dt = _timed_decode(g)
    return 2 * BATCH * tokens / dt


def _decode_plan() -> Any:
    import llm_decode

    import cgc

    return cgc.compile(llm_decode.build_dag(SIZE, 2, 2, BATCH, num_gpus=0.3), name="decode")


def spin() -> None:
    """cgc's 2-stage decode under its waiting settings: the defaults (a bounded adaptive
    spin before a futex sleep, wake-ahead on at 4+ cores), wake-ahead off, and no spinning
    at all; each a fresh graph, twice, interleaved."""
    plan = _decode_plan()
    configs = [("defaults", {}), ("wake_ahead=0", {"wake_ahead": 0}),
               ("spin_us=0, wake_ahead=0", {"spin_us": 0, "wake_ahead": 0})]
    for label, kw in configs + configs:
        print(f"| cgc 2 stages, {label} | {_cgc_once(plan, **kw):,.0f} tokens/s |", flush=True)


def rounds(n: int = 3) -> None:
    """The floor (whole model, this process), the hand-written pipe on plain Ray actors and
    cgc's 2-stage decode, interleaved ``n`` times in one process run; medians and ratios."""
    import statistics

    import ray

    gpus = _ray_init()
    plan = _decode_plan()
    got: dict[str, list[float]] = defaultdict(list)
    for r in range(n):
        got["floor"].append(_floor_tokens())
        got["pipe"].append(_pipe_ray_once(gpus, None)[0])
        got["cgc"].append(_cgc_once(plan))
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in got.items()), flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"\n{SIZE}, batch {BATCH}, 2 microbatches; tokens/s, median of {n} interleaved rounds")
    print("| system | tokens/s (median) | rounds | ÷ floor | ÷ hand-written pipe |")
    print("|---|---|---|---|---|")
    names = {"floor": "floor: whole model, one process",
             "pipe": "hand-written pipe: 2 plain Ray actors, named pipes, host hand-offs",
             "cgc": "cgc: 2 stages (CUDA IPC), defaults"}
    for k in ("floor", "pipe", "cgc"):
        runs = ", ".join(f"{x:,.0f}" for x in got[k])
        print(f"| {names[k]} | {med[k]:,.0f} | {runs} | {med[k] / med['floor']:.2f}× | "
              f"{med[k] / med['pipe']:.2f}× |")
    ray.shutdown()


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
    # Medians, not means: the first executions (prefill, CUDA's lazy loading of kernels)
    # take tens of milliseconds and would dominate a mean over ~100 steps.
    print("| actor | op | count | median us | p90 us | mean us | total ms |")
    print("|---|---|---|---|---|---|---|")
    for (actor, cat, name), durs in sorted(spans.items()):
        q = sorted(durs)
        print(f"| {actor} | {cat} {name} | {len(q)} | {q[len(q) // 2]:,.0f} | "
              f"{q[min(len(q) - 1, int(0.9 * len(q)))]:,.0f} | {sum(q) / len(q):,.0f} | "
              f"{sum(q) / 1e3:,.1f} |")
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
        st.forward(x, 0, 8 + i % min(200, cfg["max_seq"] - 9)).cpu()
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
    gpus = _ray_init()
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
    import cgc

    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "run.json")
        with cgc.compile(dag, name="decode").start(trace=path) as g:
            tokens, dt = _timed_decode(g)
        print(f"\n{label}: 2 x {BATCH} sequences x {tokens} tokens in {dt:.3f} s "
              f"({2 * BATCH * tokens / dt:,.0f} tokens/s with tracing on)")
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
