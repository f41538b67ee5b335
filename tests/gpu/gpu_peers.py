"""GPU test helpers: a Ray actor holding one rank of a device communicator, and the
scenarios the tests run on each rank (module-level functions, shipped to the actors by
value: ``peer.run.remote(fn, *args)`` calls ``fn(actor_instance, *args)`` there).

Every scenario returns plain Python data (sums, flags, messages) so the test process never
needs CUDA tensors from the actors.
"""

from __future__ import annotations

import time
from typing import Any

import ray


class Peer:
    """One actor = one rank. ``fake_host``: apply the NCCL fake-hosts env before any NCCL."""

    def __init__(self, fake_host: str | None = None) -> None:
        from cgc.runtime.comm.testing.fake_hosts import apply_fake_hosts

        if fake_host:
            apply_fake_hosts(fake_host)
        import torch

        from cgc.runtime.gpu.streams import ActorStreams

        torch.cuda.init()
        self.streams = ActorStreams()
        self.comm: Any = None

    def run(self, fn: Any, *args: Any) -> Any:
        return fn(self, *args)

    def ready(self) -> bool:
        return True


def make_peer(fake_host: str | None = None, concurrency: int = 1) -> Any:
    """A new ``Peer`` actor on half a GPU (two fit on one device)."""
    cls = ray.remote(num_gpus=0.5, num_cpus=0)(Peer)
    h = cls.options(max_concurrency=concurrency).remote(fake_host)
    ray.get(h.ready.remote(), timeout=120)
    return h


# ----------------------------------------------------------------------------- set-up


def gpu_uuid(p: Peer) -> str | None:
    from cgc.runtime.comm.binding import probe_gpu_uuid

    return probe_gpu_uuid()


def unique_id(p: Peer, binding: str) -> bytes:
    from cgc.runtime.comm.nccl import make_unique_id

    return make_unique_id(binding)


def open_nccl(p: Peer, uid: bytes, prefix: str, rank: int, world: int, binding: str,
              init_timeout: float = 60.0) -> str:
    from cgc.runtime.comm.nccl import NcclCommunicator

    p.comm = NcclCommunicator(uid, rank, world, prefix=prefix, streams=p.streams,
                              binding=binding, init_timeout=init_timeout, timeout=60.0)
    return p.comm.binding


def open_ipc(p: Peer, prefix: str, rank: int, world: int, slots: int = 2,
             slot_bytes: int = 1 << 20) -> None:
    from cgc.runtime.comm.cuda_ipc import CudaIpcCommunicator

    p.comm = CudaIpcCommunicator(rank, world, prefix=prefix, streams=p.streams, slots=slots,
                                 slot_bytes=slot_bytes, timeout=60.0)


def warm(p: Peer, peers: list[int], collective: bool = False) -> None:
    from cgc.runtime.comm.warmup import warm_up

    warm_up(p.comm, peers, 60.0, collective)


def destroy(p: Peer) -> None:
    if p.comm is not None:
        p.comm.destroy()
        p.comm = None


# ----------------------------------------------------------------------------- values


