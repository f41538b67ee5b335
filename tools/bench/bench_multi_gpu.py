"""GPUs of one host: cgc and Ray Compiled Graph side by side on the same Ray programs,
with raw NCCL send/recv as the ceiling (issues 13 and 14; targets from shared/ANCHORS.md).

    python tools/bench/bench_multi_gpu.py [--device cuda|cpu]
        [--parts hop,raw,overlap,pipeline,overlap3,pipeline4,grid] [--systems cgc,ray_cgraph]
        [--sizes 1K,1M,64M,1G] [--iters 200] [--executions 20] [--overlap-n 10000]
        [--stage-n 4096] [--inflight 4] [--inflight4 8] [--json PATH]

Every program is written once in Ray's DAG API over live actors (``num_gpus=1`` each, so
one per GPU) and run by each system on fresh actors, one system alive at a time:
``ray_cgraph`` is ``dag.experimental_compile()``, ``cgc`` is ``cgc.compile(dag).start()``.
The default parts are those the machine's GPUs allow (two GPUs: the first four).

Two GPUs (issue 13):

- ``hop``: A makes a tensor of ``size`` bytes on GPU 0 (made once per size), it travels to
  B on GPU 1 over NCCL (``with_tensor_transport(transport="nccl")``), B returns the sum of
  its first 8 bytes. ``execute`` -> ``get`` p50 per size, end to end, and GB/s at that p50;
  plus each system's set-up (compile and start; Ray's compile sets up its NCCL group) and
  its first execution.
- ``raw``: torch.distributed NCCL send/recv between two spawned processes, rank r on GPU r,
  back to back: µs per transfer and GB/s, the ceiling of ``hop`` (no actors, no driver).
- ``overlap``: Ray's documented overlap example folded onto two GPUs: A returns three
  ``n`` x ``n`` fp16 tensors (``--overlap-n``), B multiplies each by itself; ms per
  execution with communication overlap on and off (cgc ``overlap=``, Ray
  ``_overlap_gpu_communication=``).
- ``pipeline``: stage 0 on GPU 0 (an ``n`` x ``n`` fp16 product, ``--stage-n``), NCCL,
  stage 1 on GPU 1, a host value out; ``--inflight`` executions in flight; executions/s,
  overlap on and off.

Four GPUs (issue 14):

- ``overlap3``: Ray's overlap example as written: three senders, one tensor each, to one
  receiver that multiplies each; ms per execution, overlap on and off.
- ``pipeline4``: four stages, one per GPU, ``--inflight4`` executions in flight.
- ``grid``: 2 (pipeline) x 2 (tensor parallel), shaped like vLLM's: the input goes to both
  workers of stage 0, each computes half, an allreduce inside the stage, NCCL from each
  stage-0 worker to its stage-1 peer, the same in stage 1, both outputs to the driver.

Results are checked (hop: 8; overlap: each tensor's value and shape; pipelines: the value
the input's tensor is full of, which every stage keeps, within 1%, as fp16 GEMMs need), and
a wrong result is reported, not timed.
The closing table gives cgc ÷ Ray CG and the target per row.

``--device cpu`` runs the same programs on CPU tensors on a local Ray with four logical
GPUs: cgc binds its CPU communicator; Ray CG sends tensors by its default channels (it has
no NCCL without GPUs) and reduces with its ``CPUCommunicator``; raw uses gloo. Figures from
it say nothing; it checks this harness (``tests/test_bench_multi_gpu.py``) so that a device
call is not spent finding its bugs.

Example::

    python tools/bench/bench_multi_gpu.py --device cpu --sizes 1K --iters 5 --executions 3 \\
        --overlap-n 64 --stage-n 64
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PARTS = ("hop", "raw", "overlap", "pipeline", "overlap3", "pipeline4", "grid")
NEEDS = {"hop": 2, "raw": 2, "overlap": 2, "pipeline": 2, "overlap3": 4, "pipeline4": 4,
         "grid": 4}  # GPUs per part
CPU_GPUS = 4  # logical GPUs of the local Ray on --device cpu
SYSTEMS = ("cgc", "ray_cgraph")
HOP_BYTES = 8  # B sums the first 8 bytes of a tensor of ones
PIPE_VALUES = (1.0, 2.0, 3.0)  # what stage inputs are full of; each stage keeps the value
REL_TOL = 1e-2  # fp16 GEMMs may reduce in fp16: a stale or wrong tensor is off by >= 33%


# --------------------------------------------------------------------------- arguments

def parse_size(text: str) -> int:
    """``1K`` / ``1M`` / ``64M`` / ``1G`` / ``4096`` -> bytes (at least 8).

    Example:
        >>> parse_size("64M"), parse_size("1G"), parse_size("2048")
        (67108864, 1073741824, 2048)

    Raises:
        ValueError: not a size, or below 8 bytes (B reads 8).
    """
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    digits = t[:-1] if mult > 1 else t
    if not digits.isdigit():
        raise ValueError(f"size {text!r}: use e.g. 1K, 1M, 64M, 1G")
    n = int(digits) * mult
    if n < HOP_BYTES:
        raise ValueError(f"size {text!r}: at least {HOP_BYTES} bytes")
    return n


def fmt_size(n: int) -> str:
    """``1048576`` -> ``1 MiB``."""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see module doc).

    Raises:
        SystemExit: an unknown part or system, or a bad size (argparse's error).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--parts", default="", help="default: every part the GPUs allow")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--sizes", default="1K,1M,64M,1G")
    ap.add_argument("--iters", type=int, default=200, help="timed hops at <= 1 MiB")
    ap.add_argument("--executions", type=int, default=20, help="timed overlap executions")
    ap.add_argument("--pipeline-executions", type=int, default=200)
    ap.add_argument("--overlap-n", type=int, default=10000)
    ap.add_argument("--stage-n", type=int, default=4096)
    ap.add_argument("--inflight", type=int, default=4)
    ap.add_argument("--inflight4", type=int, default=8, help="executions in flight, pipeline4")
    ap.add_argument("--json", default="", help="also write every figure here")
    a = ap.parse_args(argv)
    a.part_list = [p.strip() for p in a.parts.split(",") if p.strip()]
    a.parts_given = bool(a.part_list)
    if not a.part_list:
        a.part_list = list(PARTS)  # narrowed to what the GPUs allow in run()
    a.system_list = [s.strip() for s in a.systems.split(",") if s.strip()]
    for got, known, what in ((a.part_list, PARTS, "--parts"), (a.system_list, SYSTEMS,
                                                                "--systems")):
        bad = [x for x in got if x not in known]
        if bad or not got:
            ap.error(f"{what}: choose from {', '.join(known)} (got {got})")
    try:
        a.size_list = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError as exc:
        ap.error(str(exc))
    if min(a.iters, a.executions, a.pipeline_executions, a.inflight, a.inflight4) < 1:
        ap.error("--iters, --executions, --pipeline-executions, --inflight and --inflight4 "
                 "must be >= 1")
    return a


def hop_iters(n: int, iters: int) -> int:
    """Timed hops for ``n`` bytes: ``iters`` up to 1 MiB, fewer for big tensors.

    Example:
        >>> hop_iters(1 << 10, 200), hop_iters(64 << 20, 200), hop_iters(1 << 30, 200)
        (200, 50, 10)
    """
    if n <= 1 << 20:
        return iters
    if n <= 64 << 20:
        return max(5, iters // 4)
    return max(3, iters // 20)


# --------------------------------------------------------------------------- results

@dataclass
class Figures:
    """Every figure of a run, keyed ``(part, case, system)``; wrong results by key."""

    values: dict[tuple[str, str, str], float] = field(default_factory=dict)
    wrong: dict[tuple[str, str, str], str] = field(default_factory=dict)
    failed: dict[tuple[str, str], str] = field(default_factory=dict)  # (part, system)
    skipped: dict[tuple[str, str], str] = field(default_factory=dict)

    def put(self, part: str, case: str, system: str, value: float) -> None:
        self.values[(part, case, system)] = value
        print(f"  {part} {case} [{system}]: {value:,.1f}", flush=True)


# (part, case, higher is better, target text, target check or None)
Row = tuple[str, str, bool, str, Callable[[Figures], bool | None] | None]


def _val(f: Figures, key: tuple[str, str, str]) -> float | None:
    """A figure, or None if it is missing or its result was wrong."""
    return None if key in f.wrong else f.values.get(key)


def _ratio(f: Figures, a: tuple[str, str, str], b: tuple[str, str, str]) -> float | None:
    x, y = _val(f, a), _val(f, b)
    return None if x is None or not y else x / y


def _meets(x: float | None, limit: float, higher: bool) -> bool | None:
    """``x`` at or above ``limit`` (``higher``) or at or below it; None without ``x``."""
    return None if x is None else (x >= limit if higher else x <= limit)


def _beats(f: Figures, part: str, case: str, higher: bool) -> bool | None:
    r = _ratio(f, (part, case, "cgc"), (part, case, "ray_cgraph"))
    return None if r is None else (r > 1 if higher else r < 1)


def rows_for(args: argparse.Namespace) -> list[Row]:
    """The table's rows for this run's parts and sizes, with the targets of ANCHORS.md."""
    out: list[Row] = []
    if "hop" in args.part_list:
        for n in args.size_list:
            s = fmt_size(n)
            out.append(("hop", f"{s} p50", False, "≤ 100 µs" if n == 1 << 20 else "",
                        (lambda f, s=s: _meets(_val(f, ("hop", f"{s} p50", "cgc")), 100.0,
                                               False)) if n == 1 << 20 else None))
            if n >= 64 << 20:
                out.append(("hop", f"{s} GB/s", True, "≥ 95% of raw" if n == 1 << 30 else "",
                            (lambda f, s=s: _meets(_ratio(f, ("hop", f"{s} GB/s", "cgc"),
                                                          ("raw", f"{s} GB/s", "raw")),
                                                   0.95, True)) if n == 1 << 30 else None))
        out.append(("hop", "set-up s", False, "≤ 0.5× Ray CG",
                    lambda f: _meets(_ratio(f, ("hop", "set-up s", "cgc"),
                                            ("hop", "set-up s", "ray_cgraph")), 0.5, False)))
        out.append(("hop", "first execution s", False, "", None))
    for part, case, higher, target, limit in (
            ("overlap", "overlap {} ms", False, "≤ 7.8 ms", 7.8),
            ("pipeline", "overlap {} exec/s", True, "≥ 3500/s", 3500.0)):
        if part in args.part_list:
            on = case.format("on")
            out.append((part, on, higher, target,
                        lambda f, p=part, c=on, h=higher, x=limit: _meets(
                            _val(f, (p, c, "cgc")), x, h)))
            out.append((part, case.format("off"), higher, "", None))
    # Issue 14's target for every 4-GPU run: beat Ray CG (the overlap example's compute
    # floor needs the one-GPU matmul time, printed by the part).
    for part, unit, higher in (("overlap3", "ms", False), ("pipeline4", "exec/s", True),
                               ("grid", "exec/s", True)):
        if part in args.part_list:
            cases = (["overlap on", "overlap off"] if part != "grid" else ["in flight"])
            for case in cases:
                name = f"{case} {unit}"
                out.append((part, name, higher, "beats Ray CG",
                            lambda f, p=part, n=name, h=higher: _beats(f, p, n, h)))
    return out


def table(f: Figures, args: argparse.Namespace) -> str:
    """The closing table: cgc, Ray CG and raw per row, cgc ÷ Ray CG, the target and
    whether cgc meets it (``-`` where a figure is missing; wrong results show as such).

    Example:
        >>> a = parse_args(["--parts", "pipeline"])
        >>> f = Figures({("pipeline", "overlap on exec/s", "cgc"): 4000.0,
        ...              ("pipeline", "overlap on exec/s", "ray_cgraph"): 1000.0})
        >>> print(table(f, a).splitlines()[2])
        | pipeline | overlap on exec/s | 4,000.0 | 1,000.0 | - | 4.00× | ≥ 3500/s | yes |
    """
    head = ("| part | case | cgc | Ray CG | raw | cgc ÷ Ray CG | target | met |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for part, case, higher, target, check in rows_for(args):
        cells = []
        for system in ("cgc", "ray_cgraph", "raw"):
            key = (part, case, system)
            if key in f.wrong:
                cells.append("WRONG")
            elif key in f.values:
                cells.append(f"{f.values[key]:,.1f}")
            elif system == "raw" and part == "hop" and case.endswith((" p50", " GB/s")):
                # the ceiling beside the hop: raw µs per transfer, or raw GB/s
                size, what = case.rsplit(" ", 1)
                raw = f.values.get(("raw", f"{size} {'GB/s' if what == 'GB/s' else 'µs/transfer'}",
                                    "raw"))
                cells.append("-" if raw is None else f"{raw:,.1f}")
            else:
                cells.append("-")
        r = _ratio(f, (part, case, "cgc"), (part, case, "ray_cgraph"))
        # "×" reads as "cgc is this many times better": time ratios are inverted.
        ratio = "-" if not r else f"{r if higher else 1 / r:.2f}×"
        met = check(f) if check is not None else None
        shown = "-" if met is None else ("yes" if met else "no")
        if args.device == "cpu" and target:
            shown = "(cpu)"
        lines.append(f"| {part} | {case} | {' | '.join(cells)} | {ratio} | {target} | {shown} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the programs

class Gpu:
    """One actor of every program (``ray.remote(num_gpus=1)`` is applied at run time)."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch, self.device = torch, device
        self.dtype = torch.float16 if device == "cuda" else torch.float32
        self.made: dict[int, Any] = {}
        self.ones: dict[int, Any] = {}

    def mk(self, n: int) -> Any:
        if n not in self.made:
            self.made[n] = self.torch.ones(n, dtype=self.torch.uint8, device=self.device)
        return self.made[n]

    def head(self, t: Any) -> int:
        return int(t[:HOP_BYTES].sum())

    def send(self, n: int, value: int) -> Any:
        return self.torch.ones((n, n), dtype=self.dtype, device=self.device) * value

    def matmul(self, t: Any) -> tuple[float, tuple[int, ...]]:
        self.torch.matmul(t, t)
        return float(t[0, 0]), tuple(t.shape)

    def stage(self, x: Any) -> Any:
        """An ``n`` x ``n`` product that keeps the value a tensor is full of: (x / n) @ 1."""
        if not isinstance(x, self.torch.Tensor):  # the first stage: its input's value
            n, v = x
            x = self.torch.full((n, n), v, dtype=self.dtype, device=self.device)
        n = x.shape[0]
        if n not in self.ones:
            self.ones[n] = self.torch.ones((n, n), dtype=self.dtype, device=self.device)
        return self.torch.matmul(x / n, self.ones[n])

    def half(self, x: Any) -> Any:
        """One tensor-parallel worker's share: half of ``stage``'s product (the stage's
        allreduce adds the two halves)."""
        return self.stage(x) * 0.5

    def sink(self, x: Any) -> float:
        return float(x[0, 0])


