"""The ``cpu_protocol`` test mode (``binding.DEVICE_PROTOCOL_ON_CPU_ENV``, CI without a GPU).

With ``CGC_TEST_DEVICE_PROTOCOL=1`` every ``cpu`` binding becomes ``cpu_protocol``: the
device communicators' protocol (headers, static edges, errors as values, native
collectives) over CPU tensors (``cpu_transport.ShmCpuTransport``), so the executor's device
paths run without a GPU. ``factory.open_device_communicator`` opens such a binding with
``cpu_transport.cpu_device_communicator``.

Example:
    >>> from cgc.runtime.comm.binding import Binding, Transport
    >>> b = device_protocol_on_cpu({0: Binding(Transport.CPU, "no member has a GPU")})
    >>> str(b[0].transport)
    'cpu_protocol'
"""

from __future__ import annotations

from collections.abc import Mapping

from cgc.runtime.comm.binding import DEVICE_PROTOCOL_ON_CPU_ENV, Binding, Transport

__all__ = ["device_protocol_on_cpu"]


def device_protocol_on_cpu(bindings: Mapping[int, Binding]) -> dict[int, Binding]:
    """``bindings`` with every ``cpu`` binding turned into ``cpu_protocol`` (module doc).

    Raises nothing.

    Example: see the module doc.
    """
    return {cid: (Binding(Transport.CPU_PROTOCOL, f"{b.reason} (test mode "
                          f"{DEVICE_PROTOCOL_ON_CPU_ENV}=1: the device protocol on CPU)")
                  if b.transport is Transport.CPU else b) for cid, b in bindings.items()}
