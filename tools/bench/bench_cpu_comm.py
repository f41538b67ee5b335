"""The CPU communicator's point-to-point hop, alone and inside a cgc graph (not a timed test).

    python tools/bench/bench_cpu_comm.py [hop] [graph] [profile] [--iters 2000]

``hop``: two processes, each one rank of a ``CpuCommunicator`` (what ``communicator="cpu"``
binds, with the factory's sizes), passing float32 torch tensors of 2 KiB / 64 KiB / 1 MiB:

- ``stream``: rank 0 sends ``iters`` values back to back, rank 1 receives them; µs per value
  (each send is a rendezvous, so this is one hop plus its acknowledgement);
- ``rtt``: rank 0 sends, rank 1 receives and sends the value back, rank 0 receives; p50 and
  p99 of the round trip (two hops);
- ``CPU``: both ranks' CPU time per round trip (user + system; steadier than wall time
  on a shared machine: Python work and futex syscalls, not waiting);
- ``ring rtt``: the same round trip over two plain shared-memory rings (no rendezvous), the
  floor the communicator's hop is built on.

``graph``: a 2-actor cgc graph, ``a.make(x)`` → tensor edge (``with_tensor_transport("nccl")``)
→ ``b.use(t)``, started with ``communicator="cpu"`` and ``trace=``: p50 of ``execute().get()``
and the p50 SEND / RECV / COMPUTE spans per actor, for a 2 KiB and a 1 MiB tensor.

``profile``: ``cProfile`` of rank 0's side of the 2 KiB round trip (top functions by own time).

Measured on the 2-core VM (quiet moments; medians of interleaved runs): with rings that
sleep at once (``--spin-us 0``, what every CPU communicator had) a 2 KiB round trip is
~140-230 us, most of it the VM's wake-ups (a futex wake of a sleeping peer costs the waker
~50-80 us; a rendezvous hop has two); with the plan's default spin (50) ~47 us, the same
as two plain rings (~44 us). Removing the acknowledgement ring took ~2-3 us off a hop.

Which cgc is timed: the one ``import cgc`` finds (the script prints its path), so the same
script times another copy with ``PYTHONPATH=/copy`` run from outside an editable checkout.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import secrets
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

SIZES = {"2KiB": 512, "64KiB": 16 * 1024, "1MiB": 256 * 1024}  # float32 elements


SPIN_US = 0.0  # --spin-us: the communicator's spin budget (the plan default is 50)


def _comm(prefix: str, rank: int, spin_us: float) -> Any:
    from cgc.runtime.comm.cpu import CpuCommunicator

    # What the executor opens for a "cpu"-bound group (``factory``), with ``spin_us``.
    return CpuCommunicator(prefix, rank, 2, attach_timeout=60.0, spin_us=spin_us)


def _peer(prefix: str, spin_us: float) -> None:
    """Rank 1: per ``(stream, echo)`` pair received, ``stream`` receives, then ``echo``
    echoes (a round trip each); None ends it."""
    c = _comm(prefix, 1, spin_us)
    try:
        while True:
            job = c.recv(0)
            if job is None:
                break
            for _ in range(job[0]):
                c.recv(0)
            cpu = time.process_time()
            for _ in range(job[1]):
                c.send(c.recv(0), 0)
            if job[1]:
                c.send(time.process_time() - cpu, 0)  # this rank's CPU time for the echoes
    finally:
        c.destroy()


def _ring_peer(prefix: str, spin_us: float) -> None:
    from cgc.runtime.channels import ShmRingReader, ShmRingWriter

    r = ShmRingReader.attach(prefix + "x", 0, spin_us, timeout=60)
    w = ShmRingWriter.create(prefix + "y", 1, 1 << 16, 1, spin_us)
    try:
        while True:
            v = r.read()
            if v is None:
                w.write(None)
                break
            w.write(v)
            del v
    finally:
        r.detach()
        w.close(linger=2)


def _pct(ts: list[float], q: float) -> float:
    s = sorted(ts)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e6


def _start_peer() -> tuple[Any, str, Any, Any]:
    """A fresh prefix, rank 1 (``_peer``) started in a process, and rank 0's communicator."""
    ctx = mp.get_context("spawn")
    prefix = f"cgc-bench-{secrets.token_hex(6)}-"
    p = ctx.Process(target=_peer, args=(prefix, SPIN_US))
    p.start()
    return ctx, prefix, p, _comm(prefix, 0, SPIN_US)


