"""One call that opens the communicator a binding chose (what the runtime's set-up calls).

Example::

    b = bind_communicators(members_by_comm, choice)[comm_id]        # on the driver
    comm = open_device_communicator(b.transport, rank=r, world_size=n,
                                    prefix=f"{graph_prefix}-g{comm_id}-", streams=streams,
                                    unique_id=uid)                  # in each member actor
"""

from __future__ import annotations

from typing import Any

from cgc.runtime.errors import SetupError

__all__ = ["open_device_communicator"]


def open_device_communicator(transport: str, *, rank: int, world_size: int, prefix: str,
                             streams: Any = None, unique_id: bytes | None = None,
                             binding: str | None = None, slots: int = 2,
                             slot_bytes: int = 1 << 20, init_timeout: float = 60.0,
                             timeout: float | None = None, name: str = "",
                             spin_us: float = 0.0) -> Any:
    """Open this member's end of a communicator bound to ``transport``
    ("nccl" | "cuda_ipc" | "host_staging" | "cpu"; see ``binding``; "cpu_protocol" is the
    test mode ``binding.DEVICE_PROTOCOL_ON_CPU_ENV`` turns on).

    Args:
        prefix: unique name prefix for this communicator's shared-memory rings.
        streams: the actor's ``ActorStreams`` (one per actor, shared by its communicators).
        unique_id: "nccl" only: the bytes rank 0 made with ``make_unique_id``.
        binding: "nccl" only: "ctypes" | "cupy" | "auto".
        slots, slot_bytes: "cuda_ipc" only: slots per pair and their initial size (e.g. the
            largest ``Channel.slot_bytes`` of the communicator's channels).
        spin_us: "cpu" / "host_staging" only: the rings' spin before a futex sleep (the
            plan's ``spin_us``, as its host channels get: on this VM a sleeping peer costs
            its waker a ~50-80 µs wake-up, twice per rendezvous hop).

    Raises:
        SetupError: unknown transport, a missing unique id, or the transport's own set-up
            failure (see each class).
    """
    if transport == "nccl":
        from cgc.runtime.comm.nccl import NcclCommunicator

        if unique_id is None:
            raise SetupError(f"{name or prefix}: an NCCL communicator needs rank 0's unique id")
        return NcclCommunicator(unique_id, rank, world_size, prefix=prefix, streams=streams,
                                binding=binding, init_timeout=init_timeout, timeout=timeout,
                                name=name)
    if transport == "cuda_ipc":
        from cgc.runtime.comm.cuda_ipc import CudaIpcCommunicator

        return CudaIpcCommunicator(rank, world_size, prefix=prefix, streams=streams,
                                   slots=slots, slot_bytes=slot_bytes, timeout=timeout,
                                   name=name)
    if transport == "cpu_protocol":  # test mode: the device protocol over CPU tensors
        from cgc.runtime.comm.testing.cpu_transport import cpu_device_communicator

        return cpu_device_communicator(prefix, rank, world_size, timeout=timeout)
    if transport in ("host_staging", "cpu"):
        from cgc.runtime.comm.cpu import CpuCommunicator

        inner = CpuCommunicator(prefix, rank, world_size, attach_timeout=init_timeout,
                                spin_us=spin_us)
        if transport == "cpu":
            return inner
        from cgc.runtime.comm.host_staging import HostStagingCommunicator

        return HostStagingCommunicator(inner, streams, timeout=timeout)
    raise SetupError(f"unknown communicator transport {transport!r} "
                     "(nccl, cuda_ipc, host_staging, cpu or cpu_protocol)")