class _System:
    """One system's compiled program: ``execute(x)`` -> ref, ``get(ref)``, ``close()``."""

    def __init__(self, system: str, dag: Any, actors: list[Any], overlap: bool | None,
                 inflight: int | None) -> None:
        import ray

        self.system, self.actors, self._ray = system, actors, ray
        t = time.perf_counter()
        if system == "cgc":
            import cgc

            self.g = cgc.compile(dag, name="multi_gpu", overlap=overlap,
                                 capacity=inflight).start(get_timeout=300)
            self.execute: Callable[[Any], Any] = self.g.execute
            # a multi-output graph gives a list of refs (as Ray's does)
            self.get: Callable[[Any], Any] = (
                lambda ref: [r.get() for r in ref] if isinstance(ref, list) else ref.get())
        else:
            kw: dict[str, Any] = {}
            if overlap is not None:
                kw["_overlap_gpu_communication"] = overlap
            if inflight is not None:
                kw["_max_inflight_executions"] = inflight
            self.g = dag.experimental_compile(**kw)
            if not type(self.g).__module__.startswith("ray."):
                raise RuntimeError(f"Ray CG is not Ray's here ({type(self.g).__module__}): "
                                   "is cgc's drop-in installed in this process?")
            self.execute = self.g.execute
            self.get = ray.get
        self.setup_s = time.perf_counter() - t

    def close(self) -> None:
        if self.system == "cgc":
            try:
                self.g.teardown()
            finally:
                for h in self.actors:
                    self._ray.kill(h)
        else:
            # Kill first: Ray CG's teardown can hang after big tensors went through it
            # (ANCHORS.md); with its actors dead it returns.
            for h in self.actors:
                self._ray.kill(h)
            self.g.teardown()


