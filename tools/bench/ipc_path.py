"""The CPU cost of the CUDA IPC communicator's value path, in one process, without a GPU.

Two ``CudaIpcCommunicator`` ranks over ``ShmIpcDevice`` (shared-memory buffers, synchronous
copies, events that do nothing) and ``NullStreams`` live in this one process and thread:
rank 0 sends a tensor, rank 1 receives it and answers with an int, rank 0 takes the answer
- the pattern of ``hop_breakdown.py`` without Ray, processes or wake-ups, so what is left
is the protocol's and the transport's own Python and copies. Prints the medians (µs) of
rank 0's ``send`` and rank 1's ``recv``; steadier than the hop over Ray actors, and the row
``compare.py --rows ipc_send,ipc_recv`` runs it for two commits.

    python tools/bench/ipc_path.py --iters 20000 --bytes 1024 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid


def measure(iters: int, nbytes: int, warm: int = 2000) -> dict[str, float]:
    """Medians in µs of ``send`` (rank 0) and ``recv`` (rank 1) over ``iters`` hops."""
    import torch

    from cgc.runtime.channels import cleanup_segments
    try:
        from cgc.runtime.comm.cuda_ipc import CudaIpcCommunicator
        from cgc.runtime.comm.testing.shm_ipc_device import ShmIpcDevice
    except ImportError:  # a commit before runtime/comm (compare.py runs this on both sides)
        from cgc.runtime.gpu.ipc import CudaIpcCommunicator
        from cgc.runtime.gpu.ipc_devices import ShmIpcDevice
    from cgc.runtime.gpu.streams import NullStreams

    prefix = f"cgc-ipcpath-{uuid.uuid4().hex[:8]}-"
    comms = [CudaIpcCommunicator(r, 2, prefix=prefix, streams=NullStreams(),
                                 device=ShmIpcDevice(prefix, r), slots=2,
                                 slot_bytes=max(nbytes, 1024), timeout=30,
                                 is_device=lambda x: isinstance(x, torch.Tensor))
             for r in (0, 1)]
    c0, c1 = comms
    x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
    clock = time.perf_counter_ns
    sends: list[int] = []
    recvs: list[int] = []
    try:
        for i in range(warm + iters):
            t0 = clock()
            c0.send(x, 1)
            t1 = clock()
            c1.recv(0)
            t2 = clock()
            c1.send(i, 0)
            c0.recv(1)
            if i >= warm:
                sends.append(t1 - t0)
                recvs.append(t2 - t1)
    finally:
        for c in comms:
            c.destroy(linger=0)
        cleanup_segments(prefix)
    return {"send": statistics.median(sends) / 1e3, "recv": statistics.median(recvs) / 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    res = measure(args.iters, args.bytes)
    print(f"ipc path, {args.bytes} B: send {res['send']:.1f} µs, recv {res['recv']:.1f} µs "
          f"(medians of {args.iters})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, sort_keys=True)


if __name__ == "__main__":
    main()
