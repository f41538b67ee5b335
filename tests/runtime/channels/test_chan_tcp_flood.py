"""A TCP writer's set-up outlives strangers: silent, slow, garbage-sending and flooding
connections (real sockets on loopback) never stop the expected readers from connecting.

Each test ends with the real readers connected and values flowing; waits are bounded
(liveness deadlines), never timed assertions."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import struct
import subprocess
import sys
import threading

import chan_children as kids
import pytest

from cgc.runtime.channels import TcpReader, TcpWriter
from cgc.runtime.channels import tcp_accept as accept_mod

KEY = kids.KEY
CTX = mp.get_context("spawn")
PLAUSIBLE = struct.pack("<II", accept_mod._HS_MAGIC, 0) + bytes(63)  # one byte short of a proof


@pytest.fixture
def strangers():
    """Sockets a test opens as a stranger; all closed at the end."""
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def _stranger(port: int, held: list, source: str = "127.0.0.1") -> socket.socket:
    """A connection the writer has accepted and challenged (its hello received)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    held.append(s)
    got = b""
    while len(got) < accept_mod._HELLO.size:
        chunk = s.recv(accept_mod._HELLO.size - len(got))
        assert chunk, "the writer closed a new connection before its hello"
        got += chunk
    return s


def _closed_by_writer(s: socket.socket, within: float = 15.0) -> bytes:
    """Wait (bounded) until the writer closes ``s``; what it sent after its hello."""
    s.settimeout(within)
    rest = b""
    try:
        while chunk := s.recv(4096):
            rest += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the writer kept a stranger's connection open for {within} s")
    return rest


def _values_flow(w: TcpWriter, readers: list[TcpReader]) -> None:
    w.accept(timeout=60)
    for i in range(20):
        w.write({"i": i})
    for r in readers:
        assert [r.read(timeout=30)["i"] for _ in range(20)] == list(range(20))
        r.close()
    w.close()


def test_the_audits_flood_oldest_trickling_while_more_arrive():
    # The audit's attack: 64 waiting connections, then more while the oldest sends bytes
    # (once a KeyError in the acceptor: a socket evicted while an event for it was due).
    held: list[socket.socket] = []
    w = TcpWriter.listen("127.0.0.1", 0, secret=KEY, channel="flood")
    try:
        waiting = [_stranger(w.port, held) for _ in range(64)]
        sent = {id(s): 0 for s in waiting}
        for _ in range(300):
            for s in waiting[:4]:  # the oldest few trickle a plausible proof
                try:
                    s.send(PLAUSIBLE[sent[id(s)]:sent[id(s)] + 1])
                    sent[id(s)] += 1
                except OSError:
                    pass
            waiting.append(_stranger(w.port, held))
            sent[id(waiting[-1])] = 0
            waiting.pop(0)
        assert w.accepting, "the acceptor thread died"
        r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=KEY,
                              channel="flood", timeout=60)
        _values_flow(w, [r])
        assert w.refused >= 300
    finally:
        w.close()
        for s in held:
            s.close()


def test_silent_connections_holding_every_slot_do_not_keep_the_reader_out(strangers):
    w = TcpWriter.listen("127.0.0.1", 0, secret=KEY, channel="silent",
                         handshake_timeout=600)  # so only eviction can make room
    for _ in range(3 * accept_mod._MAX_PENDING):
        _stranger(w.port, strangers)
    assert w.accepting
    r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=KEY, channel="silent",
                          timeout=60)
    _values_flow(w, [r])
    # The oldest were evicted and told to come back later; the rest went with the listener.
    assert _closed_by_writer(strangers[0]) == accept_mod._BUSY_BYTES
    assert _closed_by_writer(strangers[-1]) == b""


@pytest.mark.parametrize("junk", [
    b"GET / HTTP/1.1\r\n\r\n",
    b"\x80\x05\x95" + bytes(200),  # a pickle's opening bytes
    struct.pack("<II", accept_mod._HS_MAGIC, 7),  # a reader index this channel does not have
    struct.pack("<II", accept_mod._HS_MAGIC, 0) + bytes(64),  # a proof without the key
    bytes(range(256)) * 64,  # 16 KiB of noise
], ids=["http", "pickle", "bad-index", "wrong-mac", "noise"])
def test_garbage_handshakes_are_closed_at_once_and_the_reader_gets_in(junk, strangers):
    w = TcpWriter.listen("127.0.0.1", 0, secret=KEY, channel="junk",
                         handshake_timeout=600)  # closed for what they sent, not for time
    for _ in range(100):
        s = _stranger(w.port, strangers)
        s.sendall(junk)
        assert _closed_by_writer(s) == b""  # refused at once: no BUSY, never a retry
    assert w.accepting and w.refused == 100
    r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=KEY, channel="junk",
                          timeout=60)
    _values_flow(w, [r])


