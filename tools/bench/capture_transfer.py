"""Transfers inside CUDA graphs between two processes on one GPU (issue 24 item 3): measured.

    python tools/bench/capture_transfer.py [--device cuda|cpu] [--dry] [--sizes 16K,1M,16M]
        [--variants ipc-eager,ipc-memop-eager,ipc-memop-graph,ipc-memop-graph-nowait,
                    nccl-eager,nccl-graph] [--iters 300] [--nccl-iters 60] [--warmup 20]
        [--rounds 2] [--slots 2] [--batch 4] [--matmuls 4] [--gpus 1|2] [--json PATH]

Two processes (``multiprocessing`` spawn, not Ray: the mechanism alone), W (stage 0) and R
(stage 1), share GPU 0. A step is: W computes (``--matmuls`` products of a
``--batch`` x 768 activation with a 768 x 768 weight, fp16) and fills the payload
(``size`` bytes of int32 ``base + 7 * step``, the step counter a device tensor), the
payload moves to R, R checks it against its own device step counter (mismatches are
summed in a device tensor: no host round trip) and computes the same products. So a
transfer that reads a slot too early, or an old one, shows as a wrong value.

Variants (same call, interleaved per round):

- ``ipc-eager``: today's cgc. Compute replayed as CUDA graphs (like ``CapturedCall``); the
  transfer eager: W copies into a ``cudaMalloc``'d slot exported by CUDA IPC, records an
  interprocess event and sends a header (a pipe message) per step; R waits the event on
  its stream, copies out, records its own event for slot reuse and (pipelined) sends an
  acknowledgement; W waits that event before it reuses the slot.
- ``ipc-memop-eager``: compute graphs, transfer ordered by stream memory operations on a
  flag word per slot in exported device memory (``capture_transfer_scheme``), eager; no
  pipe message per step.
- ``ipc-memop-graph``: the whole step captured on each side, one graph per slot: W
  (compute, wait flag FREE, copy in, write FULL), R (wait FULL, copy out, write FREE,
  check + compute). Per step: one replay per side, nothing else.
- ``ipc-memop-graph-nowait``: a control. R's graph omits its wait FULL (R is gated on the
  host by a message W sends as it launches the step, and W's graph delays its copy by
  ~1 ms); it must come out wrong: the check catches a missing device order. Lockstep only.
- ``nccl-eager`` / ``nccl-graph``: ncclSend/ncclRecv through cgc's ctypes binding
  (``cgc.runtime.comm.nccl_lib``), the transfer eager or captured with the compute. With
  ``--gpus 1`` (default) both ranks share GPU 0 in cgc's fake-hosts test mode
  (``testing.fake_hosts.fake_host_env``: sockets; slow, says nothing of NVLink); ``--gpus 2`` puts
  rank r on GPU r with NCCL's own transport (NVLink/P2P) - the run that decides whether
  NCCL transfers belong inside the runtime's captured regions. IPC variants share one GPU
  by definition, so ``--gpus 2`` takes NCCL variants only; ``nccl-eager`` is then the
  table's baseline.

Two timings per variant and size: *lockstep* (W stamps, launches step n, waits for R's
"done"; R runs step n, synchronizes, stamps, sends "done": per-step latency, p50) and
*pipelined* (each side launches its steps back to back, bounded by the slots; wall time
from W's first launch to R's last completion over the steps). A variant and size that
gave any wrong value is reported as wrong and not timed. The table is printed last.

``--device cpu`` runs the same two processes with shared-memory slots, synchronous copies
and host-spinning flags (no NCCL): the harness and the scheme, not GPU figures.
``--dry`` runs no processes: the scheme's model checker (``simulate``) and the table.

Example::

    python tools/bench/capture_transfer.py --device cpu --sizes 16K --iters 50 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from capture_transfer_scheme import reader_program, simulate, writer_program  # noqa: E402

VARIANTS = ("ipc-eager", "ipc-memop-eager", "ipc-memop-graph", "ipc-memop-graph-nowait",
            "nccl-eager", "nccl-graph")
CONTROLS = ("ipc-memop-graph-nowait",)  # must come out wrong
BASELINE = "ipc-eager"
MODES = ("lockstep", "pipelined")
D_MODEL = 768


def parse_size(text: str) -> int:
    """``16K`` / ``1M`` / ``4096`` -> bytes (a multiple of 4).

    Example:
        >>> parse_size("16K"), parse_size("1M")
        (16384, 1048576)

    Raises:
        ValueError: not a size, or not a multiple of 4 bytes.
    """
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    n = int(t[:-1] if mult > 1 else t) * mult
    if n <= 0 or n % 4:
        raise ValueError(f"size {text!r}: a positive multiple of 4 bytes")
    return n


def fmt_size(n: int) -> str:
    for unit, s in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {s}"
    return f"{n} B"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see module doc).

    Raises:
        SystemExit: an unknown variant or a bad size (argparse's error).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dry", action="store_true", help="no processes: model check + table")
    ap.add_argument("--sizes", default="16K,1M,16M")
    ap.add_argument("--variants", default="",
                    help="default: all (--gpus 1), the NCCL ones (--gpus 2)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--iters", type=int, default=300, help="timed steps per job (IPC)")
    ap.add_argument("--nccl-iters", type=int, default=60, help="timed steps per job (NCCL)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="jobs per variant, interleaved")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--matmuls", type=int, default=4)
    ap.add_argument("--job-timeout", type=float, default=60.0)
    ap.add_argument("--gpus", type=int, choices=(1, 2), default=1,
                    help="2: rank r on GPU r, NCCL variants only (its real transport)")
    ap.add_argument("--json", default="", help="write every sample here")
    a = ap.parse_args(argv)
    try:
        a.size_list = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError as exc:
        ap.error(str(exc))
    nccl = [v for v in VARIANTS if v.startswith("nccl")]
    default = VARIANTS if a.gpus == 1 else nccl
    a.variant_list = [v.strip() for v in a.variants.split(",") if v.strip()] or list(default)
    bad = [v for v in a.variant_list if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    if a.gpus == 2 and set(a.variant_list) - set(nccl):
        ap.error(f"--gpus 2 runs {' and '.join(nccl)} only (IPC variants share one GPU)")
    if a.gpus == 2 and a.device != "cuda":
        ap.error("--gpus 2 needs --device cuda")
    a.baseline = BASELINE if a.gpus == 1 else "nccl-eager"
    a.mode_list = [m.strip() for m in a.modes.split(",") if m.strip()]
    if any(m not in MODES for m in a.mode_list):
        ap.error(f"--modes: choose from {', '.join(MODES)}")
    if a.slots < 1 or a.iters < 1 or a.warmup < 0:
        ap.error("--slots and --iters must be >= 1, --warmup >= 0")
    return a


# --------------------------------------------------------------------------- results

@dataclass
class Cell:
    """Every job of one (variant, size): samples, correctness, the first error."""

    lat_us: list[float] = field(default_factory=list)  # lockstep per-step latencies
    pipe_us: list[float] = field(default_factory=list)  # pipelined µs/step, one per job
    jobs: int = 0
    wrong: list[str] = field(default_factory=list)
    error: str = ""
    skip: str = ""  # not run here, and why

    @property
    def correct(self) -> bool | None:
        if self.error or not self.jobs:
            return None
        return not self.wrong


def _p50(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def table(cells: dict[tuple[str, int], Cell], variants: list[str], sizes: list[int],
          baseline: str = BASELINE) -> str:
    """The closing table: p50 lockstep µs/step, pipelined µs/step, both ÷ ``baseline``
    (default ``ipc-eager``) at the same size, and correctness; wrong or failed cells show
    no time.

    Example:
        >>> c = {("ipc-eager", 16): Cell([10.0, 12.0], [5.0], 1),
        ...      ("ipc-memop-graph", 16): Cell([5.5], [2.5], 1)}
        >>> print(table(c, ["ipc-eager", "ipc-memop-graph"], [16]))  # doctest: +NORMALIZE_WHITESPACE
        | variant | size | lockstep p50 µs | ÷ ipc-eager | pipelined µs/step | ÷ ipc-eager | correct |
        |---|---|---|---|---|---|---|
        | ipc-eager | 16 B | 11.0 | 1.00 | 5.0 | 1.00 | yes |
        | ipc-memop-graph | 16 B | 5.5 | 0.50 | 2.5 | 0.50 | yes |
    """
    head = (f"| variant | size | lockstep p50 µs | ÷ {baseline} | pipelined µs/step | "
            f"÷ {baseline} | correct |\n|---|---|---|---|---|---|---|")
    rows = [head]
    for size in sizes:
        base = cells.get((baseline, size))
        base_ok = base is not None and base.correct
        b_lat = _p50(base.lat_us) if base_ok else None
        b_pipe = _p50(base.pipe_us) if base_ok else None
        for v in variants:
            c = cells.get((v, size))
            if c is None:
                continue
            ok = c.correct
            lat = _p50(c.lat_us) if ok else None
            pipe = _p50(c.pipe_us) if ok else None

            def num(x: float | None) -> str:
                return "-" if x is None else f"{x:.1f}"

            def ratio(x: float | None, b: float | None) -> str:
                return "-" if x is None or not b else f"{x / b:.2f}"

            verdict = {True: "yes", False: "no", None: "failed" if c.error else "not run"}[ok]
            if v in CONTROLS and ok is False:
                verdict = "no (control: expected)"
            rows.append(f"| {v} | {fmt_size(size)} | {num(lat)} | {ratio(lat, b_lat)} | "
                        f"{num(pipe)} | {ratio(pipe, b_pipe)} | {verdict} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- worker side

class Work:
    """One side's tensors for one payload size, and its compute (see module doc)."""

    def __init__(self, torch: Any, device: str, rank: int, size: int, batch: int,
                 matmuls: int) -> None:
        self.torch, self.size, self.matmuls = torch, size, matmuls
        dtype = torch.float16 if device == "cuda" else torch.float32
        g = torch.Generator().manual_seed(1 + rank)
        self.x = torch.randn(batch, D_MODEL, generator=g).to(device, dtype)
        self.w = (torch.randn(D_MODEL, D_MODEL, generator=g) / D_MODEL ** 0.5).to(device, dtype)
        self.h = torch.empty_like(self.x)
        words = size // 4
        self.base = torch.arange(words, dtype=torch.int32, device=device)
        self.buf = torch.zeros(words, dtype=torch.int32, device=device)  # W: payload; R: received
        self.expect = torch.zeros_like(self.buf)
        self.ctr = torch.zeros(1, dtype=torch.int32, device=device)
        self.err = torch.zeros(1, dtype=torch.int64, device=device)

    def compute(self) -> None:
        h = self.x
        for _ in range(self.matmuls):
            h = h @ self.w
        self.h.copy_(h)

    def produce(self) -> None:
        self.compute()
        self.torch.add(self.base, self.ctr, alpha=7, out=self.buf)
        self.ctr.add_(1)

    def consume(self) -> None:
        torch = self.torch
        torch.add(self.base, self.ctr, alpha=7, out=self.expect)
        self.err.add_(torch.ne(self.buf, self.expect).sum())
        self.ctr.add_(1)
        self.compute()

    def reset(self) -> None:
        self.ctr.zero_()
        self.err.zero_()


