"""Which transport each plan communicator gets, decided at start from where members really are.

``bind_communicators`` is a pure function of what the set-up probe reported: for every
communicator its members' ``(node id, GPU UUID or None)``, in rank order, plus the user's
choice ("auto" | "cpu" | "nccl") and the test-only fake-hosts flag:

=================================================  ===============  ======================
members                                            "auto"           "nccl"
=================================================  ===============  ======================
every member on a GPU of its own                   ``nccl``         ``nccl``
all on one GPU                                     ``cuda_ipc``     SetupError
some share a GPU, some do not                      ``host_staging``  SetupError
some have a GPU, some none                         ``host_staging``  SetupError
no member has a GPU                                ``cpu``          SetupError
=================================================  ===============  ======================

"cpu" gives ``cpu`` everywhere. Two test switches (environment variables; what they turn
on lives in ``cgc.runtime.comm.testing``, imported only when one is set): with
``CGC_TEST_DEVICE_PROTOCOL=1`` (CI: no GPU) every ``cpu`` binding becomes ``cpu_protocol``
(``testing.cpu_protocol``), so the executor's device paths run without a GPU; with fake
hosts (``CGC_NCCL_FAKE_HOSTS=1``, tests on one GPU) every all-GPU communicator gets
``nccl`` and each actor joins NCCL as a host of its own (``testing.fake_hosts``). Each
``Binding`` has a one-line ``reason`` for ``cgc run`` to print and for the graph's
bindings.

``probe_gpu_uuid()`` is what an actor reports at set-up.

Example:
    >>> b = bind_communicators({0: [("n1", "GPU-a"), ("n1", "GPU-a")],
    ...                         1: [("n1", "GPU-a"), ("n1", "GPU-b")]})
    >>> b[0].transport is Transport.CUDA_IPC, b[1].transport == "nccl"
    (True, True)
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from cgc.plan_schema.defaults import COMMUNICATORS
from cgc.plan_schema.errors import ConfigError
from cgc.runtime.errors import SetupError

__all__ = ["Binding", "Transport", "TRANSPORTS", "CHOICES", "bind_communicators", "probe_gpu_uuid",
           "fake_hosts_enabled", "FAKE_HOSTS_ENV", "DEVICE_PROTOCOL_ON_CPU_ENV"]



class Transport(enum.StrEnum):
    """What a plan communicator is bound to; each member is its plain name (``"nccl"`` ==
    ``Transport.NCCL``), so bindings compare, print and serialize as the names do.

    Example:
        >>> Transport("cuda_ipc") is Transport.CUDA_IPC, f"{Transport.NCCL}"
        (True, 'nccl')
    """

    NCCL = "nccl"
    CUDA_IPC = "cuda_ipc"
    HOST_STAGING = "host_staging"
    CPU = "cpu"
    #: Test mode only (``DEVICE_PROTOCOL_ON_CPU_ENV``; ``testing.cpu_protocol``).
    CPU_PROTOCOL = "cpu_protocol"


#: The transports a plan is bound to outside the test modes.
TRANSPORTS = (Transport.NCCL, Transport.CUDA_IPC, Transport.HOST_STAGING, Transport.CPU)
CHOICES = COMMUNICATORS  # the run option communicator=, spelled once (plan_schema.defaults)
#: The test switches (module doc): "1" turns a test mode of ``cgc.runtime.comm.testing`` on.
FAKE_HOSTS_ENV = "CGC_NCCL_FAKE_HOSTS"
DEVICE_PROTOCOL_ON_CPU_ENV = "CGC_TEST_DEVICE_PROTOCOL"


class Binding(NamedTuple):
    """The transport of one communicator and why."""

    transport: Transport
    reason: str


def _gpus(members: Sequence[tuple[str, str | None]]) -> str:
    return ", ".join(f"rank {r}: {g or 'no GPU'}" for r, (_, g) in enumerate(members))


def bind_one(members: Sequence[tuple[str, str | None]], choice: str = "auto",
             fake_hosts: bool = False, name: str = "communicator") -> Binding:
    """The binding of one communicator (see module doc).

    Raises:
        SetupError: ``choice == "nccl"`` and the members cannot run NCCL.
        ConfigError: unknown ``choice``.
    """
    if choice not in CHOICES:
        raise ConfigError(f"communicator={choice!r}: use one of {', '.join(CHOICES)}")
    if not members:
        raise SetupError(f"{name} has no members")
    if choice == "cpu":
        return Binding(Transport.CPU, "communicator='cpu' was requested")
    uuids = [g for _, g in members]
    nodes = sorted({n for n, _ in members})
    spans = f" across {len(nodes)} nodes" if len(nodes) > 1 else ""
    have = [g is not None for g in uuids]
    if not any(have) or not all(have):
        why = ("no member has a GPU" if not any(have)
               else f"some members have no GPU ({_gpus(members)})")
        if choice == "nccl":
            raise SetupError(f"{name}: communicator='nccl' but {why}")
        if not any(have):
            return Binding(Transport.CPU, why)
        note = "; the CPU communicator is single-node" if spans else ""
        return Binding(Transport.HOST_STAGING,
                       f"{why}: tensors staged through pinned host memory{note}")
    gpus = [(n, g) for n, g in members]  # a real UUID is unique; the pair covers fallbacks
    distinct = len(set(gpus)) == len(gpus)
    if distinct:
        return Binding(Transport.NCCL, f"every member on its own GPU{spans}")
    if fake_hosts:
        return Binding(Transport.NCCL, f"test mode {FAKE_HOSTS_ENV}=1: ranks sharing a GPU "
                                       "join NCCL as separate hosts over sockets")
    if choice == "nccl":
        raise SetupError(f"{name}: communicator='nccl' but members share a GPU "
                         f"({_gpus(members)}); NCCL refuses two ranks on one device - "
                         "use communicator='auto' (CUDA IPC between actors on one GPU)")
    if len(set(gpus)) == 1:
        return Binding(Transport.CUDA_IPC, f"all {len(members)} members on GPU {uuids[0]}")
    return Binding(Transport.HOST_STAGING, f"some members share a GPU and some do not "
                                           f"({_gpus(members)}): tensors staged through "
                                           "pinned host memory")


def bind_communicators(comms: Mapping[int, Sequence[tuple[str, str | None]]],
                       choice: str = "auto", fake_hosts: bool | None = None
                       ) -> dict[int, Binding]:
    """The binding of every communicator (id -> members' (node, GPU UUID) in rank order).

    ``fake_hosts`` defaults to ``fake_hosts_enabled()``. Deterministic: same input, same
    output.

    Raises:
        SetupError: ``choice == "nccl"`` and some communicator cannot run NCCL.
        ConfigError: unknown ``choice``.
    """
    if fake_hosts is None:
        fake_hosts = fake_hosts_enabled()
    out = {cid: bind_one(comms[cid], choice, fake_hosts, f"communicator {cid}")
           for cid in sorted(comms)}
    if os.environ.get(DEVICE_PROTOCOL_ON_CPU_ENV, "") == "1":
        from cgc.runtime.comm.testing.cpu_protocol import device_protocol_on_cpu

        out = device_protocol_on_cpu(out)
    return out


def fake_hosts_enabled() -> bool:
    """True when the test-only fake-hosts mode is on (``CGC_NCCL_FAKE_HOSTS=1``)."""
    return os.environ.get(FAKE_HOSTS_ENV, "") == "1"


def probe_gpu_uuid() -> str | None:
    """This process's CUDA device as ``"GPU-<uuid>"`` (torch's device properties, else NVML),
    or None without CUDA.

    Example:
        >>> import torch
        >>> (probe_gpu_uuid() is None) == (not torch.cuda.is_available())
        True
    """
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    u = getattr(props, "uuid", None)
    if u is not None and str(u):
        s = str(u)
        return s if s.startswith("GPU-") else f"GPU-{s}"
    try:  # very old torch: ask NVML for the device with the same PCI bus id
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        bus = torch.cuda.get_device_properties(idx).pci_bus_id
        h = pynvml.nvmlDeviceGetHandleByPciBusId(str(bus))
        s = pynvml.nvmlDeviceGetUUID(h)
        return s.decode() if isinstance(s, bytes) else s
    except Exception:  # noqa: BLE001 - named by index; the binder pairs it with the node
        vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        return f"GPU-index-{vis[idx] if idx < len(vis) and vis[idx] else idx}"