def test_slow_loris_handshakes_are_cut_at_their_deadline(strangers):
    w = TcpWriter.listen("127.0.0.1", 0, secret=KEY, channel="loris", handshake_timeout=1.0)
    slow = [_stranger(w.port, strangers) for _ in range(accept_mod._MAX_PENDING + 16)]
    stop = threading.Event()

    def trickle():  # one byte per connection every 20 ms: always plausible, never whole
        off = 0
        while not stop.is_set() and off < len(PLAUSIBLE):
            for s in slow:
                try:
                    s.send(PLAUSIBLE[off:off + 1])
                except OSError:
                    pass
            off += 1
            stop.wait(0.02)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=KEY,
                              channel="loris", timeout=60)
        # A connection that keeps sending is cut at its deadline all the same.
        assert _closed_by_writer(slow[-1]) in (accept_mod._BUSY_BYTES, b"")
    finally:
        stop.set()
        t.join(30)
    _values_flow(w, [r])


def _flooding(port: int, source: str, seconds: float, keep: int):
    q = CTX.Queue()
    p = CTX.Process(target=kids.flood, args=(q, port, source, seconds, keep))
    p.start()
    assert q.get(timeout=60) == ("go",), "the flood did not start"
    return p, q


@pytest.mark.parametrize("source", ["127.0.0.1", "127.0.0.2"],
                         ids=["same-address", "other-address"])
def test_a_flood_that_keeps_going_while_the_readers_connect(source):
    w = TcpWriter.listen("127.0.0.1", 0, num_readers=2, secret=KEY, channel="storm")
    p, q = _flooding(w.port, source, seconds=120, keep=4 * accept_mod._MAX_PENDING)
    try:
        assert w.accepting
        readers = [TcpReader.connect("127.0.0.1", w.port, reader_index=i, secret=KEY,
                                     channel="storm", timeout=90) for i in (1, 0)]
        assert p.is_alive(), "the flood ended before the readers got in: test it longer"
        _values_flow(w, readers[::-1])
    finally:
        p.terminate()
        p.join(30)
        w.close()
    assert w.refused > accept_mod._MAX_PENDING


def _proof(s: socket.socket, hello: bytes, index: int = 0) -> tuple[bytes, bytes]:
    _m, _v, nw = accept_mod._HELLO.unpack(hello)
    nr = os.urandom(32)
    s.sendall(accept_mod._RPROOF.pack(accept_mod._HS_MAGIC, index, nr,
                                   accept_mod._mac(KEY, b"reader", "slow", nw, nr, index)))
    return nw, nr


def test_a_slow_reader_is_evicted_only_after_the_busiest_address(strangers):
    # A reader that has its challenge but has not answered yet, then a flood from another
    # address: the flood's connections make room for each other, the reader keeps its slot.
    w = TcpWriter.listen("127.0.0.1", 0, secret=KEY, channel="slow", handshake_timeout=600)
    s = socket.create_connection(("127.0.0.1", w.port), timeout=10)
    strangers.append(s)
    hello = s.recv(accept_mod._HELLO.size)
    for _ in range(3 * accept_mod._MAX_PENDING):
        _stranger(w.port, strangers, source="127.0.0.2")
    nw, nr = _proof(s, hello)
    s.settimeout(10)
    magic, mac = accept_mod._WPROOF.unpack(s.recv(accept_mod._WPROOF.size))
    assert magic == accept_mod._HS_MAGIC
    assert mac == accept_mod._mac(KEY, b"writer", "slow", nw, nr, 0)
    w.accept(timeout=60)
    w.close()


def test_a_reader_evicted_before_it_answered_is_told_busy_and_gets_in_again(strangers):
    w = TcpWriter.listen("127.0.0.1", 0, secret=KEY, channel="slow", handshake_timeout=600)
    s = socket.create_connection(("127.0.0.1", w.port), timeout=10)
    strangers.append(s)
    s.recv(accept_mod._HELLO.size)
    for _ in range(accept_mod._MAX_PENDING):  # same address: it is the oldest, so it goes
        _stranger(w.port, strangers)
    assert _closed_by_writer(s) == accept_mod._BUSY_BYTES
    r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=KEY, channel="slow",
                          timeout=60)
    _values_flow(w, [r])


_LOW_FD_WRITER = r"""
import resource, sys
from cgc.runtime.channels import TcpWriter
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
w = TcpWriter.listen("127.0.0.1", 0, secret=b"k" * 32, channel="fds",
                     handshake_timeout=600)
import os
n = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (n + 24, hard))  # room for ~20 waiting connections
print(w.port, flush=True)
w.accept(timeout=90)
for i in range(20):
    w.write(i)
print("refused", w.refused, flush=True)
sys.stdin.read()
w.close()
"""


def test_a_writer_out_of_file_descriptors_keeps_accepting(strangers):
    # Strangers can use up the writer process's descriptors (a low RLIMIT_NOFILE here):
    # accept() fails with EMFILE, the oldest waiting connection makes room, the reader gets in.
    child = subprocess.Popen([sys.executable, "-c", _LOW_FD_WRITER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        for _ in range(60):
            strangers.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        r = TcpReader.connect("127.0.0.1", port, reader_index=0, secret=KEY, channel="fds",
                              timeout=60)
        assert [r.read(timeout=30) for _ in range(20)] == list(range(20))
        line = child.stdout.readline().split()
        assert line[0] == "refused" and int(line[1]) > 0
        r.close()
    finally:
        child.stdin.close()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