class Side:
    """W (rank 0) or R (rank 1): runs jobs the driver sends (see module doc)."""

    def __init__(self, rank: int, peer: Any, opts: dict[str, Any]) -> None:
        import torch
        from capture_transfer_devices import make_device

        self.torch, self.rank, self.peer, self.o = torch, rank, peer, opts
        self.gpu = rank if opts["gpus"] == 2 else 0
        self.dev = make_device(opts["device"], opts["prefix"], rank, self.gpu)
        self.works: dict[int, Work] = {}
        self.compute_graphs: dict[int, tuple[Any, Any]] = {}
        self.steps: dict[tuple[str, int], Any] = {}
        self.nccl: Any = None
        self.acked = -1
        self.mode = "lockstep"

    # -- messages on the W<->R pipe ------------------------------------------------
    def _recv(self, kind: str) -> tuple:
        """The next message of ``kind`` from the peer; acknowledgements met on the way
        ("a" / "d": R's copy of step n is done) advance ``acked``."""
        while True:
            msg = self.peer.recv()
            if msg[0] in ("a", "d"):
                self.acked = max(self.acked, msg[1])
                if kind in ("a", "d"):
                    return msg
                continue
            if msg[0] != kind:
                raise RuntimeError(f"rank {self.rank}: expected {kind!r}, got {msg!r}")
            return msg

    def wait_acked(self, n: int) -> None:
        while self.acked < n:
            self._recv("a")

    # -- set-up --------------------------------------------------------------------
    def work(self, size: int) -> Work:
        if size not in self.works:
            self.works[size] = Work(self.torch, self.dev.tensor_device(), self.rank, size,
                                    self.o["batch"], self.o["matmuls"])
        return self.works[size]

    def compute_graph(self, size: int) -> tuple[Any, Any]:
        """This side's compute (W: produce, R: consume) replayed as a graph (eager variants:
        what ``CapturedCall`` does for a captured method today)."""
        if size not in self.compute_graphs:
            w = self.work(size)
            fn = w.produce if self.rank == 0 else w.consume
            for _ in range(3):  # libraries set up handles and workspaces before capture
                fn()
            self.dev.sync()
            self.compute_graphs[size] = (fn, self.dev.capture(fn))
        return self.compute_graphs[size]

    def _slots(self, size: int, with_events: bool, with_flags: bool) -> dict[str, Any]:
        """Exchange ``slots`` exported buffers (+ events both ways, + a flag word per slot)."""
        dev, S = self.dev, self.o["slots"]  # noqa: N806
        if self.rank == 0:
            bufs = [dev.alloc(size) for _ in range(S)]
            evs = [dev.new_event() for _ in range(S)] if with_events else []
            flags = dev.alloc(4 * S) if with_flags else (0, b"")
            self.peer.send(("hello", [h for _, h in bufs], [h for _, h in evs], flags[1]))
            _, peer_evs = self._recv("hello-ack")
            return {"slot": [p for p, _ in bufs], "own": [e for e, _ in evs],
                    "peer_ev": [dev.open_event(h) for h in peer_evs], "flag": flags[0]}
        _, bh, eh, fh = self._recv("hello")
        own = [dev.new_event() for _ in eh]
        self.peer.send(("hello-ack", [h for _, h in own]))
        return {"slot": [dev.open(h) for h in bh], "own": [e for e, _ in own],
                "peer_ev": [dev.open_event(h) for h in eh],
                "flag": dev.open(fh) if with_flags else 0}

    def _run_ops(self, ops: list[tuple], st: dict[str, Any], w: Work, produce: Any,
                 consume: Any) -> None:
        dev, ptr, size = self.dev, w.buf.data_ptr(), w.size
        for op in ops:
            kind = op[0]
            if kind == "produce":
                produce()
            elif kind == "delay":
                dev.delay()
            elif kind == "consume":
                consume()
            elif kind == "wait":
                dev.flag_wait(st["flag"] + 4 * op[1], op[2])
            elif kind == "write":
                dev.flag_write(st["flag"] + 4 * op[1], op[2])
            elif kind == "copy_in":
                dev.copy(st["slot"][op[1]], ptr, size)
            elif kind == "copy_out":
                dev.copy(ptr, st["slot"][op[1]], size)
            else:
                raise ValueError(f"unknown op {op!r}")

    def setup(self, variant: str, size: int) -> Any:
        """The step function ``step(n)`` of ``variant`` at ``size`` (made once)."""
        key = (variant, size)
        if key in self.steps:
            return self.steps[key]
        w, dev, S, W = self.work(size), self.dev, self.o["slots"], self.rank == 0  # noqa: N806
        fn, graph = self.compute_graph(size)
        if variant == "ipc-eager":
            st = self._slots(size, with_events=True, with_flags=False)

            def step(n: int) -> None:
                k = n % S
                if W:
                    graph()
                    if n >= S:  # R's copy out of slot k (use n - S) is done
                        self.wait_acked(n - S)
                        dev.wait_event(st["peer_ev"][k])
                    dev.copy(st["slot"][k], w.buf.data_ptr(), size)
                    dev.record(st["own"][k])
                    self.peer.send(("h", n, k))  # the header
                else:
                    msg = self._recv("h")
                    if msg[1:] != (n, k):
                        raise RuntimeError(f"header {msg!r} at step {n}")
                    dev.wait_event(st["peer_ev"][k])
                    dev.copy(w.buf.data_ptr(), st["slot"][k], size)
                    dev.record(st["own"][k])
                    if self.mode == "pipelined":
                        self.peer.send(("a", n))
                    graph()
        elif variant.startswith("ipc-memop"):
            st = self._slots(size, with_events=False, with_flags=True)
            nowait = variant.endswith("-nowait")
            progs = [writer_program(k) if W else reader_program(k, wait_full=not nowait)
                     for k in range(S)]
            if nowait and W:  # the control: W's copy lands late, so a missing order shows
                progs = [p[:1] + [("delay",)] + p[1:] for p in progs]
            if variant == "ipc-memop-eager":
                def step(n: int) -> None:
                    self._run_ops(progs[n % S], st, w, graph, graph)
            else:  # the whole step in one graph per slot
                graphs = [dev.capture(lambda p=p: self._run_ops(p, st, w, fn, fn))
                          for p in progs]

                def step(n: int) -> None:
                    if nowait:  # R has no device wait: the host gates it, so it can't run
                        if W:   # ahead and leave W waiting for a FREE that never comes
                            self.peer.send(("h", n, n % S))
                        else:
                            self._recv("h")
                    graphs[n % S]()
        elif variant.startswith("nccl"):
            send_recv = self._nccl_op(w)
            send_recv()  # NCCL connects lazily: one uncaptured transfer before capture
            fn()
            dev.sync()
            if variant == "nccl-eager":
                def step(n: int) -> None:
                    if W:
                        graph()
                        send_recv()
                    else:
                        send_recv()
                        graph()
            else:
                def whole() -> None:
                    if W:
                        fn()
                        send_recv()
                    else:
                        send_recv()
                        fn()
                g = dev.capture(whole)

                def step(n: int) -> None:
                    g()
        else:
            raise ValueError(f"unknown variant {variant!r}")
        self.steps[key] = step
        return step

    def _nccl_op(self, w: Work) -> Any:
        if self.dev.kind != "cuda":
            raise RuntimeError("NCCL variants need --device cuda")
        from cgc.runtime.comm.nccl_lib import UINT8, nccl_lib

        if self.nccl is None:
            lib = nccl_lib("ctypes")
            if self.rank == 0:
                uid = lib.unique_id()
                self.peer.send(("uid", uid))
            else:
                uid = self._recv("uid")[1]
            h = lib.init(2, uid, self.rank, deadline=time.monotonic() + 120,
                         device=self.gpu)
            self.nccl = (lib, h)
        lib, h = self.nccl
        torch, peer = self.torch, 1 - self.rank

        def op() -> None:
            s = torch.cuda.current_stream().cuda_stream
            lib.group_start()
            if self.rank == 0:
                lib.send(h, w.buf.data_ptr(), w.size, UINT8, peer, s)
            else:
                lib.recv(h, w.buf.data_ptr(), w.size, UINT8, peer, s)
            lib.group_end(h)
        return op

    # -- one job ---------------------------------------------------------------------
    def job(self, variant: str, size: int, mode: str, iters: int, warmup: int) -> dict:
        step = self.setup(variant, size)
        w, dev = self.work(size), self.dev
        self.mode, self.acked = mode, -1
        w.reset()
        dev.sync()
        total, out = warmup + iters, {}
        if mode == "lockstep":
            stamps = []
            if self.rank == 0:
                self._recv("b")
                for n in range(total):
                    t = time.perf_counter()
                    step(n)
                    self.wait_acked(n)
                    stamps.append(t)
            else:
                self.peer.send(("b",))
                for n in range(total):
                    step(n)
                    dev.sync()
                    stamps.append(time.perf_counter())
                    self.peer.send(("d", n))
            out["stamps"] = stamps[warmup:]
        else:
            if self.rank == 0:
                self._recv("b")
                for n in range(warmup):
                    step(n)
                dev.sync()
                self._recv("b2")
                out["t_start"] = time.perf_counter()
                for n in range(warmup, total):
                    step(n)
                dev.sync()
                if variant == "ipc-eager":
                    self.wait_acked(total - 1)  # drain: no acknowledgement left in the pipe
            else:
                self.peer.send(("b",))
                for n in range(warmup):
                    step(n)
                dev.sync()
                self.peer.send(("b2",))
                for n in range(warmup, total):
                    step(n)
                dev.sync()
                out["t_end"] = time.perf_counter()
        dev.sync()
        out["ctr"], out["err"] = int(w.ctr.item()), int(w.err.item())
        return out


