"""Every communicator and channel end implements its whole interface (``Communicator``;
``ChannelReader``/``ChannelWriter``), so callers need no fallbacks."""

from __future__ import annotations

import importlib
import inspect
import os
import threading

import pytest

from cgc.runtime.channels import ChannelClosedError, ShmRingReader, ShmRingWriter
from cgc.runtime.channels.ends import ChannelReader, ChannelWriter
from cgc.runtime.channels.tcp import TcpReader, TcpWriter
from cgc.runtime.comm.cpu import CpuCommunicator
from cgc.runtime.comm.interface import Communicator, ExchangingCommunicator

KEY = os.urandom(32)
_COMM_MODULES = ["cgc.runtime.comm.cpu", "cgc.runtime.comm.cuda_ipc",
                 "cgc.runtime.comm.host_staging", "cgc.runtime.comm.nccl", "cgc.runtime.comm.torchdist"]
_BASES = {Communicator, ExchangingCommunicator}


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def _communicators():
    for m in _COMM_MODULES:
        importlib.import_module(m)
    return {c for c in _all_subclasses(Communicator) if c not in _BASES}


def test_every_communicator_class_implements_the_whole_interface():
    classes = _communicators()
    names = {c.__name__ for c in classes}
    assert {"CpuCommunicator", "CudaIpcCommunicator", "HostStagingCommunicator",
            "NcclCommunicator", "TorchDistCommunicator"} <= names
    for cls in classes:
        assert not inspect.isabstract(cls), (cls.__name__, cls.__abstractmethods__)
        for meth in ("abort", "warm_up", "destroy", "send", "recv", "allreduce"):
            assert callable(getattr(cls, meth)), (cls.__name__, meth)
        assert "linger" in inspect.signature(cls.destroy).parameters, cls.__name__
        assert list(inspect.signature(cls.warm_up).parameters)[:4] == [
            "self", "peers", "timeout", "collective"], cls.__name__
        assert hasattr(cls, "last_event"), cls.__name__


def test_the_abc_declares_what_callers_use():
    assert {"abort", "warm_up", "destroy", "send", "recv", "allreduce", "allgather",
            "reducescatter"} <= Communicator.__abstractmethods__
    assert Communicator.last_event is None


def test_cpu_communicator_warm_up_abort_and_destroy():
    c = CpuCommunicator(f"cgc-t-ifc-{os.getpid()}-", 0, 1)
    assert c.last_event is None
    c.warm_up([], timeout=1.0, collective=True)
    assert c.allgather(3) == [3]
    c.abort()
    c.abort()  # idempotent
    c.destroy(linger=0.0)


def test_ring_ends_are_channel_ends(prefix):
    name = f"{prefix}ifc"
    w = ShmRingWriter.create(name, slots=2, slot_bytes=4096)
    r = ShmRingReader.attach(name, 0)
    try:
        assert isinstance(w, ChannelWriter) and isinstance(r, ChannelReader)
        w.write(7, timeout=5)
        assert r.read(timeout=5) == 7 and r.position == 1 and r.last_nbytes >= 0
    finally:
        r.detach()
        w.close()


def test_device_reader_is_a_channel_end(prefix):
    from cgc.runtime.devices import DeviceReader

    name = f"{prefix}ifd"
    w = ShmRingWriter.create(name, slots=2, slot_bytes=4096)
    r = DeviceReader(ShmRingReader.attach(name, 0), "cpu")
    try:
        assert isinstance(r, ChannelReader)
        w.write(5, timeout=5)
        assert r.read(timeout=5) == 5 and r.position == 1
    finally:
        r.detach()
        w.close()


def test_tcp_ends_are_channel_ends_and_detach_lets_go_of_the_connection():
    w = TcpWriter.listen("127.0.0.1", 0, num_readers=1, secret=KEY, channel="g-ifc")
    got: list[TcpReader] = []
    t = threading.Thread(target=lambda: got.append(TcpReader.connect(
        "127.0.0.1", w.port, reader_index=0, secret=KEY, channel="g-ifc", timeout=30)))
    t.start()
    w.accept(timeout=30)
    t.join(30)
    (r,) = got
    try:
        assert isinstance(w, ChannelWriter) and isinstance(r, ChannelReader)
        w.write(11, timeout=5)
        assert r.read(timeout=5) == 11 and r.position == 1
        r.detach()
        with pytest.raises(ChannelClosedError):
            for _ in range(1000):  # the writer learns of it at a later write
                w.write(b"x" * 4096, timeout=5)
    finally:
        w.close()
