"""Ping-pong micro-benchmark of cgc channels between two processes (not a timed test).

    python tools/bench/bench_channels.py [--iters 2000] [--spin-us 0] [--tcp]

Process A writes on channel 1, process B reads it and writes the value back on channel 2,
A reads it: one round trip = two channel hops. Prints p50/p99 round-trip in µs per payload:
int, 1 KiB bytes, 1 MiB and 16 MiB float32 numpy (B echoes the zero-copy view it received).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import statistics
import time

import numpy as np

from cgc.runtime.channels import (
    ShmRingReader,
    ShmRingWriter,
    cleanup_segments,
)

PAYLOADS = {
    "int": lambda: 7,
    "1KiB bytes": lambda: b"x" * 1024,
    "1MiB numpy": lambda: np.ones(1 << 18, dtype=np.float32),
    "16MiB numpy": lambda: np.ones(1 << 22, dtype=np.float32),
}


def _tcp():
    from cgc.runtime.channels import TcpReader, TcpWriter

    return TcpReader, TcpWriter


KEY = b"bench-key-" * 4  # the benchmark's graph secret (set-up proof only)


def _echo(prefix: str, spin_us: float, tcp: bool, port_q: mp.Queue) -> None:
    if tcp:
        TcpReader, TcpWriter = _tcp()
        w = TcpWriter.listen("127.0.0.1", 0, secret=KEY)
        port_q.put(w.port)
        r = TcpReader.connect("127.0.0.1", port_q.get(), reader_index=0, secret=KEY,
                              timeout=30)
        w.accept(timeout=30)
    else:
        r = ShmRingReader.attach(prefix + "a", 0, spin_us=spin_us)
        w = ShmRingWriter.create(prefix + "b", slots=2, num_readers=1, spin_us=spin_us)
    try:
        while True:
            v = r.read()
            if isinstance(v, str) and v == "stop":
                w.write("stop")
                break
            w.write(v)
            del v
    finally:
        r.detach() if hasattr(r, "detach") else r.close()
        w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--spin-us", type=float, default=0.0)
    ap.add_argument("--tcp", action="store_true", help="TCP over 127.0.0.1 instead of shm")
    args = ap.parse_args()
    prefix = f"cgc-bench-{secrets.token_hex(8)}-"
    ctx = mp.get_context("spawn")
    port_q: mp.Queue = ctx.Queue()
    if args.tcp:
        TcpReader, TcpWriter = _tcp()
        p = ctx.Process(target=_echo, args=(prefix, args.spin_us, True, port_q))
        p.start()
        r = TcpReader.connect("127.0.0.1", port_q.get(timeout=60), reader_index=0, secret=KEY,
                              timeout=30)
        w = TcpWriter.listen("127.0.0.1", 0, secret=KEY)
        port_q.put(w.port)
        w.accept(timeout=30)
    else:
        w = ShmRingWriter.create(prefix + "a", slots=2, num_readers=1, spin_us=args.spin_us)
        p = ctx.Process(target=_echo, args=(prefix, args.spin_us, False, port_q))
        p.start()
        r = ShmRingReader.attach(prefix + "b", 0, spin_us=args.spin_us, timeout=60)
    kind = "tcp" if args.tcp else f"shm (spin_us={args.spin_us:g})"
    print(f"channel: {kind}, {os.cpu_count()} cpus, round trip = 2 hops")
    print(f"{'payload':<14}{'iters':>7}{'p50 us':>10}{'p99 us':>10}")
    try:
        for label, make in PAYLOADS.items():
            v = make()
            iters = args.iters if "16MiB" not in label else max(args.iters // 10, 50)
            for _ in range(min(50, iters)):  # warm-up: blocks, mappings, caches
                w.write(v)
                r.read()
            ts = []
            for _ in range(iters):
                t0 = time.perf_counter()
                w.write(v)
                out = r.read()
                ts.append(time.perf_counter() - t0)
                del out
            ts.sort()
            p50 = statistics.median(ts) * 1e6
            p99 = ts[min(len(ts) - 1, int(len(ts) * 0.99))] * 1e6
            print(f"{label:<14}{iters:>7}{p50:>10.1f}{p99:>10.1f}")
        w.write("stop")
        r.read()
    finally:
        p.join(10)
        r.close()
        w.close()
        cleanup_segments(prefix)


if __name__ == "__main__":
    main()
