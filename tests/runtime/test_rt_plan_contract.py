"""The plan is the contract: the runtime applies the decisions stored in the plan (and the
run configuration) and never works them out again. Each test changes one stored decision
and shows the runtime follows it, or refuses a stored decision that does not hold."""

from __future__ import annotations

from pathlib import Path

import pytest
import rt_graphs as G

import cgc
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.verify import PlanStructureError
from cgc.runtime import CapacityExceededError, GetTimeoutError, Plan
from cgc.runtime.channels.futex import HAVE_WAITV

ROOT = Path(__file__).resolve().parents[2]


def _changed(plan: Plan, edit) -> Plan:
    proto = pb.Plan()
    proto.CopyFrom(plan.proto)
    edit(proto)
    return Plan(proto, live_handles=plan.live_handles, classes=plan.classes)


def test_capacity_and_at_capacity_come_from_the_plan(ray_cluster):
    plan = G.slow_plan()
    assert plan.proto.config.capacity >= 2
    with plan.start(get_timeout=30) as g:  # as compiled: room for two, waits at capacity
        refs = [g.execute(0.1), g.execute(0.1)]
        assert [r.get() for r in refs] == [0.1, 0.1]

    def one_and_raise(p: pb.Plan) -> None:
        p.config.capacity = 1
        p.config.at_capacity = pb.AT_CAPACITY_RAISE

    with _changed(plan, one_and_raise).start(get_timeout=30) as g:
        assert (g.capacity, g.config.at_capacity) == (1, "raise")
        first = g.execute(0.1)
        with pytest.raises(CapacityExceededError):
            g.execute(0.0)
        assert first.get() == 0.1


def test_timeouts_come_from_the_plan(ray_cluster):
    def short_get(p: pb.Plan) -> None:
        p.config.get_timeout_s = 0.3

    with _changed(G.slow_plan(), short_get).start() as g:
        assert g.get_timeout == 0.3
        ref = g.execute(5.0)
        with pytest.raises(GetTimeoutError, match="after 0.3 s"):
            ref.get()  # no timeout given: the plan's


def test_a_collective_runs_on_the_communicator_the_plan_names(ray_cluster):
    plan = cgc.compile_file(ROOT / "examples" / "allreduce.py")
    colls = [op for p in plan.proto.lowered.programs for op in p.ops if op.kind == pb.COLL]
    assert colls and all(op.communicator == 0 for op in colls)

    def elsewhere(p: pb.Plan) -> None:
        p.lowered.communicators.add(id=1, members=["worker1", "worker0"])
        for prog in p.lowered.programs:
            for op in prog.ops:
                if op.kind == pb.COLL:
                    op.communicator = 1

    # A stored decision that does not hold is refused at start (the same check as
    # `cgc check`), never silently replaced by one the runtime works out itself.
    with pytest.raises(PlanStructureError, match="communicator 1"):
        _changed(plan, elsewhere).start()


def test_the_run_configuration_overrides_only_within_the_plan(ray_cluster):
    from cgc.plan_schema.errors import ConfigError

    plan = G.slow_plan()
    with pytest.raises(ConfigError, match="capacity"):
        plan.start(capacity=plan.proto.config.capacity + 1)


def test_a_collective_moved_to_another_stored_communicator_runs_there(ray_cluster, tmp_path):
    """A plan file whose collectives name a second communicator (same members, same rank
    order): the runtime opens and binds it and runs the collective on it, with the same
    results as the plan as compiled."""
    from cgc.plan_schema.values import decode_value
    from cgc.runtime import load

    compiled = cgc.compile_file(ROOT / "examples" / "allreduce.py")
    args = [decode_value(v) for v in compiled.proto.example_args]
    with compiled.start(get_timeout=60) as g:
        want = [r.get() for r in g.execute(*args)]

    def elsewhere(p: pb.Plan) -> None:
        members = list(p.lowered.communicators[0].members)
        p.lowered.communicators.add(id=1, members=members)
        for prog in p.lowered.programs:
            for op in prog.ops:
                if op.kind == pb.COLL:
                    op.communicator = 1

    path = tmp_path / "moved.cgplan"
    _changed(compiled, elsewhere).save(path, sign=False)
    trace = tmp_path / "run.json"
    with load(path, trust=True).start(get_timeout=60, trace=trace) as g:
        assert 1 in g.comm_bindings
        got = [r.get() for r in g.execute(*args)]
    assert got == want
    import json

    names = [e["name"] for e in json.loads(trace.read_text())["traceEvents"]
             if e["ph"] == "X" and e.get("cat") == "COLL"]
    assert names and all("@g1" in n for n in names)


def _actor_state(graph, probe: str):
    """``probe`` (a function below, by name) run inside every actor on its loop of
    ``graph``: actor -> result. The functions travel by value (the actors cannot import
    this test module)."""
    import ray

    def bell_depths(loop):  # the depth each of the actor's readers waits on
        if loop.bells is None:
            return []
        index = {loop.bells.address(d)[1]: d for d in range(loop.bells.depths + 1)}
        return sorted(index[r._bell[1]] for r in loop.readers.values()
                      if getattr(r, "_bell", None) is not None)

    def ring_slots(loop):  # channel id -> slots of the rings this actor writes
        return {cid: w.slots for cid, w in sorted(loop.writers.items())}

    fn = {"bell_depths": bell_depths, "ring_slots": ring_slots}[probe]

    def run(self, gid):
        from cgc.runtime.actor.loops import LOOPS, LOOPS_LOCK

        with LOOPS_LOCK:
            loop = LOOPS[gid]
        return fn(loop)

    return {n: ray.get(h.__ray_call__.remote(run, graph.gid), timeout=30)
            for n, h in graph.actors.items()}


