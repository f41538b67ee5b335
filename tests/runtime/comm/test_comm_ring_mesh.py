"""``RingMesh``: one shared-memory ring per ordered pair of ranks (the mesh under the CPU
communicator, the side-channels and the CPU stand-in transport), and the quiet teardown
helpers of ``channels.ends`` it closes with.

Ranks run in threads of this process (futex waits release the GIL), except the dead-peer
test, whose peer is a separate process killed mid-wait.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from cgc.runtime.channels import (
    ChannelClosedError,
    ChannelTimeoutError,
    PeerDiedError,
    cleanup_segments,
    list_segments,
)
from cgc.runtime.channels.ends import close_quietly, detach_quietly, poison_quietly
from cgc.runtime.comm.ring_mesh import RingMesh, check_rank


def _mesh(prefix: str, world: int, **kw) -> list[RingMesh]:
    return [RingMesh(prefix, "m", r, world, slots=4, slot_bytes=4096, attach_timeout=10, **kw)
            for r in range(world)]


def test_names_are_one_ring_per_ordered_pair_created_by_the_writer(prefix):
    meshes = _mesh(prefix, 3)
    assert list_segments(prefix) == sorted(f"{prefix}m{s}-{d}" for s in range(3)
                                           for d in range(3) if s != d)
    assert meshes[2].name(0, 2) == f"{prefix}m0-2" and meshes[0].peers == [1, 2]
    assert meshes[0].inbound == {}  # nothing attached before first use
    for m in meshes:
        m.close(linger=0)
    assert list_segments(prefix) == []  # close frees every segment


@pytest.mark.parametrize("spin", [0.0, 50.0], ids=["sleep", "spin"])
def test_every_rank_exchanges_with_every_other_in_threads(prefix, spin):
    meshes = _mesh(prefix, 3, spin_us=spin)
    got: dict[tuple[int, int], object] = {}
    errors: list[BaseException] = []

    def rank(m: RingMesh) -> None:
        try:
            for p in m.peers:
                m.reader(p)  # attach before the first write (see module doc)
                m.out[p].write({"from": m.rank, "to": p}, timeout=20)
            for p in m.peers:
                got[(p, m.rank)] = m.reader(p).read(timeout=20)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    ts = [threading.Thread(target=rank, args=(m,)) for m in meshes]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors
    assert got == {(s, d): {"from": s, "to": d} for s in range(3) for d in range(3) if s != d}
    assert meshes[1].reader(0) is meshes[1].inbound[0]  # attached once, kept
    for m in meshes:
        m.close(linger=0)
    assert list_segments(prefix) == []


def test_bad_rank_and_bad_peer_raise_value_error_with_the_same_words(prefix):
    with pytest.raises(ValueError, match=r"^rank 2 not in 0\.\.1$"):
        RingMesh(prefix, "m", 2, 2, slots=1, slot_bytes=4096)
    with pytest.raises(ValueError, match=r"^rank -1 not in 0\.\.2$"):
        check_rank(-1, 3)
    assert list_segments(prefix) == []  # refused before creating anything
    (m,) = _mesh(prefix, 1)
    for bad in (0, 1, -1):
        with pytest.raises(ValueError, match=rf"^rank 0: bad peer {bad} \(world size 1\)$"):
            m.check_peer(bad)
    m.close()


def test_attach_to_a_ring_that_never_appears_times_out(prefix):
    m = RingMesh(prefix, "m", 0, 2, slots=1, slot_bytes=4096, attach_timeout=0.2)
    with pytest.raises(ChannelTimeoutError):
        m.reader(1)
    assert m.inbound == {}
    m.close(linger=0)


def test_poison_wakes_waiters_here_and_in_the_peer_and_teardown_swallows_errors(prefix):
    m0, m1 = _mesh(prefix, 2)
    r01 = m1.reader(0)  # rank 1 reads rank 0's ring
    m0.reader(1)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            r01.read(timeout=30)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    t = threading.Thread(target=wait)
    t.start()
    m0.poison()  # rank 0's rings: the peer's blocked read wakes up
    t.join(30)
    assert not t.is_alive() and isinstance(errors[0], ChannelClosedError)
    with pytest.raises(ChannelClosedError):
        m0.out[1].write(1, timeout=1)
    for m in (m0, m1):
        m.close(linger=0)
        m.close(linger=0)  # idempotent
        m.poison()  # after close: swallowed
    with pytest.raises(ChannelClosedError):
        m0.out[1].write(1, timeout=1)  # the closed writers stay
    assert list_segments(prefix) == []


def test_close_inbound_wakes_the_peers_writer_and_quiet_false_closes_too(prefix):
    m0, m1 = _mesh(prefix, 2)
    m1.reader(0)
    m1.let_go(close=True, quiet=False)  # closes rank 0's ring to rank 1 for everyone
    assert m1.inbound == {}
    with pytest.raises(ChannelClosedError):
        m0.out[1].write(1, timeout=1)
    m0.close_out(0.0, quiet=False)
    m0.close_out(0.0, quiet=False)  # idempotent without swallowing anything
    m0.let_go(quiet=False)
    m1.close(linger=0)
    assert list_segments(prefix) == []


_CHILD = """
import sys, time
from cgc.runtime.comm.ring_mesh import RingMesh
m = RingMesh(sys.argv[1], "m", 1, 2, slots=1, slot_bytes=4096)
print("up", flush=True)
time.sleep(120)
"""


def test_a_dead_peer_gives_peer_died_error(prefix):
    child = subprocess.Popen([sys.executable, "-c", _CHILD, prefix], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        (m0,) = [RingMesh(prefix, "m", 0, 2, slots=1, slot_bytes=4096, attach_timeout=30)]
        r = m0.reader(1)
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                r.read(timeout=None)
            except BaseException as e:  # noqa: BLE001 - handed to the test
                errors.append(e)

        t = threading.Thread(target=wait)
        t.start()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        t.join(60)
        assert not t.is_alive(), "read stayed blocked after the peer died"
        (err,) = errors
        assert isinstance(err, PeerDiedError) and err.pid == child.pid and err.role == "writer"
        m0.close(linger=0)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        cleanup_segments(prefix + "m1-")  # what the killed peer left


class _Broken:
    def __init__(self) -> None:
        self.calls = 0

    def _fail(self, *a, **kw) -> None:
        self.calls += 1
        raise OSError("gone")

    poison = close = detach = _fail


class _Fine:
    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def poison(self) -> None:
        self.seen.append(("poison", None))

    def close(self, linger: float | None = None) -> None:
        self.seen.append(("close", linger))

    def detach(self) -> None:
        self.seen.append(("detach", None))


def test_quiet_helpers_reach_every_end_past_a_failing_one():
    bad, good = _Broken(), _Fine()
    poison_quietly([bad, good])
    close_quietly([bad, good])  # no linger: close() as readers take it
    close_quietly([bad, good], linger=2.0)
    detach_quietly([bad, good])
    assert bad.calls == 4
    assert good.seen == [("poison", None), ("close", None), ("close", 2.0), ("detach", None)]
