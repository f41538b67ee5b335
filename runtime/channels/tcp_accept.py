"""The authenticated set-up of a TCP channel: the handshake both ends run, the writer's
acceptor thread, and the reader's connect-and-prove. (``tcp`` holds the channel ends that
use them, ``tcp_frame`` the frame format after set-up.)

Once per connection, never per message: the writer listens on the node's own IP (never a
wildcard address); each of its ``num_readers`` readers connects and both prove they hold
the graph's secret (a fresh random key per graph, handed to the actors through Ray's set-up
calls)::

    writer -> reader   "CGHS" | version | nonce_w (32 random bytes)
    reader -> writer   "CGHS" | reader index | nonce_r | HMAC(secret, "reader", channel,
                                                               nonce_w, nonce_r, index)
    writer -> reader   "CGHS" | HMAC(secret, "writer", channel, nonce_w, nonce_r, index)
    (or, instead: "CGBZ" and a close - dropped unproven, connect again)

The writer answers connections in a set-up thread (so no ordering between actors' set-up
steps is needed) that handles pending connections concurrently, drops any that fails the
proof (or cannot start one, or claims a reader index already taken) without reading anything
else from it, accepts exactly one connection per reader index, then closes its listener.
Strangers cannot lock the readers out (see ``Acceptor``): each connection has 10 s to prove
itself, at most 64 wait at once and a new one evicts the oldest of the busiest peer address
(after reading what it sent), and a connection dropped unproven is told ``BUSY`` - the
reader connects again. A reader drops a writer that cannot prove itself before reading a
single frame. Nothing a stranger sends is ever unpickled. (Only set-up is authenticated: an
attacker who can already rewrite traffic on the path between two nodes is out of scope, as
for Ray's own data plane.)

Example:
    >>> from cgc.runtime.channels.tcp_accept import Acceptor, connect_proven, listener
    >>> key = bytes(range(32))
    >>> acc = Acceptor(listener("127.0.0.1", 0, 1), 1, key, "doc", handshake_s=10.0)
    >>> sock, session = connect_proven("127.0.0.1", acc.port, 0, key, "doc", timeout=5)
    >>> acc.thread.join(5); acc.got, acc.sessions[0] == session
    (1, True)
    >>> acc.stop(); sock.close(); acc.socks[0].close()
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import random
import secrets
import selectors
import socket
import struct
import threading
import time

from cgc.runtime.channels.errors import ChannelAuthError, ChannelTimeoutError

__all__ = ["Acceptor", "connect_proven", "listener", "check_secret", "HANDSHAKE_S"]

_HS_MAGIC = 0x53484743  # "CGHS"
_VERSION = 2
_HELLO = struct.Struct("<II32s")  # magic, version, writer nonce
_RPROOF = struct.Struct("<II32s32s")  # magic, reader index, reader nonce, mac
_WPROOF = struct.Struct("<I32s")  # magic, mac
_BUSY = struct.Struct("<I")  # writer -> a connection it drops unproven: "CGBZ", try again
_BUSY_BYTES = _BUSY.pack(0x5A424743)
_HS_BYTES = struct.pack("<I", _HS_MAGIC)  # how a reader's proof starts
HANDSHAKE_S = 10.0  # a connection must prove itself this soon after it is accepted
_MAX_PENDING = 64  # unproven connections kept at once (see Acceptor: which one goes)
_ACCEPT_BATCH = 16  # connections accepted per round; waiting proofs are read in between
_PAUSE_S = 0.05  # out of file descriptors with none to free: stop accepting this long
_RETRY_MAX_S = 0.1  # a reader told BUSY connects again after at most this (with jitter)
# accept() errors that belong to one connection, not the listener (accept(2), "Error
# handling": Linux passes pending network errors on the new socket through accept).
_TRANSIENT = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ETIMEDOUT,
                        errno.ENETDOWN, errno.ENETUNREACH, errno.EHOSTDOWN, errno.EHOSTUNREACH,
                        errno.ENONET, errno.ENOPROTOOPT, errno.EOPNOTSUPP})
_STARVED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "0:0:0:0:0:0:0:0"})


def _mac(secret: bytes, role: bytes, channel: str, nw: bytes, nr: bytes, index: int) -> bytes:
    msg = b"cgc-tcp-2\0" + role + b"\0" + channel.encode() + b"\0" + nw + nr + \
        index.to_bytes(4, "little")
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _session(secret: bytes, channel: str, nw: bytes, nr: bytes, index: int) -> int:
    return int.from_bytes(_mac(secret, b"session", channel, nw, nr, index)[:8], "little")


def check_secret(secret: bytes) -> None:
    """Refuse a missing or short graph secret.

    Example:
        >>> check_secret(bytes(16))

    Raises:
        ValueError: not bytes, or fewer than 16 of them.
    """
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


def listener(host: str, port: int, num_readers: int) -> socket.socket:
    """A listening socket on ``host`` (this node's IP; ``port=0``: any free port), with a
    backlog for the readers and the waiting strangers.

    Raises:
        ValueError: a wildcard ``host``.
        OSError: the address cannot be bound.
    """
    if host in _WILDCARDS:
        raise ValueError(f"TCP channel: bind to this node's IP, not {host!r} (a wildcard "
                         "address listens on every network)")
    return socket.create_server((host, port), backlog=max(num_readers, 8) + _MAX_PENDING)


class _Busy(Exception):
    """The writer dropped this connection before judging its proof (it had no room, or the
    proof came too late): connect again."""


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
        except ConnectionResetError:
            chunk = b""  # the writer closed before reading all we sent: same as a close
        if not chunk:
            if bytes(buf[:_BUSY.size]) == _BUSY_BYTES:
                raise _Busy
            raise ChannelAuthError(
                f"{what}: the writer closed the connection during set-up (wrong secret, "
                "wrong channel, or this reader index is already connected)")
        buf += chunk
    return bytes(buf)


def _dial(host: str, port: int, deadline: float, timeout: float, what: str) -> socket.socket:
    """A TCP connection to the writer, retrying until it listens or ``deadline`` passes."""
    while True:
        try:
            return socket.create_connection((host, port),
                                            timeout=max(deadline - time.monotonic(), 0.1))
        except OSError:
            if time.monotonic() >= deadline:
                raise ChannelTimeoutError(f"{what}: no writer within {timeout} s") from None
            time.sleep(0.01)


def _prove(s: socket.socket, index: int, secret: bytes, channel: str, deadline: float,
           what: str) -> tuple[bytes, bytes]:
    """The reader's side of the proof exchange on ``s``; returns (writer nonce, ours).

    Raises:
        _Busy: the writer dropped us before judging our proof (connect again).
        ChannelAuthError: the peer is not this channel's writer, or refused our proof.
        ChannelTimeoutError: ``deadline`` passed.
    """
    magic, version, nw = _HELLO.unpack(_recv_exact(s, _HELLO.size, deadline, what))
    if magic != _HS_MAGIC or version != _VERSION:
        raise ChannelAuthError(f"{what}: the peer is not a cgc TCP channel writer "
                               f"(magic {magic:#x}, version {version})")
    nr = secrets.token_bytes(32)
    try:
        s.sendall(_RPROOF.pack(_HS_MAGIC, index, nr, _mac(secret, b"reader", channel, nw, nr,
                                                            index)))
    except OSError:
        pass  # the writer closed already: what it said before (BUSY or nothing) tells why
    magic, mac = _WPROOF.unpack(_recv_exact(s, _WPROOF.size, deadline, what))
    if magic != _HS_MAGIC or not hmac.compare_digest(
            mac, _mac(secret, b"writer", channel, nw, nr, index)):
        raise ChannelAuthError(f"{what}: the peer failed the writer's proof (not this "
                               "graph's writer): dropped before reading data")
    s.settimeout(None)
    _tune(s)
    return nw, nr


def connect_proven(host: str, port: int, index: int, secret: bytes, channel: str,
                   timeout: float, what: str = "") -> tuple[socket.socket, int]:
    """Connect to the writer at ``host:port`` and prove ourselves as reader ``index``;
    returns the connection and its session. A writer busy with strangers says ``BUSY``:
    connect again (a little later each time) until ``timeout``.

    Raises:
        ChannelTimeoutError: no writer accepted us in time.
        ChannelAuthError: the peer is not this channel's writer (it failed its proof, or
            refused ours): nothing from it was read as data.
    """
    what = what or f"tcp:{host}:{port}"
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        s = _dial(host, port, deadline, timeout, what)
        try:
            nw, nr = _prove(s, index, secret, channel, max(deadline, time.monotonic() + 1.0),
                            what)
            return s, _session(secret, channel, nw, nr, index)
        except _Busy:
            # The writer had no room for us (strangers waiting) or we were too slow:
            # connect again, a little later each time, until our deadline.
            s.close()
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeoutError(
                    f"{what}: the writer had no room for this reader within {timeout} s "
                    "(too many unproven connections to it)") from None
            time.sleep(min(left, pause * (0.5 + random.random())))
            pause = min(2 * pause, _RETRY_MAX_S)
        except BaseException:
            s.close()
            raise


class _Pending:
    """A connection accepted but not proven yet: what it sent so far and its deadline."""

    __slots__ = ("sock", "host", "nonce", "buf", "deadline")

    def __init__(self, sock: socket.socket, host: str, nonce: bytes, deadline: float) -> None:
        self.sock = sock
        self.host = host
        self.nonce = nonce
        self.buf = bytearray()
        self.deadline = deadline


class Acceptor:
    """The writer's set-up thread: answers connections until every reader index is proven.

    Strangers cannot stop it (each rule below is what keeps one attack from working):

    - a connection must prove itself within ``handshake_s`` of being accepted, however it
      trickles bytes (slow loris); a byte that cannot start a proof (wrong magic, a reader
      index out of range or taken) or a wrong proof closes it at once;
    - at most ``max_pending`` connections wait at once; a new one is always answered and, if
      the set is full, one waiting connection is evicted: from the peer address holding the
      most waiting connections, the oldest (it had the longest to prove itself; a real
      reader answers within a round trip). Before it goes, whatever it sent is read and
      judged, so a proof already received is never evicted. Evicted and expired
      connections get ``BUSY`` and the real reader connects again (``TcpReader.connect``
      retries until its deadline), so a flood can delay a reader but not lock it out;
    - pending proofs are read before new connections are accepted in every round, and at
      most ``_ACCEPT_BATCH`` are accepted per round;
    - a connection that fails in any way is dropped alone; out of file descriptors, the
      oldest waiting connection is evicted (or accepting pauses briefly); only an error of
      the listener itself ends the thread, and ``accept()`` raises it.

    State: everything here belongs to the thread until it ends; the writer reads ``socks``
    and ``sessions`` only after joining it (``got`` and ``refused`` are counts, safe to
    read at any time).
    """

    def __init__(self, srv: socket.socket, num_readers: int, secret: bytes, channel: str,
                 handshake_s: float, max_pending: int = _MAX_PENDING) -> None:
        self.socks: list[socket.socket | None] = [None] * num_readers
        self.sessions = [0] * num_readers
        self.got = 0  # readers proven so far
        self.refused = 0  # connections dropped unproven (failed, silent, evicted, duplicate)
        self.error: Exception | None = None  # what ended the thread early
        self._srv = srv
        self.port = srv.getsockname()[1]
        self._secret = secret
        self._channel = channel
        self._handshake_s = handshake_s
        self._max_pending = max_pending
        self._pending: dict[socket.socket, _Pending] = {}  # in accept order = deadline order
        self._hosts: dict[str, int] = {}  # waiting connections per peer address
        self._sel = selectors.DefaultSelector()
        self._stop_r, self._stop_w = socket.socketpair()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"cgc-tcp-accept-{self.port}")
        self.thread.start()

    def stop(self) -> None:
        """End the thread (if it still runs) and wait for it; closes the listener."""
        if self.thread.is_alive():
            try:
                self._stop_w.send(b"x")
            except OSError:
                pass
        self.thread.join()
        for s in (self._stop_r, self._stop_w):
            s.close()

    # -------------------------------------------------------------- the thread
    def _run(self) -> None:
        # Why a thread: a reader's connect() returns only after the proof exchange, so the
        # writer must answer while its owner does other set-up (e.g. connecting its own
        # readers to other actors' writers) - no set-up ordering between actors needed.
        sel, srv = self._sel, self._srv
        resume: float | None = None  # accepting paused (out of descriptors) until then
        try:
            srv.setblocking(False)
            sel.register(srv, selectors.EVENT_READ)
            sel.register(self._stop_r, selectors.EVENT_READ)
            while self.got < len(self.socks):
                now = time.monotonic()
                self._expire(now)
                if resume is not None and now >= resume:
                    sel.register(srv, selectors.EVENT_READ)
                    resume = None
                first = next(iter(self._pending.values()), None)  # the earliest deadline
                wake = ([first.deadline] if first else []) + ([resume] if resume else [])
                ready = False
                for key, _ in sel.select(max(0.0, min(wake) - now) if wake else None):
                    if key.fileobj is self._stop_r:
                        return
                    if key.fileobj is srv:
                        ready = True
                        continue
                    p = self._pending.get(key.fileobj)  # type: ignore[call-overload]
                    if p is not None:  # None: dropped earlier in this round
                        self._guarded_step(p)
                if ready and self.got < len(self.socks) and not self._take_batch():
                    sel.unregister(srv)
                    resume = time.monotonic() + _PAUSE_S
        except Exception as e:  # noqa: BLE001 - reported by accept(), never lost
            self.error = e
        finally:
            for p in list(self._pending.values()):
                self._forget(p)
                p.sock.close()
            sel.close()
            srv.close()

    def _take_batch(self) -> bool:
        """Accept what the listener holds (at most a batch); False: out of descriptors with
        nothing to evict (pause accepting)."""
        for _ in range(_ACCEPT_BATCH):
            if self.got == len(self.socks):
                return True  # an eviction judged the last reader's proof: done
            try:
                s, addr = self._srv.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as e:
                if e.errno in _STARVED:
                    if not self._pending:
                        return False
                    self._evict()  # frees a descriptor for the next accept
                    continue
                if e.errno in _TRANSIENT:  # that connection failed, not the listener
                    continue
                raise
            try:
                self._admit(s, str(addr[0]) if isinstance(addr, tuple) else "")
            except OSError:
                s.close()
        return True

    def _admit(self, s: socket.socket, host: str) -> None:
        s.setblocking(False)
        nonce = secrets.token_bytes(32)
        if s.send(_HELLO.pack(_HS_MAGIC, _VERSION, nonce)) != _HELLO.size:  # fits a new buffer
            raise OSError("short send")
        while len(self._pending) >= self._max_pending:
            self._evict()
        p = _Pending(s, host, nonce, time.monotonic() + self._handshake_s)
        self._sel.register(s, selectors.EVENT_READ)
        self._pending[s] = p
        self._hosts[host] = self._hosts.get(host, 0) + 1

    def _evict(self) -> None:
        """Free one waiting slot: the oldest connection of the busiest peer address."""
        most = max(self._hosts.values())
        victim = next(p for p in self._pending.values() if self._hosts[p.host] == most)
        self._guarded_step(victim)  # a proof already received is judged, not evicted
        if victim.sock in self._pending:
            self._drop(victim, busy=True)

    def _expire(self, now: float) -> None:
        while self._pending:
            p = next(iter(self._pending.values()))
            if p.deadline > now:
                return
            self._guarded_step(p)
            if p.sock in self._pending:
                self._drop(p, busy=True)

    def _guarded_step(self, p: _Pending) -> None:
        try:
            self._step(p)
        except Exception:  # noqa: BLE001 - one connection's failure is that connection's
            if p.sock in self._pending:
                self._drop(p)
            else:
                p.sock.close()

    def _step(self, p: _Pending) -> None:
        """Read what ``p`` sent; judge it as soon as it can be judged."""
        try:
            chunk = p.sock.recv(_RPROOF.size - len(p.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(p)
            return
        p.buf += chunk
        if not self._plausible(p.buf):
            self._drop(p)  # cannot be a proof: at once, whatever follows
            return
        if len(p.buf) < _RPROOF.size:
            return
        _magic, idx, nr, mac = _RPROOF.unpack(p.buf)
        if not hmac.compare_digest(mac, _mac(self._secret, b"reader", self._channel,
                                             p.nonce, nr, idx)):
            self._drop(p)
            return
        self._forget(p)
        s = p.sock
        try:
            proof = _WPROOF.pack(_HS_MAGIC, _mac(self._secret, b"writer", self._channel,
                                                 p.nonce, nr, idx))
            if s.send(proof) != len(proof):  # 36 bytes into a fresh buffer: never short
                raise OSError("short send")
            s.setblocking(True)
            _tune(s)
        except OSError:
            self.refused += 1
            s.close()
            return
        self.sessions[idx] = _session(self._secret, self._channel, p.nonce, nr, idx)
        self.socks[idx] = s
        self.got += 1

    def _plausible(self, buf: bytearray) -> bool:
        """Can ``buf`` still become a proof (magic, then a free reader index)?"""
        if not _HS_BYTES.startswith(bytes(buf[:4])):
            return False
        if len(buf) >= 8:
            idx = int.from_bytes(buf[4:8], "little")
            return idx < len(self.socks) and self.socks[idx] is None
        return True

    def _forget(self, p: _Pending) -> None:
        if self._pending.pop(p.sock, None) is not None:
            n = self._hosts[p.host] - 1
            if n:
                self._hosts[p.host] = n
            else:
                del self._hosts[p.host]
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, p: _Pending, busy: bool = False) -> None:
        self._forget(p)
        if busy:
            try:
                p.sock.send(_BUSY_BYTES)
            except OSError:
                pass
        self.refused += 1  # first: whoever sees the close sees the count
        p.sock.close()