def _actors(device: str, k: int) -> list[Any]:
    import ray

    cls = ray.remote(num_gpus=1, num_cpus=0)(Gpu)
    return [cls.remote(device) for _ in range(k)]


def _hinted(node: Any, system: str, device: str, **kw: Any) -> Any:
    """``node`` with the NCCL hint - except for Ray CG on ``--device cpu``: Ray has no NCCL
    without GPUs (and picks it for "auto" between GPU actors), so its tensors go by its
    default channels there; cgc binds its CPU communicator to the same hint."""
    if device == "cpu" and system == "ray_cgraph":
        return node
    return node.with_tensor_transport(transport="nccl", **kw)


def _compiled(system: str, dag: Any, actors: list[Any], overlap: bool | None,
              inflight: int | None, device: str) -> _System:
    """``_System(...)``; on failure the actors are killed (they hold a GPU each). Ray CG
    on ``--device cpu`` gets no overlap flag: its overlap path makes CUDA streams."""
    import ray

    if device == "cpu" and system == "ray_cgraph":
        overlap = None
    try:
        return _System(system, dag, actors, overlap, inflight)
    except BaseException:
        for h in actors:
            ray.kill(h)
        raise


def _hop(args: argparse.Namespace, system: str, f: Figures) -> None:
    from ray.dag import InputNode

    a, b = actors = _actors(args.device, 2)
    with InputNode() as inp:
        dag = b.head.bind(_hinted(a.mk.bind(inp), system, args.device))
    t0 = time.perf_counter()
    s = _compiled(system, dag, actors, None, None, args.device)
    try:
        first = s.get(s.execute(args.size_list[0]))
        f.put("hop", "set-up s", system, s.setup_s)
        f.put("hop", "first execution s", system, time.perf_counter() - t0)
        for n in args.size_list:
            case = fmt_size(n)
            for _ in range(3):  # warm-up (NCCL buffers, allocator) per size
                first = s.get(s.execute(n))
            if first != HOP_BYTES:
                f.wrong[("hop", f"{case} p50", system)] = f"B read {first!r}, not {HOP_BYTES}"
                continue
            lat = []
            for _ in range(hop_iters(n, args.iters)):
                t = time.perf_counter()
                got = s.get(s.execute(n))
                lat.append(time.perf_counter() - t)
                if got != HOP_BYTES:
                    f.wrong[("hop", f"{case} p50", system)] = f"B read {got!r}"
                    break
            else:
                p50 = statistics.median(lat)
                f.put("hop", f"{case} p50", system, p50 * 1e6)
                if n >= 64 << 20:
                    f.put("hop", f"{case} GB/s", system, n / p50 / 1e9)
    finally:
        s.close()


