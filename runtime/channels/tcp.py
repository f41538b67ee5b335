"""TCP channel for readers on another node: same write/read/close/timeout API as the ring.

Set-up (once per connection, never per message): the writer listens on the node's own IP
(never a wildcard address); each of its ``num_readers`` readers connects and both prove
they hold the graph's secret (a fresh random key per graph, handed to the actors through
Ray's set-up calls)::

    writer -> reader   "CGHS" | version | nonce_w (32 random bytes)
    reader -> writer   "CGHS" | reader index | nonce_r | HMAC(secret, "reader", channel,
                                                               nonce_w, nonce_r, index)
    writer -> reader   "CGHS" | HMAC(secret, "writer", channel, nonce_w, nonce_r, index)

The writer answers connections in a set-up thread (so no ordering between actors' set-up
steps is needed) that handles pending connections concurrently, drops any that fails the proof (or
is silent for 10 s, or claims a reader index already taken) without reading anything
else from it, accepts exactly one connection per reader index, then closes its listener.
A reader drops a writer that cannot prove itself before reading a single frame. Nothing a
stranger sends is ever unpickled. (Only set-up is authenticated: an attacker who can
already rewrite traffic on the path between two nodes is out of scope, as for Ray's own
data plane.)

Frames, little-endian; ``session`` (8 bytes from the handshake, different per connection),
``seq``, the body length and the trailer are checked on every frame, so a stream out of
step (gap, duplicate, bytes lost) is a ``ChannelSequenceError``, never a value::

    u32 magic | u32 kind | u64 seq | u64 pickle_len | u32 nbufs | u32 0 | u64 session |
    u64 body_len | nbufs x u64 len | pickle bytes | buffer 0 | buffer 1 | ... | u64 trailer

A frame larger than ``max_frame_bytes`` (or with more than 65536 buffers) is refused from
its header, before anything is allocated: ``FrameTooLargeError``, and the connection is
closed. The writer refuses to send one too (nothing sent; the channel stays usable).

Reading: a frame is received into a per-frame state object, so a read interrupted by a
signal resumes where it stopped; ``position`` (values consumed) moves in one store after
decoding, and an undecodable value is delivered as a ``decode_error`` value for its position, as
in the ring; ``read_at(p)`` gives value ``p`` or an error value for ``p``, never another.

Out-of-band buffers (numpy/torch memory) go straight from the array to the socket with
``sendmsg`` (no copy into a staging buffer) and are received with ``recv_into`` directly
into the bytearray that backs the rebuilt array (one copy: the kernel's).

Example:
    >>> from cgc.runtime.channels.tcp import TcpWriter, TcpReader
    >>> key = bytes(range(32))
    >>> w = TcpWriter.listen("127.0.0.1", 0, secret=key, channel="doc")  # accepts in a thread
    >>> r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=key, channel="doc")
    >>> w.accept(timeout=5); w.write({"x": 1}); r.read(timeout=5)
    {'x': 1}
    >>> r.close(); w.close()
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import secrets
import select
import selectors
import socket
import struct
import termios
import threading
import time
from typing import Any

from cgc.plan_schema.defaults import MAX_FRAME_BYTES

from .errors import (
    ChannelAuthError,
    ChannelClosedError,
    ChannelSequenceError,
    ChannelTimeoutError,
    FrameTooLargeError,
    decode_error,
    lost_value,
)
from .serial import Serializer, loads

__all__ = ["TcpWriter", "TcpReader", "ChannelSequenceError", "DEFAULT_MAX_FRAME_BYTES"]

_MAGIC = 0x54434743  # "CGCT"
_HS_MAGIC = 0x53484743  # "CGHS"
_VERSION = 2
_HDR = struct.Struct("<IIQQIIQQ")  # magic, kind, seq, plen, nbufs, 0, session, body bytes
_TRL = struct.Struct("<Q")  # after the body: _trailer(session, seq)
_HELLO = struct.Struct("<II32s")  # magic, version, writer nonce
_RPROOF = struct.Struct("<II32s32s")  # magic, reader index, reader nonce, mac
_WPROOF = struct.Struct("<I32s")  # magic, mac
_DATA, _CLOSE, _POISON = 1, 2, 3
_IOV_MAX = 512
_MAX_BUFS = 1 << 16
DEFAULT_MAX_FRAME_BYTES = MAX_FRAME_BYTES  # 4 GiB unless the run sets RunConfig.max_frame_bytes
_HANDSHAKE_S = 10.0  # a pending connection silent this long is dropped
_MAX_PENDING = 64  # pending (unproven) connections kept at once; the oldest go first
_RXBUF = 64 * 1024  # reader's receive buffer: a small frame arrives in one recv
_DIRECT = 16 * 1024  # a part with this much left is received straight into its bytearray
_RECV_MAX = 1 << 20  # most bytes one receive copies
_TI_RECEIVED = 128  # offset of tcpi_bytes_received in struct tcp_info (Linux >= 4.1)
_M64 = (1 << 64) - 1
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "0:0:0:0:0:0:0:0"})


def _mac(secret: bytes, role: bytes, channel: str, nw: bytes, nr: bytes, index: int) -> bytes:
    msg = b"cgc-tcp-2\0" + role + b"\0" + channel.encode() + b"\0" + nw + nr + \
        index.to_bytes(4, "little")
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _session(secret: bytes, channel: str, nw: bytes, nr: bytes, index: int) -> int:
    return int.from_bytes(_mac(secret, b"session", channel, nw, nr, index)[:8], "little")


def _trailer(session: int, seq: int) -> int:
    return (session ^ (seq * 0x9E3779B97F4A7C15)) & _M64


def _check_secret(secret: bytes) -> None:
    if not isinstance(secret, bytes | bytearray) or len(secret) < 16:
        raise ValueError("a TCP channel needs the graph's secret: >= 16 random bytes")


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Why keepalive: a peer *node* that vanishes sends no FIN; probes turn a blocked
    # recv/send into an error within about a minute instead of never.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


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


def _recv_exact(sock: socket.socket, n: int, deadline: float, what: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        rem = deadline - time.monotonic()
        if rem <= 0:
            raise ChannelTimeoutError(f"{what}: set-up timed out")
        sock.settimeout(rem)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            raise ChannelTimeoutError(f"{what}: set-up timed out") from None
        if not chunk:
            raise ChannelAuthError(
                f"{what}: the writer closed the connection during set-up (wrong secret, "
                "wrong channel, or this reader index is already connected)")
        buf += chunk
    return bytes(buf)


class _Pending:
    __slots__ = ("nonce", "buf", "since")

    def __init__(self, nonce: bytes, since: float) -> None:
        self.nonce = nonce
        self.buf = bytearray()
        self.since = since


class TcpWriter:
    """Writing end: listens, accepts its ``num_readers`` proven readers, sends to all."""

    def __init__(self, server: socket.socket, num_readers: int, secret: bytes, channel: str,
                 max_frame_bytes: int) -> None:
        self.num_readers = num_readers
        self.port = server.getsockname()[1]
        self.name = f"tcp:{server.getsockname()[0]}:{self.port}" + (f"/{channel}"
                                                                    if channel else "")
        self.channel = channel
        self.max_frame_bytes = max_frame_bytes
        self._secret = bytes(secret)
        self._socks: list[socket.socket | None] = [None] * num_readers
        self._sessions = [0] * num_readers
        self._seq = 0
        self._ser = Serializer()
        self._closed = False
        self.refused = 0  # connections dropped at set-up (failed proof, silent, duplicate)
        self._accept_error: OSError | None = None
        self._stop_r, self._stop_w = socket.socketpair()
        self._acceptor: threading.Thread | None = threading.Thread(
            target=self._accept_loop, args=(server, self._stop_r), daemon=True,
            name=f"cgc-tcp-accept-{self.port}")
        self._acceptor.start()

    @classmethod
    def listen(cls, host: str, port: int = 0, num_readers: int = 1, *, secret: bytes,
               channel: str = "", max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> TcpWriter:
        """Bind ``host`` (this node's IP; ``port=0``: any free port, then read ``.port``).

        Args:
            secret: the graph's key (>= 16 random bytes), the same for its readers.
            channel: a label both ends share (e.g. the channel's name): a reader of another
                channel fails the proof.
            max_frame_bytes: largest value (pickle + buffers) this channel carries.

        Raises:
            ValueError: a wildcard ``host`` or a missing/short secret.
            OSError: the address cannot be bound.
        """
        if host in _WILDCARDS:
            raise ValueError(f"TCP channel: bind to this node's IP, not {host!r} (a wildcard "
                             "address listens on every network)")
        _check_secret(secret)
        srv = socket.create_server((host, port), backlog=max(num_readers, 8) + _MAX_PENDING)
        return cls(srv, num_readers, secret, channel, max_frame_bytes)

    @property
    def position(self) -> int:
        """Frames sent so far."""
        return self._seq

    def accept(self, timeout: float | None = 30.0) -> None:
        """Wait until every reader index has connected and proven itself (the listener is
        closed then: nobody else can connect).

        Raises:
            ChannelTimeoutError: not all readers proved themselves in time.
            OSError: the listener failed.
        """
        t = self._acceptor
        if t is not None:
            t.join(timeout)
            if t.is_alive():
                got = sum(s is not None for s in self._socks)
                raise ChannelTimeoutError(f"{self.name}: {got}/{self.num_readers} readers "
                                          f"connected within {timeout} s")
            self._acceptor = None
        if self._accept_error is not None:
            raise self._accept_error

    def _accept_loop(self, srv: socket.socket, stop: socket.socket) -> None:
        # Why a thread: a reader's connect() returns only after the proof exchange, so the
        # writer must answer while its owner does other set-up (e.g. connecting its own
        # readers to other actors' writers) - no set-up ordering between actors needed.
        sel = selectors.DefaultSelector()
        sel.register(srv, selectors.EVENT_READ)
        sel.register(stop, selectors.EVENT_READ)
        pending: dict[socket.socket, _Pending] = {}
        try:
            while any(s is None for s in self._socks):
                now = time.monotonic()
                for s in [s for s, p in pending.items() if now - p.since > _HANDSHAKE_S]:
                    self._drop(sel, pending, s)
                for key, _ in sel.select(_HANDSHAKE_S):
                    if key.fileobj is stop:
                        return
                    if key.fileobj is srv:
                        self._take(sel, pending, srv)
                    else:
                        self._step(sel, pending, key.fileobj)  # type: ignore[arg-type]
        except OSError as e:
            self._accept_error = e
        finally:
            for s in list(pending):
                self._drop(sel, pending, s, refused=False)
            sel.close()
            srv.close()

    def _take(self, sel: selectors.BaseSelector, pending: dict, srv: socket.socket) -> None:
        try:
            s, _ = srv.accept()
        except (BlockingIOError, InterruptedError):
            return
        s.setblocking(False)
        nonce = secrets.token_bytes(32)
        try:
            s.send(_HELLO.pack(_HS_MAGIC, _VERSION, nonce))  # 40 bytes: fits a new buffer
        except OSError:
            s.close()
            return
        if len(pending) >= _MAX_PENDING:
            self._drop(sel, pending, min(pending, key=lambda k: pending[k].since))
        pending[s] = _Pending(nonce, time.monotonic())
        sel.register(s, selectors.EVENT_READ)

    def _drop(self, sel: selectors.BaseSelector, pending: dict, s: socket.socket,
              refused: bool = True) -> None:
        pending.pop(s, None)
        try:
            sel.unregister(s)
        except (KeyError, ValueError):
            pass
        s.close()
        self.refused += refused

    def _step(self, sel: selectors.BaseSelector, pending: dict, s: socket.socket) -> None:
        p = pending[s]
        try:
            chunk = s.recv(_RPROOF.size - len(p.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(sel, pending, s)
            return
        p.buf += chunk
        if len(p.buf) < _RPROOF.size:
            return
        magic, idx, nr, mac = _RPROOF.unpack(p.buf)
        ok = (magic == _HS_MAGIC and 0 <= idx < self.num_readers
              and self._socks[idx] is None
              and hmac.compare_digest(mac, _mac(self._secret, b"reader", self.channel,
                                                p.nonce, nr, idx)))
        if not ok:
            self._drop(sel, pending, s)
            return
        pending.pop(s)
        sel.unregister(s)
        try:
            s.setblocking(True)
            s.settimeout(_HANDSHAKE_S)
            s.sendall(_WPROOF.pack(_HS_MAGIC, _mac(self._secret, b"writer", self.channel,
                                                   p.nonce, nr, idx)))
            s.settimeout(None)
            _tune(s)
        except OSError:
            s.close()
            self.refused += 1
            return
        self._sessions[idx] = _session(self._secret, self.channel, p.nonce, nr, idx)
        self._socks[idx] = s

    def write(self, value: Any, timeout: float | None = None) -> None:
        """Send ``value`` to every reader (blocks while the peers' socket buffers are full).

        ``timeout`` bounds waiting for readers to connect; a send itself blocks like the
        ring does while the reader is behind (TCP flow control). An interrupt in the middle
        of a send breaks the channel (readers get ChannelClosedError), never the framing.

        Raises:
            ChannelClosedError: closed here, or a reader went away.
            ChannelTimeoutError: readers did not connect within ``timeout``.
            FrameTooLargeError: the value exceeds ``max_frame_bytes`` (nothing sent).
        """
        if self._closed:
            raise ChannelClosedError(f"{self.name} was closed")
        if self._acceptor is not None:
            self.accept(timeout if timeout is not None else 30.0)
        data, raws = self._ser.dumps(value)
        size = len(data) + 8 * len(raws)
        for r in raws:
            size += r.nbytes
        if size > self.max_frame_bytes or len(raws) > _MAX_BUFS:
            raise FrameTooLargeError(f"{self.name}: a value of {size} bytes exceeds the "
                                     f"channel's maximum of {self.max_frame_bytes} bytes")
        self._send(_DATA, data, raws, size)

    def _send(self, kind: int, data: bytes, raws: list[memoryview], size: int = 0) -> None:
        seq = self._seq
        lens = struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws)) if raws else b""
        body = size + _TRL.size
        try:
            for i, s in enumerate(self._socks):
                if s is not None:
                    ses = self._sessions[i]
                    hdr = _HDR.pack(_MAGIC, kind, seq, len(data), len(raws), 0, ses, body)
                    _send_all(s, [hdr, lens, data, *raws, _TRL.pack(_trailer(ses, seq))])
        except OSError as e:
            self._closed = True
            raise ChannelClosedError(f"{self.name}: reader connection lost ({e})") from None
        except BaseException:
            # Interrupted mid-frame: the byte streams cannot be resumed in step. Break the
            # connections so every reader gets ChannelClosedError, never a torn frame.
            self._closed = True
            self._shutdown()
            raise
        self._seq = seq + 1

    def poison(self) -> None:
        """Tell readers the channel failed (they raise ChannelClosedError), then close."""
        self._finish(_POISON)

    def close(self) -> None:
        """Tell readers the stream ended, then close the sockets. Idempotent."""
        self._finish(_CLOSE)

    def _finish(self, kind: int) -> None:
        self._stop_acceptor()  # first: no reader may join after the last frame
        if not self._closed:
            self._closed = True
            try:
                self._send(kind, b"", [])
            except ChannelClosedError:
                pass
        self._shutdown()

    def _stop_acceptor(self) -> None:
        t = self._acceptor
        if t is not None:
            try:
                self._stop_w.send(b"x")
            except OSError:
                pass
            t.join()
            self._acceptor = None

    def _shutdown(self) -> None:
        self._stop_acceptor()
        for s in (self._stop_r, self._stop_w):
            s.close()
        for sock in self._socks:
            if sock is None:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class _Rx:
    """One frame being received: every field is filled in place, so an interrupted read
    resumes; ``done`` holds a complete frame not yet returned."""

    __slots__ = ("off", "hdr", "head", "table", "parts", "trl", "done")

    def __init__(self) -> None:
        self.off = 0  # bytes of this frame taken off the stream (header included)
        self.hdr = bytearray(_HDR.size)
        self.head: tuple[int, int, int, int] | None = None  # seq, pickle_len, nbufs, body
        self.table: bytearray | None = None
        self.parts: list[bytearray] | None = None
        self.trl = bytearray(_TRL.size)
        self.done: tuple[int, bytearray, list[bytearray], int] | None = None


class TcpReader:
    """Reading end; one thread reads at a time (``poison``/``close`` may come from another).

    ``position``: values consumed so far; ``last_nbytes``: bytes of the last value read.

    Interrupts: a signal handler that raises (KeyboardInterrupt) during ``read`` leaves the
    frame half-received in ``_Rx``; the next ``read`` resumes it. Python runs handlers only
    when a call returns or a loop jumps back, and a signal taken by another thread is run
    when the main thread next gets the GIL back - typically as a ``recv_into`` returns,
    before its byte count is stored. So the reader counts every byte it takes, and after an
    interrupted read asks the kernel how many the socket really delivered (bytes received
    minus bytes still queued): the difference is exactly what that last receive wrote, and
    is counted then. Were that ever off, the body length and the trailer of the frame catch
    the shift - ``ChannelSequenceError`` before anything is delivered.
    """

    def __init__(self, sock: socket.socket, name: str, session: int,
                 max_frame_bytes: int) -> None:
        self._sock = sock
        self.name = name
        self._session = session
        self.max_frame_bytes = max_frame_bytes
        self._expect = 0
        self._rx = _Rx()
        self._buf = bytearray(_RXBUF)
        self._bmv = memoryview(self._buf)
        self._lo = 0  # self._buf[_lo:_hi] is received but not yet taken
        self._hi = 0
        self._closed = False
        self.last_nbytes = 0
        self._poller = select.poll()  # not select(): it fails for fds above 1023
        self._poller.register(sock, select.POLLIN)
        self._into_buf = True  # where the receive in progress counts its bytes
        self._dirty = False  # a receive was interrupted: _recover() before the next one
        self._taken = 0
        self._taken = self._kernel_taken() or 0  # the set-up bytes

    @classmethod
    def connect(cls, host: str, port: int, *, reader_index: int, secret: bytes,
                channel: str = "", timeout: float = 30.0,
                max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> TcpReader:
        """Connect to a writer (retrying until it listens, up to ``timeout`` s) and run the
        set-up proof as reader ``reader_index``.

        Raises:
            ChannelTimeoutError: no writer accepted the connection in time.
            ChannelAuthError: the peer is not the writer of this channel (it failed its
                proof, or refused ours): nothing from it was read as data.
        """
        _check_secret(secret)
        what = f"tcp:{host}:{port}" + (f"/{channel}" if channel else "")
        deadline = time.monotonic() + timeout
        while True:
            try:
                s = socket.create_connection((host, port), timeout=max(timeout, 0.1))
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise ChannelTimeoutError(f"{what}: no writer within {timeout} s") from None
                time.sleep(0.01)
        try:
            hs_deadline = max(deadline, time.monotonic() + 1.0)
            magic, version, nw = _HELLO.unpack(_recv_exact(s, _HELLO.size, hs_deadline, what))
            if magic != _HS_MAGIC or version != _VERSION:
                raise ChannelAuthError(f"{what}: the peer is not a cgc TCP channel writer "
                                       f"(magic {magic:#x}, version {version})")
            nr = secrets.token_bytes(32)
            s.sendall(_RPROOF.pack(_HS_MAGIC, reader_index, nr,
                                   _mac(secret, b"reader", channel, nw, nr, reader_index)))
            magic, mac = _WPROOF.unpack(_recv_exact(s, _WPROOF.size, hs_deadline, what))
            want = _mac(secret, b"writer", channel, nw, nr, reader_index)
            if magic != _HS_MAGIC or not hmac.compare_digest(mac, want):
                raise ChannelAuthError(f"{what}: the peer failed the writer's proof (not "
                                       "this graph's writer): dropped before reading data")
            s.settimeout(None)
            _tune(s)
        except BaseException:
            s.close()
            raise
        return cls(s, what, _session(secret, channel, nw, nr, reader_index), max_frame_bytes)

    @property
    def position(self) -> int:
        """Values consumed so far."""
        return self._expect

    def read_at(self, position: int, timeout: float | None = None) -> Any:
        """The value at ``position``: the value, a ``decode_error`` value for it, or a
        ``lost_value`` when an interrupted read consumed it (see the ring's ``read_at``).

        Raises:
            ChannelSequenceError: ``position`` is ahead of the next unread value.
            The errors of ``read``.
        """
        pos = self._expect
        if position == pos:
            return self.read(timeout)
        if position < pos:
            return lost_value(self.name, position)
        raise ChannelSequenceError(f"{self.name}: value {position} asked for, but the next "
                                   f"unread one is {pos}")

    def read(self, timeout: float | None = None) -> Any:
        """Receive the next value in order (a ``decode_error`` value if it cannot be decoded).

        Raises:
            ChannelTimeoutError: nothing started arriving within ``timeout`` s.
            ChannelClosedError: the writer closed/poisoned the channel or went away.
            ChannelSequenceError: a gap, duplicate or out-of-step frame (connection closed).
            FrameTooLargeError: the frame exceeds ``max_frame_bytes`` (connection closed).
        """
        if self._closed:
            raise ChannelClosedError(f"{self.name} was closed")
        if self._dirty:
            self._recover()
        rx = self._rx
        if rx.done is not None and rx.done[0] < self._expect:  # returned, then interrupted
            rx = self._rx = _Rx()
        if rx.done is None:
            if timeout is not None and rx.off == 0 and self._lo == self._hi:
                # Only the wait for a message is timed: once it starts we read it whole, so a
                # timeout can never leave the stream mid-message.
                if not self._poller.poll(max(timeout, 0.0) * 1000):
                    raise ChannelTimeoutError(f"{self.name}: read timed out after {timeout} s")
            self._dirty = True  # cleared when the frame is whole; else _recover() next time
            try:
                if rx.off:
                    self._receive(rx)  # resume an interrupted frame
                else:
                    if self._lo == self._hi:
                        self._refill()
                    if not self._whole(rx):
                        self._receive(rx)
            except OSError as e:
                self._closed = True
                raise ChannelClosedError(f"{self.name}: connection error ({e})") from None
            self._dirty = False
        seq, data, bufs, nbytes = rx.done  # type: ignore[misc]
        self.last_nbytes = nbytes
        try:
            value = loads(data, bufs)
        except Exception as e:  # noqa: BLE001 - any decode failure becomes this value's error
            value = decode_error(self.name, seq, e)
        self._expect = seq + 1  # consumed: one store
        self._rx = _Rx()
        return value

    def _whole(self, rx: _Rx) -> bool:
        """Take a frame that lies whole in the receive buffer (the common, small case) in
        one step; False leaves everything to ``_receive`` (which also reports errors)."""
        lo, hi = self._lo, self._hi
        buf = self._buf
        H = _HDR.size
        if hi - lo < H:
            return False
        magic, kind, seq, plen, nbufs, _z, session, body = _HDR.unpack_from(buf, lo)
        end = lo + H + body
        if (end > hi or magic != _MAGIC or kind != _DATA or session != self._session
                or seq != self._expect or 8 * nbufs + plen + _TRL.size > body):
            return False
        p = lo + H
        lens = struct.unpack_from(f"<{nbufs}Q", buf, p) if nbufs else ()
        p += 8 * nbufs
        if (p + plen + sum(lens) + _TRL.size != end
                or _TRL.unpack_from(buf, end - _TRL.size)[0] != _trailer(session, seq)):
            return False
        data = buf[p:p + plen]
        p += plen
        bufs = []
        for n in lens:
            bufs.append(buf[p:p + n])
            p += n
        rx.done = (seq, data, bufs, body - _TRL.size)
        self._lo = end  # with the store above: no handler runs in between
        return True

    def _refill(self) -> None:
        lo, hi = self._lo, self._hi
        if lo == hi:
            self._lo = self._hi = 0
        elif hi > _RXBUF - 4096:  # compact: keep room for a whole small frame
            self._bmv[:hi - lo] = bytes(self._bmv[lo:hi])  # a copy: the ranges may overlap
            self._lo, self._hi = 0, hi - lo
        self._into_buf = True
        self._recv(self._bmv[self._hi:], self._rx)

    def _recv(self, view: memoryview, rx: _Rx) -> None:
        """One receive into ``view``: counted in ``_hi`` (when ``_into_buf``) or ``rx.off``."""
        k = self._sock.recv_into(view, min(len(view), _RECV_MAX))
        # A handler that raises right here loses k: _recover() finds it again from the
        # kernel's counters. Below, stores only: no handler can run between them.
        if self._into_buf:
            self._hi += k
        else:
            rx.off += k
        self._taken += k
        if k == 0:
            self._closed = True
            raise ChannelClosedError(f"{self.name}: writer connection lost")

    def _kernel_taken(self) -> int | None:
        """Bytes this socket handed to us so far, from the kernel (None: not available)."""
        fd = self._sock.fileno()
        for _ in range(100):
            a = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
            info = self._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            if len(info) < _TI_RECEIVED + 8:
                return None  # kernel older than 4.1
            if fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0") == a:  # nothing arrived between
                got = struct.unpack_from("<Q", info, _TI_RECEIVED)[0]
                return got - struct.unpack("<i", a)[0]
        return None

    def _recover(self) -> None:
        """After an interrupted receive: count the bytes its last ``recv_into`` delivered."""
        true = self._kernel_taken()
        if true is not None and true > self._taken:
            lost = true - self._taken
            if self._into_buf:
                self._hi += lost
            else:
                self._rx.off += lost
            self._taken = true
        self._dirty = False

    def _fill(self, rx: _Rx, dst: bytearray, start: int) -> None:
        """Complete the part of the frame at offsets ``start..start+len(dst)`` into ``dst``."""
        n = len(dst)
        mv = memoryview(dst)
        while rx.off < start + n:
            at = rx.off - start
            avail = self._hi - self._lo
            if avail:
                m = n - at if n - at < avail else avail
                lo = self._lo
                mv[at:at + m] = self._bmv[lo:lo + m]
                rx.off += m  # with the next store: no handler runs in between
                self._lo = lo + m
            elif n - at >= _DIRECT:
                self._into_buf = False
                self._recv(mv[at:], rx)
            else:
                self._refill()

    def _fail(self, err: Exception) -> None:
        self.close()
        raise err

    def _receive(self, rx: _Rx) -> None:
        H = _HDR.size
        self._fill(rx, rx.hdr, 0)
        if rx.head is None:
            magic, kind, seq, plen, nbufs, _z, session, body = _HDR.unpack(rx.hdr)
            if magic != _MAGIC or session != self._session:
                self._fail(ChannelSequenceError(
                    f"{self.name}: a frame header does not belong to this stream (magic "
                    f"{magic:#x}): out of step, the channel is closed"))
            if seq != self._expect:
                what = "gap" if seq > self._expect else "duplicate"
                self._fail(ChannelSequenceError(
                    f"{self.name}: message {what}: expected seq {self._expect}, got {seq}"))
            if kind != _DATA:
                self._closed = True
                how = "poisoned (a peer failed)" if kind == _POISON else "closed"
                raise ChannelClosedError(f"{self.name} was {how}")
            if nbufs > _MAX_BUFS or body > self.max_frame_bytes + _TRL.size:
                self._fail(FrameTooLargeError(
                    f"{self.name}: a frame of {body} bytes ({nbufs} buffers) exceeds the "
                    f"channel's maximum of {self.max_frame_bytes} bytes"))
            if 8 * nbufs + plen + _TRL.size > body:
                self._fail(ChannelSequenceError(f"{self.name}: inconsistent frame header"))
            rx.head = (seq, plen, nbufs, body)
        seq, plen, nbufs, body = rx.head
        if rx.table is None:
            rx.table = bytearray(8 * nbufs)
        self._fill(rx, rx.table, H)
        if rx.parts is None:
            lens = struct.unpack(f"<{nbufs}Q", rx.table) if nbufs else ()
            if 8 * nbufs + plen + sum(lens) + _TRL.size != body:
                self._fail(ChannelSequenceError(  # checked before allocating the parts
                    f"{self.name}: buffer table does not match the frame length: out of "
                    "step, the channel is closed"))
            rx.parts = [bytearray(plen)] + [bytearray(n) for n in lens]
        start = H + 8 * nbufs
        for part in rx.parts:
            self._fill(rx, part, start)
            start += len(part)
        self._fill(rx, rx.trl, start)
        if _TRL.unpack(rx.trl)[0] != _trailer(self._session, seq):
            self._fail(ChannelSequenceError(f"{self.name}: frame {seq} does not end where its "
                                            "header says: out of step, the channel is closed"))
        rx.done = (seq, rx.parts[0], rx.parts[1:], body - _TRL.size)

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
