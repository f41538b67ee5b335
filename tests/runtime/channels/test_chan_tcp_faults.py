"""TCP channels under faults on a loopback proxy: delays, split and coalesced segments keep
every value correct and in order; reordered, duplicated or lost bytes are typed errors."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time

import chan_children as kids
import numpy as np
import pytest

from cgc.runtime.channels import (
    ChannelClosedError,
    ChannelSequenceError,
    TcpReader,
    TcpWriter,
)
from cgc.runtime.channels import tcp_accept as accept_mod
from cgc.runtime.channels import tcp_frame as frame_mod

KEY = kids.KEY
_SETUP = (accept_mod._HELLO.size, accept_mod._WPROOF.size)  # writer -> reader messages before frames


def _recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


class Proxy:
    """Relays one connection to ``port``. Reader -> writer bytes pass as they are; writer ->
    reader bytes go through ``self.down`` (a generator of what to send), after the set-up."""

    def __init__(self, port: int, seed: int, mode: str) -> None:
        self.port = port
        self.rnd = random.Random(seed)
        self.mode = mode
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.listen_port = self.srv.getsockname()[1]
        self.threads = [threading.Thread(target=self._run, daemon=True)]
        self.threads[0].start()
        self.socks: list[socket.socket] = []

    def _run(self):
        try:
            cli, _ = self.srv.accept()
            up = socket.create_connection(("127.0.0.1", self.port))
        except OSError:
            return
        self.socks += [cli, up]
        t = threading.Thread(target=self._pipe, args=(cli, up), daemon=True)
        t.start()
        self.threads.append(t)
        try:
            for n in _SETUP:
                cli.sendall(_recv_exact(up, n))
            getattr(self, "_" + self.mode)(up, cli)
        except (OSError, EOFError):
            pass
        finally:
            try:
                cli.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    @staticmethod
    def _pipe(src, dst):
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass

    def _jitter(self, up, cli):
        """Cut the stream into random pieces (1 B .. 8 KiB), merge some, delay some."""
        pending = b""
        while True:
            up.settimeout(None if not pending else 0.005)
            try:
                chunk = up.recv(self.rnd.choice([1, 7, 100, 4096, 65536]))
            except TimeoutError:
                chunk = None  # nothing more right now: send what is held
            if chunk == b"":
                break
            if chunk:
                pending += chunk
                if self.rnd.random() < 0.3:
                    continue  # coalesce with what comes next
            while pending:
                n = self.rnd.randint(1, 8192)
                cli.sendall(pending[:n])
                pending = pending[n:]
                if self.rnd.random() < 0.05:
                    time.sleep(self.rnd.uniform(0, 0.01))
        cli.sendall(pending)

    def _frames(self, up):
        while True:
            hdr = _recv_exact(up, frame_mod.HDR.size)
            body = struct.unpack_from("<Q", hdr, frame_mod.HDR.size - 8)[0]
            yield hdr + _recv_exact(up, body)

    def _swap(self, up, cli):
        """Deliver frames 0, 1, 3, 2, ...: a reordering TCP itself would never make."""
        frames = self._frames(up)
        for i, f in enumerate(frames):
            if i == 2:
                held = f
                continue
            cli.sendall(f)
            if i == 3:
                cli.sendall(held)

    def _duplicate(self, up, cli):
        for i, f in enumerate(self._frames(up)):
            cli.sendall(f)
            if i == 1:
                cli.sendall(f)

    def _lose(self, up, cli):
        """Lose 100 bytes in the middle of frame 2 (its pickle)."""
        for i, f in enumerate(self._frames(up)):
            cli.sendall(f[:60] + f[160:] if i == 2 else f)

    def close(self):
        self.srv.close()
        for s in self.socks:
            s.close()
        for t in self.threads:
            t.join(30)


def _value(i):
    kind = i % 5
    if kind == 0:
        return np.arange(i * 1000, dtype=np.int64)  # up to MBs: many segments
    if kind == 1:
        return {"i": i, "s": "x" * (i % 97)}
    if kind == 2:
        return bytes([i % 256]) * (i * 37)
    if kind == 3:
        return (np.full(3, i, dtype=np.float32), [i, -i])
    return i


def _same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _through_proxies(mode, n_readers, count, seed):
    w = TcpWriter.listen("127.0.0.1", 0, num_readers=n_readers, secret=KEY, channel="g-c9")
    proxies = [Proxy(w.port, seed + k, mode) for k in range(n_readers)]
    readers = [TcpReader.connect("127.0.0.1", p.listen_port, reader_index=k, secret=KEY,
                                 channel="g-c9", timeout=30) for k, p in enumerate(proxies)]
    w.accept(timeout=30)
    t = threading.Thread(target=lambda: [w.write(_value(i)) for i in range(count)])
    t.start()
    return w, proxies, readers, t


def _finish(w, proxies, readers, t):
    t.join(60)
    w.close()
    for r in readers:
        r.close()
    for p in proxies:
        p.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_delayed_split_and_coalesced_segments_keep_values_correct_and_in_order(seed):
    count = 150
    w, proxies, readers, t = _through_proxies("jitter", 2, count, seed * 100)
    for i in range(count):
        for r in readers:
            got = r.read(timeout=60)
            assert _same(_value(i), got), (i, got)
    t.join(60)
    w.close()
    for r in readers:  # the end of the stream arrives through the proxy too
        with pytest.raises(ChannelClosedError, match="closed"):
            r.read(timeout=60)
    _finish(w, proxies, readers, t)


@pytest.mark.parametrize("mode,why", [("swap", "gap"), ("duplicate", "duplicate"),
                                      ("lose", "out of step")])
def test_reordered_duplicated_or_lost_bytes_are_typed_errors(mode, why):
    count = 8
    w, proxies, (r,), t = _through_proxies(mode, 1, count, 5)
    assert [_same(_value(i), r.read(timeout=60)) for i in range(2)] == [True, True]
    with pytest.raises(ChannelSequenceError, match=why):
        r.read(timeout=60)  # position 2: never another frame's value
    _finish(w, proxies, [r], t)