def _overlapped(args: argparse.Namespace, system: str, f: Figures, part: str,
                senders: int) -> None:
    """Three ``--overlap-n`` square tensors from ``senders`` actors (1: the folded example,
    3: Ray's as written) to one receiver that multiplies each; ms per execution."""
    from ray.dag import InputNode, MultiOutputNode

    n = args.overlap_n
    for on in (True, False):
        actors = _actors(args.device, senders + 1)
        src, b = actors[:-1], actors[-1]
        with InputNode() as inp:
            dag = MultiOutputNode([b.matmul.bind(_hinted(
                src[i % senders].send.bind(n, inp), system, args.device, _static_shape=True,
                _direct_return=True)) for i in range(3)])
        s = _compiled(system, dag, actors, on, None, args.device)
        key = (part, f"overlap {'on' if on else 'off'} ms", system)
        try:
            for i in range(3):
                s.get(s.execute(i))
            t = time.perf_counter()
            for i in range(args.executions):
                got = s.get(s.execute(i))
                if [(float(v), tuple(sh)) for v, sh in got] != [(float(i), (n, n))] * 3:
                    f.wrong[key] = f"execution {i}: {got!r}"
                    break
            else:
                f.put(*key, (time.perf_counter() - t) / args.executions * 1e3)
        finally:
            s.close()


