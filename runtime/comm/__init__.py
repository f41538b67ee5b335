"""cgc's communicators: NCCL-shaped send/recv and collectives between the actors of a graph.

One interface (``interface.Communicator``) and its implementations, one module each:

- ``cpu``              - ``CpuCommunicator``: NCCL's blocking semantics over shared-memory
  rings, for CPU-only runs and CI (every NCCL-scheduled plan also runs through it).
- ``device_protocol``  - ``DeviceCommunicator``: the value protocol (headers, static edges,
  errors as values, collective status words: ``CollectiveStatus``) over a transport.
- ``transport``        - what moves the bytes under it, of one of two kinds:
  ``PostingTransport`` (matched p2p posts: NCCL) or ``DescribingTransport`` (bytes placed,
  then described in the header: CUDA IPC); ``GatheringTransport`` (collectives from pairs).
- ``nccl``, ``nccl_lib`` - that protocol over NCCL (ctypes or cupy binding).
- ``cuda_ipc``, ``cuda_ipc_devices`` - over CUDA IPC, for actors sharing one GPU.
- ``torchdist``        - over a ``torch.distributed`` group the user already has.
- ``host_staging``     - device tensors through a host communicator via pinned memory.
- ``sidechannel``      - small host messages per ordered pair of ranks (``SideKind``).
- ``ring_mesh``        - one shared-memory ring per ordered pair of ranks: what the CPU
  communicator, the side channels and the CPU test transport are built on.
- ``collective``       - what a collective computes (``ReduceOp``), the one rule for all.
- ``binding``          - which transport (``Transport``) each plan communicator gets, decided
  at start.
- ``factory``          - ``open_device_communicator``: one call per member, in each actor,
  with the transport's options (``NcclOptions``, ``IpcOptions``, ``HostOptions``).
- ``warmup``           - a real transfer on every p2p pair before the first execution.
- ``testing``          - the test stand-ins (the device protocol over CPU tensors, CUDA IPC
  over shared memory, fake NCCL hosts); never imported unless a test switch is on.

Nothing here imports cupy, NCCL or CUDA when the package is imported; each module loads
what it needs when used, so CPU-only machines import and test all of it.

Set-up order (per graph): probe (``binding.probe_gpu_uuid``) -> the driver binds -> rank 0
of each NCCL communicator ``make_unique_id()`` -> every member opens its communicators in
plan order -> ``warm_up`` in plan order -> the loop. Per op: ``send(value, peer, timeout,
shape=, dtype=)``, ``recv(peer, shape=, dtype=, timeout=)``, ``allreduce`` /
``allgather`` / ``reducescatter``; ``abort()`` from any thread; ``destroy()`` at teardown.

Example:
    >>> import threading, numpy as np
    >>> from cgc.runtime.comm import CpuCommunicator, ReduceOp
    >>> out = {}
    >>> def member(r):
    ...     c = CpuCommunicator(prefix="cgc-doc-comm-", rank=r, world_size=2)
    ...     out[r] = c.allreduce(np.array([r + 1]), op=ReduceOp.SUM).tolist()
    ...     c.destroy(linger=0.0)
    >>> ts = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    >>> for t in ts: t.start()
    >>> for t in ts: t.join()
    >>> dict(sorted(out.items()))  # the threads may finish in either order
    {0: [3], 1: [3]}
"""

from __future__ import annotations

from cgc.runtime.comm.collective import ReduceOp
from cgc.runtime.comm.cpu import CpuCommunicator
from cgc.runtime.comm.interface import Communicator

__all__ = ["Communicator", "CpuCommunicator", "ReduceOp"]