def _worker(rank: int, ctl: Any, peer: Any, opts: dict[str, Any]) -> None:
    """A W or R process: set the NCCL environment first, then serve the driver's jobs."""
    if opts["nccl"] and opts["gpus"] == 1:  # two ranks on one GPU: NCCL's test mode
        from cgc.runtime.comm.testing.fake_hosts import fake_host_env

        os.environ.update(fake_host_env(f"capxfer-{rank}"))
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    try:
        side = Side(rank, peer, opts)
        ctx = side.torch.cuda.stream(side.dev.stream) if opts["device"] == "cuda" else None
        if ctx is not None:
            ctx.__enter__()
        ctl.send(("ok", side.dev.info()))
    except Exception:  # noqa: BLE001 - reported to the driver, which prints it
        ctl.send(("err", traceback.format_exc(limit=4)))
        return
    while True:
        msg = ctl.recv()
        if msg[0] == "stop":
            break
        try:
            if msg[0] == "nccl-version":
                from cgc.runtime.comm.nccl_lib import nccl_lib

                ctl.send(("ok", nccl_lib("ctypes").version()))
                continue
            ctl.send(("ok", side.job(*msg[1:])))
        except Exception:  # noqa: BLE001 - reported to the driver; it restarts the pair
            ctl.send(("err", traceback.format_exc(limit=6)))
    side.dev.release()


