"""One call that opens the communicator a binding chose (what the runtime's set-up calls).

Each transport takes its own options: ``NcclOptions`` (rank 0's unique id is required),
``IpcOptions`` (CUDA IPC slots), ``HostOptions`` (the CPU communicator's rings, also under
host staging). ``options_for`` picks the right one from the values a member has at set-up.

Example::

    b = bind_communicators(members_by_comm, choice)[comm_id]        # on the driver
    comm = open_device_communicator(b.transport, rank=r, world_size=n,
                                    prefix=f"{graph_prefix}-g{comm_id}-", streams=streams,
                                    options=NcclOptions(uid))       # in each member actor
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from cgc.runtime.comm.binding import Transport
from cgc.runtime.comm.interface import Communicator
from cgc.runtime.errors import SetupError

if TYPE_CHECKING:
    from cgc.runtime.comm.device_protocol import CommStreams

__all__ = ["open_device_communicator", "options_for", "NcclOptions", "IpcOptions",
           "HostOptions", "Options"]


@dataclass(frozen=True)
class NcclOptions:
    """An NCCL communicator's options.

    Args:
        unique_id: the bytes rank 0 made with ``make_unique_id``.
        binding: the NCCL binding: "ctypes" | "cupy" | "auto" (None: the default).
        init_timeout: how long ``ncclCommInitRank`` may take.
    """

    unique_id: bytes
    binding: str | None = None
    init_timeout: float = 60.0


@dataclass(frozen=True)
class IpcOptions:
    """A CUDA IPC communicator's options.

    Args:
        slots: slots per pair (values a writer may be ahead of its reader).
        slot_bytes: their initial size (e.g. the largest ``Channel.slot_bytes`` of the
            communicator's channels); a larger value regrows its slot.
    """

    slots: int = 2
    slot_bytes: int = 1 << 20


@dataclass(frozen=True)
class HostOptions:
    """The CPU communicator's options ("cpu", and the host side of "host_staging").

    Args:
        spin_us: the rings' spin before a futex sleep (the plan's ``spin_us``, as its host
            channels get: on this VM a sleeping peer costs its waker a ~50-80 µs wake-up,
            twice per rendezvous hop).
        attach_timeout: how long to wait for the peers' rings to appear.
    """

    spin_us: float = 0.0
    attach_timeout: float = 60.0


Options = NcclOptions | IpcOptions | HostOptions
_O = TypeVar("_O", IpcOptions, HostOptions)


def options_for(transport: Transport | str, *, unique_id: bytes | None = None,
                slot_bytes: int = 1 << 20, init_timeout: float = 60.0,
                spin_us: float = 0.0) -> Options | None:
    """The options of ``transport`` from what a member knows at set-up (None: NCCL without
    a unique id, which ``open_device_communicator`` refuses; or the test mode, which takes
    none).

    Example:
        >>> options_for("cuda_ipc", slot_bytes=4096)
        IpcOptions(slots=2, slot_bytes=4096)

    Raises:
        SetupError: unknown transport.
    """
    t = _transport(transport)
    if t is Transport.NCCL:
        return None if unique_id is None else NcclOptions(unique_id, init_timeout=init_timeout)
    if t is Transport.CUDA_IPC:
        return IpcOptions(slot_bytes=slot_bytes)
    if t is Transport.CPU_PROTOCOL:
        return None
    return HostOptions(spin_us=spin_us, attach_timeout=init_timeout)


def _transport(transport: Transport | str) -> Transport:
    try:
        return Transport(transport)
    except ValueError:
        raise SetupError(f"unknown communicator transport {transport!r} "
                         "(nccl, cuda_ipc, host_staging, cpu or cpu_protocol)") from None


def open_device_communicator(transport: Transport | str, *, rank: int, world_size: int,
                             prefix: str, streams: CommStreams | None = None,
                             options: Options | None = None,
                             timeout: float | None = None, name: str = "") -> Communicator:
    """Open this member's end of a communicator bound to ``transport`` (see ``binding``;
    ``Transport.CPU_PROTOCOL`` is the test mode ``binding.DEVICE_PROTOCOL_ON_CPU_ENV`` turns
    on, opened from ``cgc.runtime.comm.testing``).

    Args:
        prefix: unique name prefix for this communicator's shared-memory rings.
        streams: the actor's ``ActorStreams`` (one per actor, shared by its communicators).
        options: the transport's own (``NcclOptions`` is required for NCCL; the others
            default to ``IpcOptions()`` / ``HostOptions()``; the test mode takes none).
        timeout: default for calls that pass ``timeout=None`` (None: wait until closed).

    Example:
        >>> c = open_device_communicator("cpu", rank=0, world_size=1, prefix="cgc-doc-of-")
        >>> type(c).__name__
        'CpuCommunicator'
        >>> c.destroy(linger=0.0)

    Raises:
        SetupError: unknown transport, NCCL without a unique id (``NcclOptions``), options
            of another transport, or the transport's own set-up failure (see each class).
    """
    t = _transport(transport)
    if t is Transport.NCCL:
        from cgc.runtime.comm.nccl import NcclCommunicator

        if not isinstance(options, NcclOptions):
            raise SetupError(f"{name or prefix}: an NCCL communicator needs rank 0's unique id")
        return NcclCommunicator(options.unique_id, rank, world_size, prefix=prefix,
                                streams=streams, binding=options.binding,
                                init_timeout=options.init_timeout, timeout=timeout, name=name)
    if t is Transport.CUDA_IPC:
        from cgc.runtime.comm.cuda_ipc import CudaIpcCommunicator

        ipc = _expect(IpcOptions, options, t, name or prefix)
        return CudaIpcCommunicator(rank, world_size, prefix=prefix, streams=streams,
                                   slots=ipc.slots, slot_bytes=ipc.slot_bytes,
                                   timeout=timeout, name=name)
    if t is Transport.CPU_PROTOCOL:  # test mode: the device protocol over CPU tensors
        from cgc.runtime.comm.testing.cpu_transport import cpu_device_communicator

        return cpu_device_communicator(prefix, rank, world_size, timeout=timeout)
    from cgc.runtime.comm.cpu import CpuCommunicator

    host = _expect(HostOptions, options, t, name or prefix)
    inner = CpuCommunicator(prefix, rank, world_size, attach_timeout=host.attach_timeout,
                            spin_us=host.spin_us)
    if t is Transport.CPU:
        return inner
    from cgc.runtime.comm.host_staging import HostStagingCommunicator

    return HostStagingCommunicator(inner, streams, timeout=timeout)


def _expect(kind: type[_O], options: Options | None, transport: Transport,
            where: str) -> _O:
    """``options`` if they are ``kind``'s (None: its defaults).

    Raises:
        SetupError: they are another transport's.
    """
    if options is None:
        return kind()
    if not isinstance(options, kind):
        raise SetupError(f"{where}: a {transport} communicator takes {kind.__name__}, not "
                         f"{type(options).__name__}")
    return options
