"""Child-process entry points for cross-process channel tests (run under 'spawn')."""

from __future__ import annotations

import resource
import time
import traceback


def _report(q, fn, *args):
    try:
        q.put(("ok", fn(*args)))
    except BaseException as e:  # noqa: BLE001 - the parent asserts on the type name
        q.put(("err", type(e).__name__, str(e), traceback.format_exc()))


def idle_reader(q, name, seconds, windows=1):
    """Block on an empty channel ``windows`` times for ``seconds`` each; report
    [(wall s, cpu s, error type)] per window (see the test for why several)."""
    from cgc.runtime.channels import ChannelTimeoutError, ShmRingReader

    def run():
        r = ShmRingReader.attach(name, 0)
        try:  # warm up: first-call costs (ctypes, page faults of a fresh process) excluded
            r.read(timeout=0.05)
        except ChannelTimeoutError:
            pass
        out = []
        for _ in range(windows):
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.monotonic()
            try:
                r.read(timeout=seconds)
                err = None
            except ChannelTimeoutError as e:
                err = type(e).__name__
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            out.append((time.monotonic() - t0, cpu, err))
        r.detach()
        return out

    _report(q, run)


def blocked_reader(q, name, index):
    """Read until an error; report the values and the error type."""
    from cgc.runtime.channels import ShmRingReader

    def run():
        r = ShmRingReader.attach(name, index)
        q.put(("ready",))
        got = []
        try:
            while True:
                got.append(r.read(timeout=20))
        except Exception as e:  # noqa: BLE001
            return got, type(e).__name__
        finally:
            r.detach()

    _report(q, run)


def blocked_writer(q, name):
    """Write until an error (the ring fills up: nobody reads); report the error type."""
    from cgc.runtime.channels import ShmRingWriter

    def run():
        w = ShmRingWriter.create(name, slots=2, slot_bytes=256)
        q.put(("ready",))
        n = 0
        try:
            while True:
                w.write(n, timeout=20)
                n += 1
        except Exception as e:  # noqa: BLE001
            return n, type(e).__name__
        finally:
            w.close()

    _report(q, run)


def echo_reader(q, name_in, name_out, count):
    """Read ``count`` values from one ring and write them back on another."""
    from cgc.runtime.channels import ShmRingReader, ShmRingWriter

    def run():
        r = ShmRingReader.attach(name_in, 0)
        w = ShmRingWriter.create(name_out, slots=2, slot_bytes=4096)
        for _ in range(count):
            w.write(r.read(timeout=20), timeout=20)
        w.close(linger=10)
        r.detach()
        return count

    _report(q, run)


KEY = b"k" * 32  # the tests' graph secret


def tcp_reader(q, port, count):
    """Read ``count`` values over TCP; report them summarized, then the terminal error."""
    import numpy as np

    from cgc.runtime.channels import TcpReader

    def run():
        r = TcpReader.connect("127.0.0.1", port, reader_index=0, secret=KEY, timeout=20)
        out = []
        for _ in range(count):
            v = r.read(timeout=20)
            out.append(int(v.sum()) if isinstance(v, np.ndarray) else v)
        try:
            r.read(timeout=20)
            end = None
        except Exception as e:  # noqa: BLE001
            end = type(e).__name__
        r.close()
        return out, end

    _report(q, run)


def comm_rank(q, prefix, rank, world, script):
    """Run a communicator script on one rank; report its results."""
    import numpy as np
    import torch

    from cgc.runtime.comm import CpuCommunicator

    def run():
        c = CpuCommunicator(prefix, rank, world, attach_timeout=30)
        out = []
        try:
            if script == "rendezvous":
                if rank == 0:
                    c.send("sync", 1, timeout=20)
                    t0 = time.monotonic()
                    c.send(np.arange(5), 1, timeout=20)
                    out.append(time.monotonic() - t0)  # ~ the receiver's delay
                    c.send({"k": 2}, 1, timeout=20)
                    out.append(c.recv(1, timeout=20))
                else:
                    assert c.recv(0, timeout=20) == "sync"
                    time.sleep(0.5)
                    out.append(c.recv(0, timeout=20).tolist())
                    out.append(c.recv(0, timeout=20))
                    c.send("back", 0, timeout=20)
            else:
                x = np.arange(6, dtype=np.float64) + rank
                t = torch.arange(6, dtype=torch.float32) * (rank + 1)
                for op in ("sum", "product", "max", "min", "avg"):
                    out.append((op, c.allreduce(x, op, timeout=20).tolist(),
                                c.allreduce(t, op, timeout=20).tolist()))
                out.append(("gather", [v.tolist() for v in c.allgather(x, timeout=20)]))
                big = np.full(1 << 18, rank, dtype=np.int64)
                out.append(("bigsum", int(c.allreduce(big, timeout=20)[0])))
                out.append(("rs", c.reducescatter(x, "sum", timeout=20).tolist(),
                            c.reducescatter(t, "max", timeout=20).tolist()))
        finally:
            c.destroy()
        return out

    _report(q, run)