def hop(iters: int) -> None:
    import torch

    from cgc.runtime.channels import ShmRingReader, ShmRingWriter, cleanup_segments

    ctx, prefix, p, c = _start_peer()
    print("| payload | stream us/value | rtt p50 us | rtt p99 us | CPU us/rtt (both ranks) "
          "| ring rtt p50 us |")
    print("|---|---|---|---|---|---|")
    rows = {}
    try:
        for label, n in [("warm-up", 512), *SIZES.items()]:
            t = torch.ones(n, dtype=torch.float32)
            c.send((iters, iters), 1)
            t0 = time.perf_counter()
            for _ in range(iters):
                c.send(t, 1)
            stream = (time.perf_counter() - t0) / iters * 1e6
            ts = []
            cpu = time.process_time()
            for _ in range(iters):
                t0 = time.perf_counter()
                c.send(t, 1)
                c.recv(1)
                ts.append(time.perf_counter() - t0)
            cpu = (time.process_time() - cpu + c.recv(1)) / iters * 1e6
            if label != "warm-up":  # the first size pays imports, mappings and caches
                rows[label] = [stream, _pct(ts, 0.5), _pct(ts, 0.99), cpu]
        c.send(None, 1)
    finally:
        p.join(30)
        c.destroy()
    rp = ctx.Process(target=_ring_peer, args=(prefix, SPIN_US))
    w = ShmRingWriter.create(prefix + "x", 1, 1 << 16, 1, SPIN_US)
    rp.start()
    r = ShmRingReader.attach(prefix + "y", 0, SPIN_US, timeout=60)
    try:
        for label, n in SIZES.items():
            t = torch.ones(n, dtype=torch.float32)
            ts = []
            for i in range(iters + 50):
                t0 = time.perf_counter()
                w.write(t)
                r.read()
                if i >= 50:
                    ts.append(time.perf_counter() - t0)
            rows[label].append(_pct(ts, 0.5))
        w.write(None)
        r.read()
    finally:
        rp.join(30)
        r.detach()
        w.close()
        cleanup_segments(prefix)
    for label, (s, p50, p99, cpu, ring) in rows.items():
        print(f"| {label} | {s:.1f} | {p50:.1f} | {p99:.1f} | {cpu:.1f} | {ring:.1f} |")


def profile(iters: int) -> None:
    import cProfile
    import pstats

    import torch

    from cgc.runtime.channels import cleanup_segments

    _, prefix, p, c = _start_peer()
    t = torch.ones(SIZES["2KiB"], dtype=torch.float32)
    try:
        c.send((0, 100), 1)  # warm-up
        for _ in range(100):
            c.send(t, 1)
            c.recv(1)
        c.recv(1)
        c.send((0, iters), 1)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(iters):
            c.send(t, 1)
            c.recv(1)
        pr.disable()
        c.recv(1)  # the peer's CPU time
        c.send(None, 1)
    finally:
        p.join(30)
        c.destroy()
        cleanup_segments(prefix)
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)


def _graph_spans(path: str) -> dict[tuple[str, str], float]:
    import json

    events = json.loads(Path(path).read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    spans: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e["cat"] in ("SEND", "RECV", "COMPUTE"):
            who = names.get(e["pid"], str(e["pid"])).split(" ")[0]
            spans[(who, e["cat"])].append(e["dur"])
    return {k: statistics.median(v[len(v) // 10:]) for k, v in sorted(spans.items())}


def graph(iters: int) -> None:
    import ray
    import torch

    import cgc
    from cgc import InputNode

    @cgc.actor(num_gpus=1)
    class Maker:
        def make(self, n):
            return torch.ones(n, dtype=torch.float32)

    @cgc.actor(num_gpus=1)
    class User:
        def use(self, t):
            return t.numel()

    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        print("| payload | execute().get() p50 us | spans p50 us (actor op) |")
        print("|---|---|---|")
        for label in ("2KiB", "1MiB"):
            n = SIZES[label]
            a, b = Maker.bind(), User.bind()
            with InputNode() as inp:
                dag = b.use.bind(a.make.bind(inp).with_tensor_transport("nccl"))
            with tempfile.TemporaryDirectory() as d:
                path = str(Path(d) / "run.json")
                with cgc.compile(dag, name=f"bench_cpu_comm_{label}").start(
                        communicator="cpu", trace=path, get_timeout=60) as g:
                    assert g.execute(n).get() == n
                    ts = []
                    for _ in range(iters):
                        t0 = time.perf_counter()
                        g.execute(n).get()
                        ts.append(time.perf_counter() - t0)
                spans = _graph_spans(path)
            text = ", ".join(f"{who} {op} {us:,.0f}" for (who, op), us in spans.items())
            print(f"| {label} | {_pct(ts, 0.5):,.0f} | {text} |", flush=True)
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modes", nargs="*", default=["hop", "graph"],
                    choices=["hop", "graph", "profile"])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--spin-us", type=float, default=0.0,
                    help="hop/profile: the communicator's and rings' spin_us (plans: 50)")
    args = ap.parse_args()
    global SPIN_US
    SPIN_US = args.spin_us
    import cgc.runtime.comm.cpu as m

    print(f"timing {m.__file__}", file=sys.stderr)
    for mode in args.modes:
        globals()[mode](args.iters if mode != "graph" else max(args.iters // 4, 50))


if __name__ == "__main__":
    main()