def _overlap(args: argparse.Namespace, system: str, f: Figures) -> None:
    _overlapped(args, system, f, "overlap", 1)


def _overlap3(args: argparse.Namespace, system: str, f: Figures) -> None:
    _overlapped(args, system, f, "overlap3", 3)


def _staged(args: argparse.Namespace, system: str, f: Figures, part: str, stages: int,
            k: int) -> None:
    """``stages`` stages, one per GPU, NCCL between, ``k`` executions in flight;
    executions/s with overlap on and off."""
    from ray.dag import InputNode

    n = args.stage_n
    for on in (True, False):
        actors = _actors(args.device, stages)
        with InputNode() as inp:
            x = inp
            for a in actors[:-1]:
                x = _hinted(a.stage.bind(x), system, args.device)
            dag = actors[-1].sink.bind(actors[-1].stage.bind(x))
        s = _compiled(system, dag, actors, on, k, args.device)
        key = (part, f"overlap {'on' if on else 'off'} exec/s", system)
        try:
            _stream(f, key, s, n, args.pipeline_executions, k)
        finally:
            s.close()


def _pipeline(args: argparse.Namespace, system: str, f: Figures) -> None:
    _staged(args, system, f, "pipeline", 2, args.inflight)


def _pipeline4(args: argparse.Namespace, system: str, f: Figures) -> None:
    _staged(args, system, f, "pipeline4", 4, args.inflight4)


