"""Same-GPU tensor hop: cgc's CUDA IPC communicator, a whole cgc graph, Ray Compiled Graph.

    python tools/bench/bench_gpu_hop.py [--iters 200] [--sizes 1024,1048576,67108864]
                                        [--slots 2] [--graph] [--nccl-fake-hosts] [--ray-cg]

``--graph`` times the anchor's graph (A makes a CUDA tensor, B reads 8 elements; driver
``execute`` -> ``get``) compiled by cgc and bound at start (CUDA IPC on one GPU): the
figure to compare with ``--ray-cg``, which runs the same graph on Ray Compiled Graph
after cgc's graph is torn down (one system alive at a time). ``--nccl-fake-hosts`` runs
cgc's graph once more over real NCCL with two ranks on the one GPU (the test-only
fake-hosts mode: sockets, slow; it shows the path works, not its speed).

Two actors with ``num_gpus=0.5`` share one GPU. Per iteration the writer stamps
``time.perf_counter()`` and sends a CUDA tensor; the reader receives it, synchronizes its
compute stream (the tensor is now usable: its bytes are in the reader's own memory) and
stamps; then it returns a one-int host value so the writer starts the next iteration only
after this one ended. hop = reader stamp - writer stamp (``perf_counter`` is the same
monotonic clock in both processes on Linux). Prints p50/p99 per size in µs, and the CPU
waits on the device that cgc itself made during the timed loop (expected 0).

``--ray-cg`` also times Ray Compiled Graph on the same machine in the same run (the anchor's
graph: A makes the tensor, B reads 8 elements; driver ``execute`` -> ``get``, so it includes
the driver's round trip that the cgc figure above does not).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray

import cgc


class Hop:
    def __init__(self) -> None:
        import torch

        from cgc.runtime.gpu.streams import ActorStreams

        torch.cuda.init()
        self.streams = ActorStreams()
        self.comm: Any = None

    def open(self, prefix: str, rank: int, slots: int, slot_bytes: int) -> None:
        from cgc.runtime.comm.cuda_ipc import CudaIpcCommunicator
        from cgc.runtime.comm.warmup import warm_up

        self.comm = CudaIpcCommunicator(rank, 2, prefix=prefix, streams=self.streams,
                                        slots=slots, slot_bytes=slot_bytes, timeout=120)
        warm_up(self.comm, [1 - rank], 120)

    def write(self, nbytes: int, iters: int) -> tuple[list[float], int]:
        import torch

        from cgc.runtime.gpu.streams import SYNC_COUNTER

        x = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        stamps = []
        SYNC_COUNTER.reset()
        for _ in range(iters):
            stamps.append(time.perf_counter())
            self.comm.send(x, 1)
            self.comm.recv(1)  # the reader's "done", a host value
        return stamps, SYNC_COUNTER.count

    def read(self, iters: int) -> tuple[list[float], int]:
        import torch

        from cgc.runtime.gpu.streams import SYNC_COUNTER

        stamps = []
        SYNC_COUNTER.reset()
        for i in range(iters):
            t = self.comm.recv(0)
            self.streams.compute.synchronize()  # usable: compute waited on the copy
            stamps.append(time.perf_counter())
            del t
            self.comm.send(i, 0)
        counted = SYNC_COUNTER.count
        torch.cuda.synchronize()
        return stamps, counted

    def close(self) -> None:
        if self.comm is not None:
            self.comm.destroy()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _cached_cuda_tensor(cache: dict[int, Any], n: int) -> Any:
    """The anchor's producer step (cgc's ``Maker`` and Ray CG's ``A`` alike): one CUDA
    tensor of ``n`` bytes per size, made once and returned again after."""
    import torch

    if n not in cache:
        cache[n] = torch.ones(n, dtype=torch.uint8, device="cuda")
    return cache[n]


def _execute_get_us(execute_get: Callable[[int], Any], n: int, iters: int) -> list[float]:
    """µs of ``execute_get(n)`` per iteration, after 5 untimed warm-up calls."""
    for _ in range(5):
        execute_get(n)
    lat = []
    for _ in range(iters):
        t = time.perf_counter()
        execute_get(n)
        lat.append((time.perf_counter() - t) * 1e6)
    return lat


def bench_cgc(sizes: list[int], iters: int, slots: int) -> None:
    cls = ray.remote(num_gpus=0.5, num_cpus=0)(Hop)
    a, b = cls.remote(), cls.remote()
    prefix = f"cgc-bench-hop-{uuid.uuid4().hex[:8]}-"
    try:
        ray.get([a.open.remote(prefix, 0, slots, max(sizes)),
                 b.open.remote(prefix, 1, slots, max(sizes))])
        for n in sizes:
            warm = max(5, iters // 10)
            ray.get([a.write.remote(n, warm), b.read.remote(warm)])
            (ws, wsync), (rs, rsync) = ray.get([a.write.remote(n, iters), b.read.remote(iters)])
            hops = [(r - w) * 1e6 for w, r in zip(ws, rs, strict=True)]
            print(f"cgc cuda_ipc same-GPU hop bytes={n} p50_us={statistics.median(hops):.0f} "
                  f"p99_us={_pct(hops, 0.99):.0f} cgc_device_waits(writer,reader)="
                  f"{wsync},{rsync}", flush=True)
    finally:
        ray.get([a.close.remote(), b.close.remote()])
        for h in (a, b):
            ray.kill(h)


@cgc.actor(num_gpus=0.5, num_cpus=0)
class Maker:
    """The anchor's producer: one cached CUDA tensor per size."""

    def __init__(self) -> None:
        self.t: dict[int, Any] = {}

    def mk(self, n: int) -> Any:
        return _cached_cuda_tensor(self.t, n)


