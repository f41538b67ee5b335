"""TCP channel for readers on another node: same write/read/close/timeout API as the ring.

The writer listens; each of its ``num_readers`` readers connects. Every message carries a
sequence number; a reader raises ``ChannelSequenceError`` on a gap or duplicate (never
silently reorders or drops). Framing, little-endian::

    u32 magic | u32 kind | u64 seq | u64 pickle_len | u32 nbufs | u32 0 | nbufs x u64 len
    pickle bytes | buffer 0 | buffer 1 | ...

Out-of-band buffers (numpy/torch memory) go straight from the array to the socket with
``sendmsg`` (no copy into a staging buffer) and are received with ``recv_into`` directly
into the bytearray that backs the rebuilt array (one copy: the kernel's).

Example:
    >>> import threading
    >>> from cgc.runtime.channels.tcp import TcpWriter, TcpReader
    >>> w = TcpWriter.listen("127.0.0.1", 0)
    >>> t = threading.Thread(target=w.accept); t.start()
    >>> r = TcpReader.connect("127.0.0.1", w.port); t.join()
    >>> w.write({"x": 1}); r.read(timeout=5)
    {'x': 1}
    >>> r.close(); w.close()
"""

from __future__ import annotations

import select
import socket
import struct
import time
from typing import Any

from .errors import ChannelClosedError, ChannelError, ChannelTimeoutError
from .serial import Serializer, loads

__all__ = ["TcpWriter", "TcpReader", "ChannelSequenceError"]

_MAGIC = 0x54434743  # "CGCT"
_HDR = struct.Struct("<IIQQII")
_DATA, _CLOSE, _POISON = 1, 2, 3
_IOV_MAX = 512


class ChannelSequenceError(ChannelError):
    """A TCP message arrived out of order (gap or duplicate): the stream cannot be trusted."""


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _send_all(sock: socket.socket, parts: list[Any]) -> None:
    views = [memoryview(p).cast("B") for p in parts if len(memoryview(p))]
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        while sent:
            n = views[0].nbytes
            if sent >= n:
                sent -= n
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