# --------------------------------------------------------------------------- driver

class Pair:
    """The two worker processes and their pipes; restarted after a failed job."""

    def __init__(self, opts: dict[str, Any], timeout: float) -> None:
        self.opts, self.timeout = opts, timeout
        self.procs: list[Any] = []
        self.ctls: list[Any] = []
        self.info: dict[str, Any] = {}

    def start(self) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        pw, pr = ctx.Pipe()
        self.opts["prefix"] = f"cgcx{uuid.uuid4().hex[:8]}-"
        self.ctls, self.procs = [], []
        for rank, peer in ((0, pw), (1, pr)):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(rank, theirs, peer, self.opts), daemon=True)
            p.start()
            self.ctls.append(mine)
            self.procs.append(p)
        infos = self._collect(120.0)
        self.info = infos[0]

    def _collect(self, timeout: float) -> list[Any]:
        from multiprocessing.connection import wait

        got: dict[int, Any] = {}
        end = time.monotonic() + timeout
        while len(got) < 2:
            left = end - time.monotonic()
            ready = wait([c for i, c in enumerate(self.ctls) if i not in got], max(left, 0))
            if not ready:
                raise RuntimeError(f"timed out after {timeout:.0f} s (a side is blocked)")
            for c in ready:
                i = self.ctls.index(c)
                try:
                    status, val = c.recv()
                except EOFError:
                    raise RuntimeError(f"rank {i} died (exit code "
                                       f"{self.procs[i].exitcode})") from None
                if status == "err":
                    raise RuntimeError(f"rank {i}: {val}")
                got[i] = val
        return [got[0], got[1]]

    def ask(self, msg: tuple, timeout: float | None = None) -> list[Any]:
        for c in self.ctls:
            c.send(msg)
        return self._collect(timeout or self.timeout)

    def ask_w(self, msg: tuple) -> Any:
        self.ctls[0].send(msg)
        status, val = self.ctls[0].recv()
        if status == "err":
            raise RuntimeError(val)
        return val

    def stop(self, kill: bool = False) -> None:
        for c in self.ctls:
            try:
                if not kill:
                    c.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
        for p in self.procs:
            p.join(0 if kill else 10)
            if p.is_alive():
                p.kill()  # one of the two processes this driver started, by its handle
                p.join(5)
        self.procs, self.ctls = [], []