@cgc.actor(num_gpus=0.5, num_cpus=0)
class Reader:
    """The anchor's consumer: reads 8 elements (a host value back to the driver)."""

    def s(self, t: Any) -> int:
        assert t.device.type == "cuda"
        return int(t[:8].sum())


def bench_cgc_graph(sizes: list[int], iters: int, label: str = "auto") -> dict[int, float]:
    """p50 (µs) of execute -> get per size, through a cgc graph bound at start."""
    from cgc import InputNode

    a, b = Maker.bind(), Reader.bind()
    with InputNode() as inp:
        dag = b.s.bind(a.mk.bind(inp).with_tensor_transport("nccl"))
    out: dict[int, float] = {}
    with cgc.compile(dag, name="gpu_hop").start(get_timeout=300) as g:
        bound = ", ".join(f"comm {c}: {x.transport} ({x.reason})"
                          for c, x in sorted(g.comm_bindings.items()))
        print(f"cgc graph [{label}] set-up {g.setup_seconds:.2f} s; {bound}", flush=True)

        def execute_get(n: int) -> None:
            assert g.execute(n).get() == 8

        for n in sizes:
            lat = _execute_get_us(execute_get, n, iters)
            out[n] = statistics.median(lat)
            print(f"cgc graph [{label}] same-GPU execute->get bytes={n} p50_us={out[n]:.0f} "
                  f"p99_us={_pct(lat, 0.99):.0f}", flush=True)
    return out


def bench_ray_cg(sizes: list[int], iters: int) -> None:
    from ray.dag import InputNode

    @ray.remote(num_gpus=0.5)
    class A:
        def __init__(self) -> None:
            self.t: dict[int, Any] = {}

        def mk(self, n: int) -> Any:
            return _cached_cuda_tensor(self.t, n)

    @ray.remote(num_gpus=0.5)
    class B:
        def s(self, t: Any) -> int:
            return int(t[:8].sum())

    a, b = A.remote(), B.remote()
    with InputNode() as inp:
        dag = b.s.bind(a.mk.bind(inp))
    cd = dag.experimental_compile()
    try:
        for n in sizes:
            lat = _execute_get_us(lambda n: ray.get(cd.execute(n)), n, iters)
            print(f"ray_cg same-GPU execute->get bytes={n} p50_us={statistics.median(lat):.0f}",
                  flush=True)
    finally:
        # Kill first: Ray CG's teardown hangs after a 64 MiB tensor went through the
        # shared-memory path (ANCHORS.md); with its actors dead it returns.
        for h in (a, b):
            ray.kill(h)
        cd.teardown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--sizes", default="1024,1048576,67108864")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--ray-cg", action="store_true")
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--nccl-fake-hosts", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ray.init(include_dashboard=False, log_to_driver=True)
    try:
        bench_cgc(sizes, args.iters, args.slots)
        if args.graph:
            bench_cgc_graph(sizes, args.iters, "auto")
        if args.nccl_fake_hosts:
            import os

            from cgc.runtime.comm.binding import FAKE_HOSTS_ENV

            os.environ[FAKE_HOSTS_ENV] = "1"
            try:
                bench_cgc_graph(sizes[:2], min(args.iters, 50), "nccl fake hosts")
            finally:
                del os.environ[FAKE_HOSTS_ENV]
        if args.ray_cg:
            bench_ray_cg(sizes, min(args.iters, 50))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    import ray_leftovers  # Ray CG's named semaphores of our Ray go at exit

    ray_leftovers.install()
    main()