def _stream(f: Figures, key: tuple[str, str, str], s: _System, n: int, total: int, k: int,
            outputs: int = 0) -> None:
    """``total`` executions with ``k`` in flight, execution i's input full of
    ``PIPE_VALUES[i % 3]`` (``n`` x ``n``), each output checked to keep that value
    (``outputs``: a list of that many, else one); records executions/s or what was wrong."""
    def value(i: int) -> tuple[int, float]:
        return (n, PIPE_VALUES[i % len(PIPE_VALUES)])

    def want(i: int) -> Any:
        return [value(i)[1]] * outputs if outputs else value(i)[1]

    for i in range(k + 1):
        s.get(s.execute(value(i)))
    refs: list[tuple[int, Any]] = []
    bad = ""

    def check(j: int, got: Any) -> None:
        nonlocal bad
        if not _close(got, want(j)) and not bad:
            bad = f"execution {j}: {got!r}, not {want(j)!r}"

    t = time.perf_counter()
    for i in range(total):
        refs.append((i, s.execute(value(i))))
        if len(refs) >= k:
            j, r = refs.pop(0)
            check(j, s.get(r))
    for j, r in refs:
        check(j, s.get(r))
    if bad:
        f.wrong[key] = bad
    else:
        f.put(*key, total / (time.perf_counter() - t))


