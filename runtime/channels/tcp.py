"""TCP channel for readers on another node: same write/read/close/timeout API as the ring.

Set-up (once per connection, never per message; ``tcp_accept``): the writer listens on the
node's own IP and answers connections in a set-up thread until each of its ``num_readers``
readers has connected and both ends have proven they hold the graph's secret; strangers'
connections (silent, slow, garbage, floods) are dropped without delaying the readers for
long. Nothing a stranger sends is ever unpickled.

Frames (``tcp_frame``): ``session``, ``seq``, the body length and the trailer are checked on
every frame, so a stream out of step (gap, duplicate, bytes lost) is a
``ChannelSequenceError``, never a value. A frame larger than ``max_frame_bytes`` (or with
more than 65536 buffers) is refused from its header, before anything is allocated:
``FrameTooLargeError``, and the connection is closed. The writer refuses to send one too
(nothing sent; the channel stays usable).

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
import select
import socket
import struct
import termios
from typing import Any

from cgc.plan_schema.defaults import MAX_FRAME_BYTES
from cgc.runtime.channels.errors import (
    ChannelClosedError,
    ChannelSequenceError,
    ChannelTimeoutError,
    FrameTooLargeError,
    decode_error,
    lost_value,
)
from cgc.runtime.channels.serial import Serializer, loads
from cgc.runtime.channels.tcp_accept import (
    HANDSHAKE_S,
    Acceptor,
    check_secret,
    connect_proven,
    listener,
)
from cgc.runtime.channels.tcp_frame import (
    CLOSE_FRAME,
    DATA_FRAME,
    FRAME_MAGIC,
    HDR,
    MAX_BUFS,
    POISON_FRAME,
    TRL,
    Rx,
    send_all,
    trailer,
)

__all__ = ["TcpWriter", "TcpReader", "ChannelSequenceError", "DEFAULT_MAX_FRAME_BYTES"]

DEFAULT_MAX_FRAME_BYTES = MAX_FRAME_BYTES  # 4 GiB unless the run sets RunConfig.max_frame_bytes
_RXBUF = 64 * 1024  # reader's receive buffer: a small frame arrives in one recv
_DIRECT = 16 * 1024  # a part with this much left is received straight into its bytearray
_RECV_MAX = 1 << 20  # most bytes one receive copies
_TI_RECEIVED = 128  # offset of tcpi_bytes_received in struct tcp_info (Linux >= 4.1)


class TcpWriter:
    """Writing end: listens, accepts its ``num_readers`` proven readers, sends to all."""

    def __init__(self, server: socket.socket, num_readers: int, secret: bytes, channel: str,
                 max_frame_bytes: int, handshake_timeout: float = HANDSHAKE_S) -> None:
        self.num_readers = num_readers
        self.port = server.getsockname()[1]
        self.name = f"tcp:{server.getsockname()[0]}:{self.port}" + (f"/{channel}"
                                                                    if channel else "")
        self.channel = channel
        self.max_frame_bytes = max_frame_bytes
        self._socks: list[socket.socket | None] = [None] * num_readers  # set once joined
        self._sessions = [0] * num_readers
        self._seq = 0
        self._ser = Serializer()
        self._closed = False
        self._joined = False
        self._acc = Acceptor(server, num_readers, bytes(secret), channel, handshake_timeout)

    @property
    def refused(self) -> int:
        """Connections dropped at set-up (failed proof, silent, too slow, evicted, duplicate)."""
        return self._acc.refused

    @property
    def accepting(self) -> bool:
        """The set-up thread still answers connections (some reader has not connected)."""
        return not self._joined and self._acc.thread.is_alive()

    @classmethod
    def listen(cls, host: str, port: int = 0, num_readers: int = 1, *, secret: bytes,
               channel: str = "", max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
               handshake_timeout: float = HANDSHAKE_S) -> TcpWriter:
        """Bind ``host`` (this node's IP; ``port=0``: any free port, then read ``.port``).

        Args:
            secret: the graph's key (>= 16 random bytes), the same for its readers.
            channel: a label both ends share (e.g. the channel's name): a reader of another
                channel fails the proof.
            max_frame_bytes: largest value (pickle + buffers) this channel carries.
            handshake_timeout: seconds a connection has, from being accepted, to prove
                itself (then it is dropped; a real reader connects again).

        Raises:
            ValueError: a wildcard ``host`` or a missing/short secret.
            OSError: the address cannot be bound.
        """
        check_secret(secret)
        srv = listener(host, port, num_readers)
        return cls(srv, num_readers, secret, channel, max_frame_bytes, handshake_timeout)

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
            ChannelClosedError: the set-up thread failed otherwise (the error is chained).
        """
        acc = self._acc
        if not self._joined:
            acc.thread.join(timeout)
            if acc.thread.is_alive():
                raise ChannelTimeoutError(f"{self.name}: {acc.got}/{self.num_readers} readers "
                                          f"connected within {timeout} s")
            self._join()
        if acc.error is not None:
            if isinstance(acc.error, OSError):
                raise acc.error
            raise ChannelClosedError(f"{self.name}: the set-up thread failed "
                                     f"({acc.error!r})") from acc.error

    def _join(self) -> None:
        """The set-up thread has ended: take its readers (no other thread touches them now)."""
        self._acc.stop()
        self._socks = list(self._acc.socks)
        self._sessions = list(self._acc.sessions)
        self._joined = True

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
        if not self._joined or self._acc.error is not None:
            self.accept(timeout if timeout is not None else 30.0)
        data, raws = self._ser.dumps(value)
        size = len(data) + 8 * len(raws)
        for r in raws:
            size += r.nbytes
        if size > self.max_frame_bytes or len(raws) > MAX_BUFS:
            raise FrameTooLargeError(f"{self.name}: a value of {size} bytes exceeds the "
                                     f"channel's maximum of {self.max_frame_bytes} bytes")
        self._send(DATA_FRAME, data, raws, size)

    def _send(self, kind: int, data: bytes, raws: list[memoryview], size: int = 0) -> None:
        seq = self._seq
        lens = struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws)) if raws else b""
        body = size + TRL.size
        try:
            for i, s in enumerate(self._socks):
                if s is not None:
                    ses = self._sessions[i]
                    hdr = HDR.pack(FRAME_MAGIC, kind, seq, len(data), len(raws), 0, ses, body)
                    send_all(s, [hdr, lens, data, *raws, TRL.pack(trailer(ses, seq))])
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
        self._finish(POISON_FRAME)

    def close(self) -> None:
        """Tell readers the stream ended, then close the sockets. Idempotent."""
        self._finish(CLOSE_FRAME)

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
        if not self._joined:
            self._join()

    def _shutdown(self) -> None:
        self._stop_acceptor()
        for sock in self._socks:
            if sock is None:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class TcpReader:
    """Reading end; one thread reads at a time (``poison``/``close`` may come from another).

    ``position``: values consumed so far; ``last_nbytes``: bytes of the last value read.

    Interrupts: a signal handler that raises (KeyboardInterrupt) during ``read`` leaves the
    frame half-received in ``Rx``; the next ``read`` resumes it. Python runs handlers only
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
        self._rx = Rx()
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
        set-up proof as reader ``reader_index``; a writer busy with strangers' connections
        says ``BUSY`` and this connects again, until ``timeout``.

        Raises:
            ChannelTimeoutError: no writer accepted the connection in time.
            ChannelAuthError: the peer is not the writer of this channel (it failed its
                proof, or refused ours): nothing from it was read as data.
        """
        check_secret(secret)
        what = f"tcp:{host}:{port}" + (f"/{channel}" if channel else "")
        s, session = connect_proven(host, port, reader_index, secret, channel, timeout, what)
        return cls(s, what, session, max_frame_bytes)

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
            rx = self._rx = Rx()
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
        self._rx = Rx()
        return value

    def _whole(self, rx: Rx) -> bool:
        """Take a frame that lies whole in the receive buffer (the common, small case) in
        one step; False leaves everything to ``_receive`` (which also reports errors)."""
        lo, hi = self._lo, self._hi
        buf = self._buf
        H = HDR.size
        if hi - lo < H:
            return False
        magic, kind, seq, plen, nbufs, _z, session, body = HDR.unpack_from(buf, lo)
        end = lo + H + body
        if (end > hi or magic != FRAME_MAGIC or kind != DATA_FRAME or session != self._session
                or seq != self._expect or 8 * nbufs + plen + TRL.size > body):
            return False
        p = lo + H
        lens = struct.unpack_from(f"<{nbufs}Q", buf, p) if nbufs else ()
        p += 8 * nbufs
        if (p + plen + sum(lens) + TRL.size != end
                or TRL.unpack_from(buf, end - TRL.size)[0] != trailer(session, seq)):
            return False
        data = buf[p:p + plen]
        p += plen
        bufs = []
        for n in lens:
            bufs.append(buf[p:p + n])
            p += n
        rx.done = (seq, data, bufs, body - TRL.size)
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

    def _recv(self, view: memoryview, rx: Rx) -> None:
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

    def _fill(self, rx: Rx, dst: bytearray, start: int) -> None:
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

    def _receive(self, rx: Rx) -> None:
        H = HDR.size
        self._fill(rx, rx.hdr, 0)
        if rx.head is None:
            magic, kind, seq, plen, nbufs, _z, session, body = HDR.unpack(rx.hdr)
            if magic != FRAME_MAGIC or session != self._session:
                self._fail(ChannelSequenceError(
                    f"{self.name}: a frame header does not belong to this stream (magic "
                    f"{magic:#x}): out of step, the channel is closed"))
            if seq != self._expect:
                what = "gap" if seq > self._expect else "duplicate"
                self._fail(ChannelSequenceError(
                    f"{self.name}: message {what}: expected seq {self._expect}, got {seq}"))
            if kind != DATA_FRAME:
                self._closed = True
                how = "poisoned (a peer failed)" if kind == POISON_FRAME else "closed"
                raise ChannelClosedError(f"{self.name} was {how}")
            if nbufs > MAX_BUFS or body > self.max_frame_bytes + TRL.size:
                self._fail(FrameTooLargeError(
                    f"{self.name}: a frame of {body} bytes ({nbufs} buffers) exceeds the "
                    f"channel's maximum of {self.max_frame_bytes} bytes"))
            if 8 * nbufs + plen + TRL.size > body:
                self._fail(ChannelSequenceError(f"{self.name}: inconsistent frame header"))
            rx.head = (seq, plen, nbufs, body)
        seq, plen, nbufs, body = rx.head
        if rx.table is None:
            rx.table = bytearray(8 * nbufs)
        self._fill(rx, rx.table, H)
        if rx.parts is None:
            lens = struct.unpack(f"<{nbufs}Q", rx.table) if nbufs else ()
            if 8 * nbufs + plen + sum(lens) + TRL.size != body:
                self._fail(ChannelSequenceError(  # checked before allocating the parts
                    f"{self.name}: buffer table does not match the frame length: out of "
                    "step, the channel is closed"))
            rx.parts = [bytearray(plen)] + [bytearray(n) for n in lens]
        start = H + 8 * nbufs
        for part in rx.parts:
            self._fill(rx, part, start)
            start += len(part)
        self._fill(rx, rx.trl, start)
        if TRL.unpack(rx.trl)[0] != trailer(self._session, seq):
            self._fail(ChannelSequenceError(f"{self.name}: frame {seq} does not end where its "
                                            "header says: out of step, the channel is closed"))
        rx.done = (seq, rx.parts[0], rx.parts[1:], body - TRL.size)

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

    def detach(self) -> None:
        """Let go of this end (as ``ShmRingReader.detach``). The connection is this
        reader's own, so letting go closes it: the writer's next write to it raises
        ChannelClosedError, and the writer's other readers are untouched."""
        self.close()
