"""TCP channels are authenticated: strangers are refused and nothing of theirs is unpickled."""

from __future__ import annotations

import pathlib
import pickle
import socket
import threading

import chan_children as kids
import pytest

from cgc.runtime.channels import (
    ChannelAuthError,
    FrameTooLargeError,
    TcpReader,
    TcpWriter,
)
from cgc.runtime.channels import tcp_accept as accept_mod
from cgc.runtime.channels import tcp_frame as frame_mod

KEY = kids.KEY


class _TouchOnLoad:
    """A pickle that creates ``path`` when (and only when) someone unpickles it."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def _evil(path) -> bytes:
    return pickle.dumps(_TouchOnLoad(path))


def test_foreign_connection_first_is_refused_and_the_real_reader_gets_every_value(tmp_path):
    marker = tmp_path / "ran"
    w = TcpWriter.listen("127.0.0.1", 0, secret=KEY, channel="g-c1")
    stranger = socket.create_connection(("127.0.0.1", w.port))
    stranger.recv(accept_mod._HELLO.size)  # the writer's challenge
    junk = _evil(marker)
    stranger.sendall(junk.ljust(accept_mod._RPROOF.size, b"\0")[:accept_mod._RPROOF.size])
    with pytest.raises(ChannelAuthError):  # a second one, with the wrong key, as reader 0
        TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=b"w" * 32,
                          channel="g-c1", timeout=10)
    r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=KEY, channel="g-c1")
    w.accept(timeout=30)
    for i in range(50):
        w.write({"i": i})
    assert [r.read(timeout=10)["i"] for _ in range(50)] == list(range(50))
    assert w.refused >= 2
    stranger.settimeout(10)
    try:
        assert stranger.recv(1) == b""  # dropped
    except ConnectionResetError:
        pass
    with pytest.raises(OSError):  # the listener is closed once the readers are in
        socket.create_connection(("127.0.0.1", w.port), timeout=5)
    assert not marker.exists()
    stranger.close()
    r.close()
    w.close()


def _fake_writer(script):
    """A listener that runs ``script(conn)`` for its first connection."""
    srv = socket.create_server(("127.0.0.1", 0))

    def run():
        conn, _ = srv.accept()
        try:
            script(conn)
        except OSError:
            pass
        finally:
            conn.close()
            srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv.getsockname()[1], t


def test_fake_writer_cannot_make_the_reader_unpickle(tmp_path):
    marker = tmp_path / "ran"

    def script(conn):
        conn.sendall(accept_mod._HELLO.pack(accept_mod._HS_MAGIC, accept_mod._VERSION, b"n" * 32))
        conn.recv(accept_mod._RPROOF.size)
        conn.sendall(b"\0" * accept_mod._WPROOF.size)  # it cannot compute the writer's proof
        conn.sendall(_evil(marker) * 4)

    port, t = _fake_writer(script)
    with pytest.raises(ChannelAuthError, match="writer's proof"):
        TcpReader.connect("127.0.0.1", port, reader_index=0, secret=KEY, timeout=10)
    t.join(30)
    assert not marker.exists()


def test_non_cgc_peer_is_refused(tmp_path):
    marker = tmp_path / "ran"
    port, t = _fake_writer(lambda conn: conn.sendall(_evil(marker).ljust(64, b"\0")))
    with pytest.raises(ChannelAuthError, match="not a cgc TCP channel writer"):
        TcpReader.connect("127.0.0.1", port, reader_index=0, secret=KEY, timeout=10)
    t.join(30)
    assert not marker.exists()


def test_reader_of_another_channel_or_a_taken_index_is_refused():
    w = TcpWriter.listen("127.0.0.1", 0, num_readers=2, secret=KEY, channel="g-c1")
    with pytest.raises(ChannelAuthError):
        TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=KEY, channel="g-c2",
                          timeout=10)
    r0 = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=KEY, channel="g-c1")
    with pytest.raises(ChannelAuthError):
        TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=KEY, channel="g-c1",
                          timeout=10)
    r1 = TcpReader.connect("127.0.0.1", w.port, reader_index=1, secret=KEY, channel="g-c1")
    w.accept(timeout=30)
    w.write("both")
    assert r0.read(timeout=10) == r1.read(timeout=10) == "both"
    assert w.refused == 2
    r0.close()
    r1.close()
    w.close()


def _pair(**kw):
    w = TcpWriter.listen("127.0.0.1", 0, secret=KEY, **kw)
    r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=KEY, **kw)
    w.accept(timeout=30)
    return w, r


@pytest.mark.parametrize("plen,nbufs", [(1 << 40, 0), (0, 1 << 20), (1 << 33, 3)])
def test_oversized_frame_length_is_refused_before_allocating(plen, nbufs):
    w, r = _pair()
    w.write("ok")
    assert r.read(timeout=10) == "ok"
    # A peer holding the key but sending an absurd length (the frame bytes never follow).
    hdr = frame_mod.HDR.pack(frame_mod.FRAME_MAGIC, 1, w.position, plen, nbufs, 0, w._sessions[0],
                            plen + 8 * nbufs + 8)
    w._socks[0].sendall(hdr)
    with pytest.raises(FrameTooLargeError):
        r.read(timeout=10)
    w.close()
    r.close()


def test_writer_refuses_a_value_over_the_maximum_and_stays_usable():
    w, r = _pair(max_frame_bytes=1000)
    with pytest.raises(FrameTooLargeError):
        w.write(b"x" * 5000)
    w.write(b"y" * 10)
    assert r.read(timeout=10) == b"y" * 10
    w.close()
    r.close()


def test_wildcard_address_and_missing_secret_are_refused():
    with pytest.raises(ValueError, match="wildcard"):
        TcpWriter.listen("0.0.0.0", 0, secret=KEY)
    with pytest.raises(ValueError, match="secret"):
        TcpWriter.listen("127.0.0.1", 0, secret=b"short")