@pytest.mark.skipif(not HAVE_WAITV, reason="wake-ahead needs futex_waitv (Linux >= 5.16)")
def test_wake_depths_come_from_the_plan(ray_cluster):
    """The doorbells follow Program.wake_depth as stored; only the window is run-time."""
    plan = G.chain_plan(3)
    assert [p.wake_depth for p in plan.proto.lowered.programs] == [1, 2, 3]
    with plan.start(get_timeout=30, wake_ahead=1) as g:  # as compiled
        assert g.bells.depths == 3 and g.bell_ahead == [2]
        assert _actor_state(g, "bell_depths") == {"worker0": [1], "worker1": [2],
                                                 "worker2": [3]}
        assert g.execute(1).get() == 7

    def shallower(p: pb.Plan) -> None:  # the deepest actor stored one hop up
        p.lowered.programs[2].wake_depth = 2

    with _changed(plan, shallower).start(get_timeout=30, wake_ahead=1) as g:
        assert g.bells.depths == 2 and g.bell_ahead == [2]
        assert _actor_state(g, "bell_depths") == {"worker0": [1], "worker1": [2],
                                                 "worker2": [2]}
        assert g.execute(1).get() == 7

    def flat(p: pb.Plan) -> None:  # every actor stored at depth 1: nothing to ring ahead
        for prog in p.lowered.programs:
            prog.wake_depth = 1

    with _changed(plan, flat).start(get_timeout=30, wake_ahead=2) as g:
        assert g.bells is None and g.bell_ahead == []
        assert g.execute(1).get() == 7


def test_input_attributes_are_taken_out_as_the_stored_extract_says(ray_cluster):
    """Op.extract: the READ of the whole input stores exactly the attributes it lists; an
    attribute the plan routes on a channel of its own is read from there instead, and an
    extract that does not hold is refused at start, never worked out again."""
    plan = G.extract_plan()
    low = plan.proto.lowered
    read = low.programs[0].ops[0]
    assert (read.kind, read.channel, list(read.extract)) == (pb.READ, 1, [1, 2])
    with plan.start(get_timeout=30) as g:  # as compiled: both attributes from c1
        total, pid = (r.get() for r in g.execute(1, 10))
        assert total == 11 and pid > 0

    def own_channel(p: pb.Plan) -> None:  # inp[1] (node 2) on a driver channel of its own
        lo = p.lowered
        c1 = lo.channels[0]
        new = lo.channels.add(id=len(lo.channels) + 1, kind=pb.CHAN_HOST, writer=c1.writer,
                              readers=["worker"], slots=c1.slots, slot_bytes=c1.slot_bytes,
                              reason="routed by hand")
        new.source.node = 2
        lo.input_channels.append(new.id)
        for e in lo.edges:
            if e.source.node == 2:
                e.channel = new.id
        ops = lo.programs[0].ops
        ops[0].extract.remove(2)
        ops.insert(1, pb.Op(kind=pb.READ, task=3, channel=new.id))

    with _changed(plan, own_channel).start(get_timeout=30) as g:
        assert g.channel_bindings == {1: "shm", 2: "shm", 3: "shm", 4: "shm"}
        assert [r.get() for r in g.execute(2, 20)][0] == 22
        assert [r.get() for r in g.execute(3, 30)][0] == 33

    def forget_one(p: pb.Plan) -> None:  # the READ no longer takes inp[1] out of c1
        p.lowered.programs[0].ops[0].extract.remove(2)

    with pytest.raises(PlanStructureError, match="worker:3C: input %2 comes in the whole input "
                                                 "on c1, but no READ before it extracts it"):
        _changed(plan, forget_one).start()


def test_ring_depths_are_the_stored_slots(ray_cluster):
    """Channel.slots: every ring is created with the plan's slots (the driver's input ring
    and an actor's ring alike), not a depth the runtime works out."""
    plan = G.chain_plan(2)
    low = plan.proto.lowered
    cap = plan.proto.config.capacity
    assert [ch.slots for ch in low.channels] == [cap, 2, cap]
    with plan.start(get_timeout=30) as g:  # as compiled
        assert [w.slots for w in g.endpoints.writers] == [cap]
        assert _actor_state(g, "ring_slots") == {"worker0": {2: 2}, "worker1": {3: cap}}

    def deeper(p: pb.Plan) -> None:
        p.lowered.channels[0].slots = cap + 3  # the driver's input ring
        p.lowered.channels[1].slots = 1  # worker0 -> worker1: no double-buffering
        p.lowered.channels[2].slots = cap + 1

    with _changed(plan, deeper).start(get_timeout=30) as g:
        assert [w.slots for w in g.endpoints.writers] == [cap + 3]
        assert _actor_state(g, "ring_slots") == {"worker0": {2: 1}, "worker1": {3: cap + 1}}
        refs = [g.execute(i) for i in range(cap)]
        assert [r.get() for r in refs] == [i + 3 for i in range(cap)]