def _close(got: Any, want: Any) -> bool:
    """``got`` equals ``want`` within ``REL_TOL`` (floats, or lists of them).

    Example:
        >>> _close([2.001, 3.0], [2.0, 3.0]), _close(1.0, 2.0), _close([1.0], 1.0)
        (True, False, False)
    """
    if isinstance(want, list):
        return (isinstance(got, list) and len(got) == len(want)
                and all(_close(g, w) for g, w in zip(got, want, strict=True)))
    return isinstance(got, float) and abs(got - want) <= REL_TOL * abs(want)


def _grid(args: argparse.Namespace, system: str, f: Figures) -> None:
    """2 (pipeline) x 2 (tensor parallel): an allreduce inside each stage, NCCL between."""
    from ray.dag import InputNode, MultiOutputNode
    from ray.experimental.collective import allreduce

    n, k = args.stage_n, args.inflight
    actors = _actors(args.device, 4)
    stages = [actors[:2], actors[2:]]

    def reduce(nodes: list[Any], members: list[Any]) -> list[Any]:
        if args.device == "cpu" and system == "ray_cgraph":
            # Ray reduces with its test communicator without GPUs
            from ray.experimental.channel.cpu_communicator import CPUCommunicator

            return allreduce.bind(nodes, transport=CPUCommunicator(2, members))
        return allreduce.bind(nodes)

    with InputNode() as inp:
        halves = [w.half.bind(inp) for w in stages[0]]
        sums = reduce(halves, stages[0])
        halves = [w.half.bind(_hinted(x, system, args.device))
                  for w, x in zip(stages[1], sums, strict=True)]
        sums = reduce(halves, stages[1])
        dag = MultiOutputNode([w.sink.bind(x) for w, x in zip(stages[1], sums, strict=True)])
    s = _compiled(system, dag, actors, None, k, args.device)
    key = ("grid", "in flight exec/s", system)
    try:
        _stream(f, key, s, n, args.pipeline_executions, k, outputs=2)
    finally:
        s.close()


# --------------------------------------------------------------------------- raw NCCL

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _raw_rank(rank: int, port: int, device: str, sizes: list[int], iters: int,
              q: Any) -> None:
    """One rank of the raw send/recv loop (rank 1 reports µs per transfer per size)."""
    import torch
    import torch.distributed as dist

    try:
        if device == "cuda":
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if device == "cuda" else "gloo",
                                init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2)
        for n in sizes:
            t = torch.ones(n, dtype=torch.uint8, device=device)
            reps = hop_iters(n, iters)
            for i in range(reps + 5):
                if i == 5:
                    if device == "cuda":
                        torch.cuda.synchronize()
                    dist.barrier()
                    t0 = time.perf_counter()
                if rank == 0:
                    dist.send(t, 1)
                else:
                    dist.recv(t, 0)
            if device == "cuda":
                torch.cuda.synchronize()
            if rank == 1:
                q.put(("ok", n, (time.perf_counter() - t0) / reps))
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported to the driver
        q.put(("err", rank, f"{type(exc).__name__}: {exc}"))