class TcpWriter:
    """Writing end: listens, accepts ``num_readers`` connections, sends every value to all."""

    def __init__(self, server: socket.socket, num_readers: int) -> None:
        self._server = server
        self.num_readers = num_readers
        self.port = server.getsockname()[1]
        self.name = f"tcp:{server.getsockname()[0]}:{self.port}"
        self._socks: list[socket.socket] = []
        self._seq = 0
        self._ser = Serializer()
        self._closed = False

    @classmethod
    def listen(cls, host: str = "0.0.0.0", port: int = 0, num_readers: int = 1) -> TcpWriter:
        """Bind and listen (``port=0``: any free port, then read ``.port``).

        Raises:
            OSError: the address cannot be bound.
        """
        srv = socket.create_server((host, port), backlog=max(num_readers, 8))
        return cls(srv, num_readers)

    def accept(self, timeout: float | None = 30.0) -> None:
        """Wait until every reader has connected.

        Raises:
            ChannelTimeoutError: not all readers connected in time.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._socks) < self.num_readers:
            rem = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            self._server.settimeout(rem)
            try:
                s, _ = self._server.accept()
            except TimeoutError:
                raise ChannelTimeoutError(
                    f"{self.name}: {len(self._socks)}/{self.num_readers} readers connected "
                    f"within {timeout} s") from None
            s.settimeout(None)
            _tune(s)
            self._socks.append(s)

    def write(self, value: Any, timeout: float | None = None) -> None:
        """Send ``value`` to every reader (blocks while the peers' socket buffers are full).

        ``timeout`` bounds waiting for readers to connect; a send itself blocks like the
        ring does while the reader is behind (TCP flow control).

        Raises:
            ChannelClosedError: closed here, or a reader went away.
            ChannelTimeoutError: readers did not connect within ``timeout``.
        """
        if self._closed:
            raise ChannelClosedError(f"{self.name} was closed")
        if len(self._socks) < self.num_readers:
            self.accept(timeout if timeout is not None else 30.0)
        data, raws = self._ser.dumps(value)
        self._send(_DATA, data, raws)

    def _send(self, kind: int, data: bytes, raws: list[memoryview]) -> None:
        hdr = _HDR.pack(_MAGIC, kind, self._seq, len(data), len(raws), 0)
        lens = struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws))
        self._seq += 1
        try:
            for s in self._socks:
                _send_all(s, [hdr, lens, data, *raws])
        except OSError as e:
            self._closed = True
            raise ChannelClosedError(f"{self.name}: reader connection lost ({e})") from None

    def poison(self) -> None:
        """Tell readers the channel failed (they raise ChannelClosedError), then close."""
        self._finish(_POISON)

    def close(self) -> None:
        """Tell readers the stream ended, then close the sockets. Idempotent."""
        self._finish(_CLOSE)

    def _finish(self, kind: int) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._send(kind, b"", [])
            except ChannelClosedError:
                pass
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._server.close()


class TcpReader:
    """Reading end; one thread reads at a time (``poison``/``close`` may come from another)."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self._sock = sock
        self.name = name
        self._expect = 0
        self._hdr = bytearray(_HDR.size)
        self._closed = False

    @classmethod
    def connect(cls, host: str, port: int, timeout: float = 30.0) -> TcpReader:
        """Connect to a writer, retrying until it listens (up to ``timeout`` s).

        Raises:
            ChannelTimeoutError: no writer accepted the connection in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                s = socket.create_connection((host, port), timeout=max(timeout, 0.1))
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise ChannelTimeoutError(
                        f"tcp:{host}:{port}: no writer within {timeout} s") from None
                time.sleep(0.01)
        s.settimeout(None)
        _tune(s)
        return cls(s, f"tcp:{host}:{port}")

    def _recv_into(self, buf: Any) -> None:
        mv = memoryview(buf).cast("B")
        got = 0
        n = mv.nbytes
        while got < n:
            k = self._sock.recv_into(mv[got:])
            if k == 0:
                self._closed = True
                raise ChannelClosedError(f"{self.name}: writer connection lost")
            got += k

    def read(self, timeout: float | None = None) -> Any:
        """Receive the next value in order.

        Raises:
            ChannelTimeoutError: nothing started arriving within ``timeout`` s.
            ChannelClosedError: the writer closed/poisoned the channel or went away.
            ChannelSequenceError: a gap or duplicate in the sequence numbers.
        """
        if self._closed:
            raise ChannelClosedError(f"{self.name} was closed")
        if timeout is not None:
            # Only the wait for a message is timed: once it starts we read it whole, so a
            # timeout can never leave the stream mid-message.
            r, _, _ = select.select([self._sock], [], [], max(timeout, 0.0))
            if not r:
                raise ChannelTimeoutError(f"{self.name}: read timed out after {timeout} s")
        try:
            self._recv_into(self._hdr)
            magic, kind, seq, plen, nbufs, _ = _HDR.unpack(self._hdr)
            if magic != _MAGIC:
                raise ChannelSequenceError(f"{self.name}: bad frame magic {magic:#x}")
            if seq != self._expect:
                what = "gap" if seq > self._expect else "duplicate"
                raise ChannelSequenceError(
                    f"{self.name}: message {what}: expected seq {self._expect}, got {seq}")
            self._expect = seq + 1
            if kind != _DATA:
                self._closed = True
                how = "poisoned (a peer failed)" if kind == _POISON else "closed"
                raise ChannelClosedError(f"{self.name} was {how}")
            lens: tuple[int, ...] = ()
            if nbufs:
                tbl = bytearray(8 * nbufs)
                self._recv_into(tbl)
                lens = struct.unpack(f"<{nbufs}Q", tbl)
            data = bytearray(plen)
            self._recv_into(data)
            bufs = []
            for n in lens:
                b = bytearray(n)
                self._recv_into(b)
                bufs.append(b)
        except OSError as e:
            self._closed = True
            raise ChannelClosedError(f"{self.name}: connection error ({e})") from None
        return loads(data, bufs)

    def poison(self) -> None:
        """Wake a blocked ``read`` in another thread (it raises ChannelClosedError)."""
        self.close()

    def close(self) -> None:
        """Close the connection (the writer's next write raises ChannelClosedError)."""
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    detach = close