def dry(args: argparse.Namespace) -> dict[tuple[str, int], Cell]:
    """Model-check the flag scheme (and its two broken controls); return empty cells."""
    print("model check of the fixed-value flag scheme (random interleavings, torn copies):")
    for s in (1, 2, 3):
        rs = [simulate(s, 60, random.Random(seed)) for seed in range(200)]
        print(f"  slots={s}: {sum(r.ok for r in rs)}/200 schedules correct, "
              f"{sum(r.reads for r in rs)} reads checked")
    for name, kw in (("reader without wait FULL", {"reader": lambda k: reader_program(
            k, wait_full=False)}), ("writer without wait FREE", {"writer": lambda k:
                                                                 writer_program(k, wait_free=False)})):
        rs = [simulate(args.slots, 60, random.Random(seed), **kw) for seed in range(200)]
        print(f"  control, {name}: {sum(bool(r.errors) for r in rs)}/200 schedules caught "
              "a wrong read")
    return {(v, s): Cell() for s in args.size_list for v in args.variant_list}


def run(args: argparse.Namespace) -> dict[tuple[str, int], Cell]:
    """Every job, interleaved per round; returns the cells for ``table``."""
    variants = [v for v in args.variant_list
                if not (v.startswith("nccl") and args.device != "cuda")]
    opts = {"device": args.device, "slots": args.slots, "batch": args.batch,
            "matmuls": args.matmuls, "nccl": any(v.startswith("nccl") for v in variants),
            "gpus": args.gpus}
    cells = {(v, s): Cell() for s in args.size_list for v in args.variant_list}
    for v in args.variant_list:
        if v not in variants:
            for s in args.size_list:
                cells[(v, s)].skip = "NCCL variants need --device cuda"
    pair = Pair(opts, args.job_timeout)
    pair.start()
    print("device:", json.dumps(pair.info))
    if opts["nccl"]:
        try:
            print("NCCL (cgc ctypes binding):", pair.ask_w(("nccl-version",)))
        except RuntimeError as exc:
            print("NCCL binding failed:", str(exc).strip().splitlines()[-1])
    for size in args.size_list:
        for rnd in range(args.rounds):
            for v in variants:
                cell = cells[(v, size)]
                for mode in args.mode_list:
                    if cell.error or cell.skip or (v in CONTROLS and mode != "lockstep"):
                        continue
                    iters = args.nccl_iters if v.startswith("nccl") else args.iters
                    t = time.monotonic()
                    try:
                        rw, rr = pair.ask(("job", v, size, mode, iters, args.warmup))
                    except RuntimeError as exc:
                        cell.error = str(exc).strip()
                        print(f"  {v} {fmt_size(size)} {mode}: FAILED\n{cell.error}")
                        for s in args.size_list:  # a failure (often a hang) costs a restart:
                            if s > size:          # the larger sizes of it are not tried
                                cells[(v, s)].skip = f"failed at {fmt_size(size)}"
                        pair.stop(kill=True)
                        pair.start()
                        continue
                    cell.jobs += 1
                    total = iters + args.warmup
                    if rr["err"] or rr["ctr"] != total or rw["ctr"] != total:
                        cell.wrong.append(f"{mode}: {rr['err']} wrong words, steps W "
                                          f"{rw['ctr']} R {rr['ctr']} of {total}")
                    if mode == "lockstep":
                        lat = [(b - a) * 1e6 for a, b in zip(rw["stamps"], rr["stamps"],
                                                             strict=True)]
                        cell.lat_us += lat
                        show = f"p50 {statistics.median(lat):.1f} µs"
                    else:
                        per = (rr["t_end"] - rw["t_start"]) * 1e6 / iters
                        cell.pipe_us.append(per)
                        show = f"{per:.1f} µs/step"
                    print(f"  round {rnd} {v} {fmt_size(size)} {mode}: {show}, "
                          f"err={rr['err']} ({time.monotonic() - t:.1f} s)")
    pair.stop()
    return cells


def main(argv: list[str] | None = None) -> dict[tuple[str, int], Cell]:
    args = parse_args(argv)
    cells = dry(args) if args.dry else run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{v} {s}": vars(c) | {"correct": c.correct}
                       for (v, s), c in cells.items()}, f, indent=1)
    for (v, s), c in sorted(cells.items()):
        if c.error or c.skip:
            print(f"{v} {fmt_size(s)}: {(c.error or c.skip).splitlines()[-1]}")
        for w in c.wrong:
            print(f"{v} {fmt_size(s)}: WRONG {w}")
    print()
    print(table(cells, args.variant_list, args.size_list, args.baseline))
    return cells


if __name__ == "__main__":
    main()
