"""Where a same-GPU tensor hop's time goes: the CUDA IPC communicator between two actors.

    python tools/bench/hop_breakdown.py [--device cuda|cpu] [--sizes 16384,1048576]
                                        [--iters 300] [--rounds 1] [--json FILE]

Two Ray actors exchange values through ``CudaIpcCommunicator`` as ``bench_gpu_hop.py`` does
(the writer sends a tensor, the reader receives it, makes it usable, and answers with a
one-int host value, so iterations never overlap). Each hop is split at three instants
taken by a timing wrapper around the communicator's side-channels (``side=``: no change to
the code measured):

- ``send``: the writer's ``send`` call (slot copy queued, notice and header written);
- ``arrival``: the writer's ``send`` returned -> the reader's side-channel read of the
  header returned (ring wake-up, unpickling; below 0 when the reader has the header before
  the writer's ``send`` returns);
- ``reader``: header read -> the reader's ``recv`` returned (the Python of the receive
  path: allocation, stream waits, the copy queued, the acknowledgement written);
- ``device``: ``recv`` returned -> the reader's compute stream finished (the copy itself
  and the cross-process event waits);
- ``hop``: the writer's stamp before ``send`` -> the reader's stamp after the device wait.

Prints one line per size with the medians in µs. ``--device cpu`` runs the same code over
``ShmIpcDevice`` (shared-memory buffers, synchronous copies, ``NullStreams``): no GPU, so
``device`` is ~0 and the other columns are the CPU share of the path; use it to compare
two versions of the code on a machine without a GPU (``compare.py --rows hop``).
``perf_counter`` is one monotonic clock for both processes on Linux.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

import ray

COLUMNS = ("hop", "send", "arrival", "reader", "device")


class _TimedSide:
    """A ``SideChannels`` that stamps the return of every ``recv`` (delegates the rest)."""

    def __init__(self, side: Any) -> None:
        self._side = side
        self.rank, self.world_size = side.rank, side.world_size
        self.marks: list[float] = []

    def send(self, peer: int, msg: Any, timeout: float | None = None) -> None:
        self._side.send(peer, msg, timeout)

    def recv(self, peer: int, timeout: float | None = None, poll: Any = None) -> Any:
        msg = self._side.recv(peer, timeout, poll)
        self.marks.append(time.perf_counter())
        return msg

    def poison(self) -> None:
        self._side.poison()

    def close(self, linger: float = 2.0) -> None:
        self._side.close(linger)


class Hop:
    """One end of the hop (rank 0 writes, rank 1 reads)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.comm: Any = None
        self.side: _TimedSide | None = None
        if device == "cuda":
            import torch

            from cgc.runtime.gpu.streams import ActorStreams

            torch.cuda.init()
            self.streams: Any = ActorStreams()
        else:
            from cgc.runtime.gpu.streams import NullStreams

            self.streams = NullStreams()

    def open(self, prefix: str, rank: int, slot_bytes: int) -> None:
        import torch

        try:
            from cgc.runtime.comm.cuda_ipc import CudaIpcCommunicator
            from cgc.runtime.comm.sidechannel import ShmSideChannels
            from cgc.runtime.comm.warmup import warm_up
        except ImportError:  # a commit before runtime/comm (compare.py's base side)
            from cgc.runtime.gpu.ipc import CudaIpcCommunicator
            from cgc.runtime.gpu.sidechannel import ShmSideChannels
            from cgc.runtime.gpu.warmup import warm_up

        self.side = _TimedSide(ShmSideChannels(prefix, rank, 2))
        kw: dict[str, Any] = {}
        if self.device == "cpu":
            try:
                from cgc.runtime.comm.testing.shm_ipc_device import ShmIpcDevice
            except ImportError:  # compare.py's base side, before runtime/comm
                from cgc.runtime.gpu.ipc_devices import ShmIpcDevice

            kw = {"device": ShmIpcDevice(prefix, rank),
                  "is_device": lambda x: isinstance(x, torch.Tensor)}
        self.comm = CudaIpcCommunicator(rank, 2, prefix=prefix, side=self.side,
                                        streams=self.streams,
                                        slots=2, slot_bytes=slot_bytes, timeout=120, **kw)
        warm_up(self.comm, [1 - rank], 120)

    def write(self, nbytes: int, iters: int) -> list[tuple[float, float]]:
        import torch

        x = torch.ones(nbytes, dtype=torch.uint8, device=self.device)
        if self.device == "cuda":
            torch.cuda.synchronize()
        out = []
        for _ in range(iters):
            t0 = time.perf_counter()
            self.comm.send(x, 1)
            out.append((t0, time.perf_counter()))
            self.comm.recv(1)
        return out

    def read(self, iters: int) -> list[tuple[float, float, float]]:
        assert self.side is not None
        out = []
        for i in range(iters):
            self.side.marks.clear()
            t = self.comm.recv(0)
            t1 = time.perf_counter()
            if self.device == "cuda":
                self.streams.compute.synchronize()
            out.append((self.side.marks[0], t1, time.perf_counter()))
            del t
            self.comm.send(i, 0)
        return out

    def close(self) -> None:
        if self.comm is not None:
            self.comm.destroy()


def breakdown(w: list[tuple[float, float]], r: list[tuple[float, float, float]]
              ) -> dict[str, float]:
    """Medians in µs of the columns (see module doc) from the two ends' stamps."""
    cols: dict[str, list[float]] = {c: [] for c in COLUMNS}
    for (t0, t1), (hdr, got, usable) in zip(w, r, strict=True):
        cols["hop"].append(usable - t0)
        cols["send"].append(t1 - t0)
        cols["arrival"].append(hdr - t1)
        cols["reader"].append(got - hdr)
        cols["device"].append(usable - got)
    return {c: statistics.median(v) * 1e6 for c, v in cols.items()}


def run(device: str, sizes: list[int], iters: int) -> dict[int, dict[str, float]]:
    """One pair of actors, every size; the breakdown per size."""
    opts = {"num_gpus": 0.5} if device == "cuda" else {}
    cls = ray.remote(num_cpus=0, **opts)(Hop)
    a, b = cls.remote(device), cls.remote(device)
    prefix = f"cgc-hop-bd-{uuid.uuid4().hex[:8]}-"
    out = {}
    try:
        ray.get([a.open.remote(prefix, 0, max(sizes)), b.open.remote(prefix, 1, max(sizes))])
        for n in sizes:
            warm = max(20, iters // 10)
            ray.get([a.write.remote(n, warm), b.read.remote(warm)])
            w, r = ray.get([a.write.remote(n, iters), b.read.remote(iters)])
            out[n] = breakdown(w, r)
    finally:
        ray.get([a.close.remote(), b.close.remote()])
        for h in (a, b):
            ray.kill(h)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--sizes", default="16384,1048576")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ray.init(include_dashboard=False, log_to_driver=False)
    results = []
    try:
        for k in range(args.rounds):
            res = run(args.device, sizes, args.iters)
            results.append({str(n): v for n, v in res.items()})
            for n, v in res.items():
                cols = " ".join(f"{c}={v[c]:.0f}" for c in COLUMNS)
                print(f"round {k + 1} {args.device} bytes={n} {cols} (µs, medians)", flush=True)
    finally:
        ray.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "rounds": results}, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
