"""Start-up refuses a plan whose shared-memory rings do not fit in /dev/shm (issue 37 item 5).

The free space is made small through the one function that reads it
(``cgc.runtime.channels.shm.shm_free_bytes``); Ray and the rings are real.
"""

from __future__ import annotations

import os
import time

import pytest
import ray
import rt_graphs as G

import cgc
from cgc import InputNode
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import LIMITS, RunConfig
from cgc.plan_schema.verify.bounds import Rings
from cgc.runtime import SetupError, ShmSpaceError
from cgc.runtime.channels import ShmRingWriter, list_segments, shm
from cgc.runtime.driver.shm_space import margin_bytes, ring_segment_bytes

MiB = 1 << 20


def _plan(name: str, n: int = 2):
    ws = [G.Worker.bind(i + 1) for i in range(n)]
    with InputNode() as inp:
        x = inp
        for w in ws:
            x = w.add.bind(x)
    return cgc.compile(x, name=name)


def _ring_bytes(plan) -> dict[int, int]:
    """What the plan's rings commit when every one is on this node (a one-node cluster)."""
    default = RunConfig.from_plan(plan.proto.config).slot_bytes
    return {ch.id: ring_segment_bytes(ch, default) for ch in plan.proto.lowered.channels
            if ch.kind == pb.CHAN_HOST}


def _named(plan_name: str) -> set[str]:
    return {n for n in ray.util.list_named_actors() if n.startswith(plan_name + ".")}


@pytest.fixture
def prefixes(monkeypatch):
    """The segment prefixes of the graphs started meanwhile (a spy, the names unchanged)."""
    from cgc.runtime import endpoints

    made: list[str] = []
    real = endpoints.new_graph_prefix

    def spy() -> str:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(endpoints, "new_graph_prefix", spy)
    return made


def test_ring_bytes_are_the_verifiers_count_plus_headers_and_what_a_ring_commits(prefix):
    plan = _plan("t_shm_count", 3)
    proto = plan.proto
    rings = Rings(proto, LIMITS)
    host = [ch for ch in proto.lowered.channels if ch.kind == pb.CHAN_HOST]
    assert len(host) == 4  # input, two between the workers, output
    for ch in host:
        rings.add(ch.id, True, ch.slots, ch.slot_bytes, len(ch.readers))
    ours = _ring_bytes(plan)
    # Each ring: the verifier's slots x slot bytes, plus headers (<= a page and 64 B a slot).
    assert sum(ours.values()) >= rings.total
    page = os.sysconf("SC_PAGE_SIZE")
    for ch in host:
        extra = ours[ch.id] - ch.slots * ch.slot_bytes
        assert 0 < extra <= page + 64 * ch.slots + 4096 and ours[ch.id] % page == 0
    # ...and exactly the pages a ring of that channel reserves in /dev/shm.
    ch = host[1]
    w = ShmRingWriter.create(prefix + "ring", slots=ch.slots, slot_bytes=ch.slot_bytes,
                             num_readers=len(ch.readers))
    try:
        st = os.stat(os.path.join(shm.segment_dir(), prefix + "ring"))
        assert st.st_blocks * 512 == ours[ch.id] == st.st_size + (-st.st_size % page)
    finally:
        w.close()


def test_rings_beyond_free_shm_fail_before_any_actor_or_segment(ray_cluster, monkeypatch,
                                                                prefixes):
    plan = _plan("t_shm_full")
    need = sum(_ring_bytes(plan).values())
    monkeypatch.setattr(shm, "shm_free_bytes", lambda: 3 * MiB)
    with pytest.raises(ShmSpaceError) as err:
        plan.start(get_timeout=30)
    e = err.value
    assert isinstance(e, SetupError) and e.exit_code == 1
    assert (e.need, e.free) == (need, 3 * MiB)
    msg = str(e)
    assert "plan 't_shm_full' does not fit in shared memory" in msg, msg
    assert "the driver's node" in msg and shm.segment_dir() in msg
    assert f"commit {need / MiB:.2f} MiB" in msg and "3.00 MiB is free" in msg
    # the largest rings, by channel, producer and readers, and what to do
    assert "channel c2 (worker0.add -> worker1)" in msg and "slots x 1.00 MiB" in msg
    assert "capacity=" in msg and "--shm-size" in msg
    # refused before the graph had a name or an actor: nothing to leak
    assert prefixes == [] and _named("t_shm_full") == set()


def test_rings_beyond_free_shm_on_a_cluster_fail_before_any_ring(ray_cluster, monkeypatch,
                                                                 prefixes):
    """Where actors may land on other nodes, the check waits for the probe round: the
    actors exist then, but no ring; the failed start takes them down again."""
    from cgc.runtime.driver import start

    plan = _plan("t_shm_nodes")
    monkeypatch.setattr(start, "_one_node", lambda: False)
    monkeypatch.setattr(shm, "shm_free_bytes", lambda: 3 * MiB)
    with pytest.raises(ShmSpaceError, match=r"channel c\d+ \(worker\d\.add"):
        plan.start(get_timeout=30)
    assert len(prefixes) == 1 and list_segments(prefixes[0]) == []
    deadline = time.monotonic() + 20
    while _named("t_shm_nodes") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _named("t_shm_nodes") == set()


def test_a_plan_that_just_fits_starts(ray_cluster, monkeypatch):
    plan = _plan("t_shm_fits")
    need = sum(_ring_bytes(plan).values())
    monkeypatch.setattr(shm, "shm_free_bytes", lambda: need + margin_bytes(need))
    with plan.start(get_timeout=30) as g:
        assert g.execute(1).get() == 4