def send_values(p: Peer, peer: int, sizes: list[int], reps: int) -> None:
    """For each byte size, ``reps`` mixed values: a CUDA tensor filled with its index, a
    strided CUDA tensor, a CPU tensor and a string."""
    import torch

    i = 0
    for n in sizes:
        for _ in range(reps):
            x = torch.full((n // 4,), float(i), device="cuda")
            strided = torch.arange(12.0, device="cuda").reshape(3, 4).t()
            p.comm.send({"x": x, "s": strided, "cpu": torch.ones(2), "i": i, "name": f"v{i}"},
                        peer)
            i += 1


def recv_values(p: Peer, peer: int, sizes: list[int], reps: int) -> list[Any]:
    import torch

    out = []
    want = torch.arange(12.0).reshape(3, 4).t()
    for n in sizes:
        for _ in range(reps):
            v = p.comm.recv(peer)
            x = v["x"]
            out.append((v["i"], v["name"], x.device.type, x.numel() == n // 4,
                        bool((x == v["i"]).all().item()),
                        bool(torch.equal(v["s"].cpu(), want)), v["cpu"].device.type))
    return out


def send_errors(p: Peer, peer: int) -> None:
    import torch

    from cgc.runtime.channels import ErrorValue

    err = ErrorValue.from_exception(ValueError("upstream failed"), actor="a", method="m")
    p.comm.send(err, peer)  # dynamic edge: header only
    p.comm.send(err, peer, shape=(4,), dtype="float32")  # static: header + dummy
    p.comm.send(torch.ones(3, device="cuda"), peer, shape=(4,), dtype="float32")  # mismatch
    p.comm.send(torch.full((4,), 5.0, device="cuda"), peer, shape=(4,), dtype="float32")


def recv_errors(p: Peer, peer: int) -> list[Any]:
    got = [p.comm.recv(peer), p.comm.recv(peer, shape=(4,), dtype="float32"),
           p.comm.recv(peer, shape=(4,), dtype="float32"),
           p.comm.recv(peer, shape=(4,), dtype="float32")]
    out = [getattr(g, "message", None) for g in got[:3]]
    out.append(got[3].tolist())
    return out


# ----------------------------------------------------------------------------- ordering


def produce_delayed(p: Peer, peer: int, n: int, count: int, cycles: int) -> None:
    """Each value is written by a kernel queued behind a long sleep kernel on the compute
    stream: a transfer that does not wait for the compute stream copies stale bytes."""
    import torch

    for i in range(count):
        x = torch.empty(n, device="cuda")
        torch.cuda._sleep(cycles)
        x.fill_(float(i))
        p.comm.send(x, peer)


def consume_checked(p: Peer, peer: int, count: int, copy_delay_cycles: int) -> int:
    """Receive ``count`` values (optionally with this rank's comm stream slowed down, so
    the writer must wait on the device before it reuses a slot); return mismatches."""
    import torch

    vals = []
    for _ in range(count):
        if copy_delay_cycles:
            with p.streams.comm_context():
                torch.cuda._sleep(copy_delay_cycles)
        vals.append(p.comm.recv(peer))
    return sum(int((v != i).sum().item()) for i, v in enumerate(vals))


def hops_counting_syncs(p: Peer, peer: int, role: str, n: int, iters: int) -> int:
    """``iters`` tensor hops with ``count_device_syncs`` active; the count of CPU waits on
    the device made during them (torch synchronize calls and this package's own)."""
    import torch

    from cgc.runtime.gpu.streams import count_device_syncs

    keep = []
    x = torch.ones(n, device="cuda")
    with count_device_syncs() as c:
        for _ in range(iters):
            if role == "send":
                p.comm.send(x, peer)
            else:
                keep.append(p.comm.recv(peer))
        count = c.count
    torch.cuda.synchronize()
    assert all(bool((k == 1).all().item()) for k in keep)
    return count


# ----------------------------------------------------------------------------- NCCL


def nccl_rank_script(p: Peer, rank: int) -> dict:
    """The same op order on both ranks of a 2-rank communicator: p2p both ways (mixed,
    static, errors), then collectives, then a collective whose inputs differ."""
    import torch

    from cgc.runtime.channels import ErrorValue

    c, peer, out = p.comm, 1 - rank, {}
    if rank == 0:
        c.send({"t": torch.arange(10.0, device="cuda"), "k": "x"}, peer)
        c.send(torch.full((2, 3), 4.0, device="cuda"), peer, shape=(2, 3), dtype="float32")
        c.send(ErrorValue.from_exception(KeyError("k0")), peer, shape=(2, 3), dtype="float32")
        c.send(ErrorValue.from_exception(KeyError("k1")), peer)
        back = c.recv(peer)
        out["back"] = back.tolist()
    else:
        v = c.recv(peer)
        s = c.recv(peer, shape=(2, 3), dtype="float32")
        e1 = c.recv(peer, shape=(2, 3), dtype="float32")
        e2 = c.recv(peer)
        out["p2p"] = [v["k"], v["t"].sum().item(), s.sum().item(), e1.message, e2.message]
        c.send(v["t"][:3] * 2, peer)
    x = torch.tensor([rank + 1.0, 2.0], device="cuda")
    out["sum"] = c.allreduce(x, "sum").tolist()
    out["avg"] = c.allreduce(x, "avg").tolist()
    out["max"] = c.allreduce(torch.tensor([rank, 5 - rank], device="cuda"), "max").tolist()
    out["gather"] = [t.tolist() for t in c.allgather(torch.tensor([rank], device="cuda"))]
    out["rs"] = c.reducescatter(torch.arange(4.0, device="cuda") * (rank + 1), "sum").tolist()
    err = c.allreduce(ErrorValue.from_exception(RuntimeError("r1")) if rank else x, "sum")
    out["coll_err"] = err.message
    try:
        c.allreduce(torch.ones(2 + rank, device="cuda"), "sum")
    except ValueError as e:
        out["mismatch"] = str(e)
    torch.cuda.synchronize()
    return out


def world1_collectives(p: Peer) -> dict:
    import torch

    c = p.comm
    x = torch.tensor([1.0, -2.0, 3.0], device="cuda")
    res = {op: c.allreduce(x, op).tolist() for op in ("sum", "product", "max", "min", "avg")}
    res["gather"] = [t.tolist() for t in c.allgather(x)]
    res["rs"] = c.reducescatter(x, "sum").tolist()
    res["int_avg"] = c.allreduce(torch.tensor([3, 4], device="cuda"), "avg").tolist()
    res["bool_max"] = c.allreduce(torch.tensor([True, False], device="cuda"), "max").tolist()
    return res


def hang_then_abort(p: Peer, peer: int) -> dict:
    """Post a static receive nobody answers, time out on its header, abort: the device
    recovers (the compute stream, which waits on the receive, drains)."""
    import torch

    from cgc.runtime.channels import ChannelClosedError, ChannelTimeoutError

    out = {}
    try:
        p.comm.recv(peer, shape=(1024,), dtype="float32", timeout=2.0)
    except ChannelTimeoutError:
        out["timed_out"] = True
    t0 = time.monotonic()
    p.comm.abort()
    out["abort_s"] = time.monotonic() - t0
    try:
        p.comm.send(torch.ones(1, device="cuda"), peer)
    except ChannelClosedError:
        out["closed_after"] = True
    torch.cuda.synchronize()  # would never return if the receive kernel still spun
    out["device_ok"] = torch.ones(1, device="cuda").add(1).item() == 2.0
    p.comm.destroy()
    p.comm = None
    return out


def abort_peer(p: Peer) -> None:
    if p.comm is not None:
        p.comm.abort()
        p.comm.destroy()
        p.comm = None


def init_alone(p: Peer, binding: str, deadline_s: float) -> tuple[str, float]:
    """NCCL init of rank 0 of 2 whose rank 1 never comes: must end by the deadline."""
    from cgc.runtime.comm.nccl_lib import nccl_lib
    from cgc.runtime.errors import SetupError

    lib = nccl_lib(binding)
    uid = lib.unique_id()
    t0 = time.monotonic()
    try:
        lib.init(2, uid, 0, time.monotonic() + deadline_s, device=0)
    except SetupError as e:
        return str(e), time.monotonic() - t0
    return "init returned", time.monotonic() - t0


def torch_dist_world1(p: Peer) -> list[float]:
    """A 1-rank NCCL process group of the user's, wrapped as a cgc communicator."""
    import os
    import uuid

    import torch
    import torch.distributed as dist

    from cgc.runtime.comm.torchdist import TorchDistCommunicator

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        comm = TorchDistCommunicator(prefix=f"cgc-gpu-td-{os.getpid()}-{uuid.uuid4().hex[:6]}-",
                                     streams=p.streams)
        out = comm.allreduce(torch.tensor([2.0, 4.0], device="cuda"), "avg").tolist()
        comm.destroy()
        return out
    finally:
        dist.destroy_process_group()


def window_back_pressure(p: Peer) -> tuple[int, int]:
    """``keep_until`` with a window of 2 behind slow kernels: pending never exceeds it."""
    import torch

    from cgc.runtime.gpu.streams import SYNC_COUNTER, ActorStreams

    s = ActorStreams(window=2)
    SYNC_COUNTER.reset()
    most = 0
    for _ in range(5):
        with s.comm_context():
            torch.cuda._sleep(5_000_000)
        s.keep_until(s.comm_done(), torch.ones(1, device="cuda"), timeout=60)
        most = max(most, s.pending())
    s.drain(60)
    return most, SYNC_COUNTER.count


def counted_synchronize(p: Peer) -> int:
    import torch

    from cgc.runtime.gpu.streams import count_device_syncs

    with count_device_syncs() as c:
        torch.cuda.synchronize()
        torch.cuda.current_stream().synchronize()
    return c.count