class ExplodesElsewhere:
    """Pickles anywhere; unpickling raises in every process but the one named by ``pid``."""

    def __init__(self, pid):
        self.pid = pid

    def __reduce__(self):
        return (_rebuild_here_only, (self.pid,))


def _rebuild_here_only(pid):
    import os

    if os.getpid() != pid:
        raise RuntimeError(f"cannot be decoded outside process {pid}")
    return ExplodesElsewhere(pid)


def summarize(v):
    """A picklable summary of a value read from a channel."""
    import numpy as np

    from cgc.runtime.channels import ErrorValue

    if isinstance(v, ErrorValue):
        return (v.cause, v.position, v.type_name)
    if isinstance(v, np.ndarray):
        return ("arr", int(v.sum()))
    return ("val", v)


def collect_reader(q, name, count):
    """Read ``count`` values from ring ``name`` (reader 0); report their summaries."""
    from cgc.runtime.channels import ShmRingReader

    def run():
        r = ShmRingReader.attach(name, 0, timeout=30)
        try:
            return [summarize(r.read(timeout=20)) for _ in range(count)], r.position
        finally:
            r.detach()

    _report(q, run)


def collect_tcp_reader(q, port, count):
    """Read ``count`` values over TCP as reader 0; report their summaries."""
    from cgc.runtime.channels import TcpReader

    def run():
        r = TcpReader.connect("127.0.0.1", port, reader_index=0, secret=KEY, timeout=20)
        try:
            return [summarize(r.read(timeout=20)) for _ in range(count)], r.position
        finally:
            r.close()

    _report(q, run)


def attach_and_sleep(q, name, index):
    """Attach as reader ``index``, say so, then never read (the parent kills us)."""
    from cgc.runtime.channels import ShmRingReader

    r = ShmRingReader.attach(name, index, timeout=30)
    q.put(("ready", r.position))
    time.sleep(600)


def create_and_sleep(q, name):
    """Create ring ``name`` and never write (the parent kills us)."""
    from cgc.runtime.channels import ShmRingWriter

    ShmRingWriter.create(name, slots=2, slot_bytes=256)
    q.put(("ready",))
    time.sleep(600)


def rings_then_sleep(q, prefix):
    """Create two rings (one with a data block in use), then wait to be killed."""
    import numpy as np

    from cgc.runtime.channels import ShmRingWriter

    a = ShmRingWriter.create(prefix + "a", slots=2, slot_bytes=256)
    ShmRingWriter.create(prefix + "b", slots=2, slot_bytes=256)
    a.write(np.ones(1 << 17))  # nobody reads: the value's data block stays
    q.put(("ready",))
    time.sleep(600)


def comm_rank_then_sleep(q, prefix, rank, world):
    """Join a CPU communicator, then wait to be killed without sending anything."""
    from cgc.runtime.comm import CpuCommunicator

    CpuCommunicator(prefix, rank, world, attach_timeout=30)
    q.put(("ready",))
    time.sleep(600)


def flood(q, port, source, seconds, keep):
    """Open connections to ``port`` from ``source`` as fast as possible for ``seconds``:
    silent ones, garbage, a plausible proof trickled a byte at a time; at most ``keep``
    open (the oldest closed first). Reports ("go",) after the first ``keep``, then the count."""
    import collections
    import random
    import socket
    import struct

    rnd = random.Random(port)
    plausible = struct.pack("<II", 0x53484743, 0) + bytes(63)  # never completes a proof
    open_ = collections.deque()
    made, said = 0, False
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2,
                                         source_address=(source, 0))
        except OSError:
            time.sleep(0.001)  # the backlog is full or the listener is gone
            continue
        made += 1
        s.setblocking(False)
        kind = made % 4
        try:
            if kind == 1:
                s.send(rnd.randbytes(rnd.randrange(1, 200)))
            elif kind == 2:
                s.send(plausible[:1])
        except OSError:
            pass
        open_.append((s, kind, 1))
        for i, (t, k, off) in enumerate(open_ if made % 16 == 0 else ()):
            if k == 2 and off < len(plausible):
                try:
                    t.send(plausible[off:off + 1])
                except OSError:
                    pass
                open_[i] = (t, k, off + 1)
        while len(open_) > keep:
            open_.popleft()[0].close()
        if not said and made >= keep:
            q.put(("go",))
            said = True
    for t, _k, _o in open_:
        t.close()
    q.put(("done", made))