def _raw(args: argparse.Namespace, f: Figures) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_raw_rank, args=(r, port, args.device, args.size_list,
                                                 args.iters, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        for _ in args.size_list:
            msg = q.get(timeout=600)
            if msg[0] == "err":
                raise RuntimeError(f"raw rank {msg[1]}: {msg[2]}")
            _, n, dt = msg
            f.put("raw", f"{fmt_size(n)} µs/transfer", "raw", dt * 1e6)
            f.put("raw", f"{fmt_size(n)} GB/s", "raw", n / dt / 1e9)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()


# --------------------------------------------------------------------------- driver

def run(args: argparse.Namespace) -> Figures:
    """Every part for every system (one system alive at a time); returns the figures.

    Raises:
        RuntimeError: ``--device cuda`` with fewer than two GPUs.
    """
    import ray

    f = Figures()
    gpus = CPU_GPUS
    if args.device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        if gpus < 2:
            raise RuntimeError(f"--device cuda needs 2 GPUs, this machine has {gpus}")
    for part in list(args.part_list):
        if NEEDS[part] > gpus:
            if args.parts_given:
                f.failed[(part, "-")] = f"needs {NEEDS[part]} GPUs, this machine has {gpus}"
            else:
                print(f"{part}: not run, needs {NEEDS[part]} GPUs (this machine has {gpus})")
            args.part_list.remove(part)
    if "raw" in args.part_list:
        print("raw send/recv (torch.distributed):", flush=True)
        try:
            _raw(args, f)
        except RuntimeError as exc:
            f.failed[("raw", "raw")] = str(exc)
            print(f"  raw: FAILED {exc}", flush=True)
    started = not ray.is_initialized() and bool(set(args.part_list) - {"raw"})
    if started:
        # Logical GPUs on a machine without them (--device cpu): actors still ask one each,
        # as the programs are written for GPUs.
        ray.init(address="local", num_gpus=None if args.device == "cuda" else CPU_GPUS,
                 include_dashboard=False, log_to_driver=False)
    try:
        for part, fn in (("hop", _hop), ("overlap", _overlap), ("pipeline", _pipeline),
                         ("overlap3", _overlap3), ("pipeline4", _pipeline4), ("grid", _grid)):
            if part not in args.part_list:
                continue
            for system in args.system_list:
                print(f"{part} [{system}]:", flush=True)
                if (part, system, args.device) == ("grid", "ray_cgraph", "cpu"):
                    # Ray CG makes an NCCL group for a collective's output sent to another
                    # actor even when the collectives use its CPUCommunicator: no cupy here
                    f.skipped[(part, system)] = "Ray CG needs NCCL for this graph (GPUs)"
                    print(f"  skipped: {f.skipped[(part, system)]}", flush=True)
                    continue
                try:
                    fn(args, system, f)
                except Exception as exc:  # noqa: BLE001 - one failed part, the rest goes on
                    f.failed[(part, system)] = f"{type(exc).__name__}: {exc}"
                    print(f"  {part} [{system}]: FAILED {type(exc).__name__}: {exc}",
                          flush=True)
    finally:
        if started:
            ray.shutdown()
    return f


def main(argv: list[str] | None = None) -> Figures:
    args = parse_args(argv)
    f = run(args)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": args.device,
                       "values": {" | ".join(k): v for k, v in sorted(f.values.items())},
                       "wrong": {" | ".join(k): v for k, v in sorted(f.wrong.items())},
                       "failed": {" | ".join(k): v for k, v in sorted(f.failed.items())},
                       "skipped": {" | ".join(k): v for k, v in sorted(f.skipped.items())}},
                      out, indent=1)
    for (part, system), why in sorted(f.skipped.items()):
        print(f"{part} [{system}]: skipped, {why}")
    for (part, system), why in sorted(f.failed.items()):
        print(f"{part} [{system}]: FAILED {why.splitlines()[0] if why else ''}")
    for key, why in sorted(f.wrong.items()):
        print(f"{' '.join(key)}: WRONG {why}")
    print()
    print(table(f, args))
    return f


if __name__ == "__main__":
    import ray_leftovers  # Ray CG's named semaphores of our Ray go at exit

    ray_leftovers.install()
    sys.exit(1 if main().failed else 0)
