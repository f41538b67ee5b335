"""Plans built to make the verifier work hard: the shapes an adversarial audit used (issue 20).

Each generator returns a *valid* ``pb.Plan`` (it passes ``cgc check``), built directly as
protobuf (no compiler: the compiler never writes these shapes, a stranger's file may):

* ``actors_channels``: a chain of calls over many actors, one host channel per hop. The
  structure check once walked every channel for every actor's program (actors x channels),
  and the simulator's sweeps moved one hop per sweep when the chain runs against the
  actors' order (``reverse``).
* ``prefetch_capacity``: one actor, a long local chain of calls, one READ of the next
  execution's input (``exec_offset = 1``) in the middle of the loop and a large capacity.
  The simulator once stepped ``capacity + 2`` executions of it; now ``min(capacity, K + 2)
  + K`` at capacity ``min(capacity, K + 2)`` (4 executions at capacity 3: ``K = 1`` here).
* ``keyword_inputs``: many keyword inputs (``Graph.keyword_fields``), each its own
  ``INPUT_ATTR`` node, all taken by one call out of the whole input. Each node's field was
  once looked up by a scan of ``keyword_fields`` (fields x nodes).
* ``wide_collective``: one allreduce over many actors (per-op work once grew with the
  number of members).

``tools/bench/bench_verify_dos.py`` times ``cgc check`` on them; ``test_bounded.py`` beside this file
checks that the verifier's work grows linearly with their size.

Example::

    plan = actors_channels(actors=8, channels=100)
    cgc.plan_schema.verify.verify_plan(plan)
"""

from __future__ import annotations

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb

__all__ = ["actors_channels", "prefetch_capacity", "keyword_inputs", "wide_collective",
           "GENERATORS"]

_SLOT_BYTES = 64  # small rings: the plans stay within Limits.ring_bytes at any size


def _plan(name: str, capacity: int, **graph: object) -> tuple[pb.Plan, pb.Graph]:
    """A new plan and its graph (filled in place: protobuf copies what it is given)."""
    plan = pb.Plan(name=name, graph=pb.Graph(**graph))
    plan.config.capacity = capacity
    return plan, plan.graph


def _actor(g: pb.Graph, name: str, gpus: float = 0) -> None:
    a = g.actors.add(name=name)
    a.cls.module, a.cls.qualname = "model", "Worker"
    if gpus:
        a.options.num_gpus = gpus


def _host(low: pb.Lowered, writer: str, readers: list[str], src: int, slots: int) -> int:
    cid = len(low.channels) + 1
    low.channels.add(id=cid, kind=pb.CHAN_HOST, writer=writer, readers=sorted(readers),
                     source=pb.NodeRef(node=src), slots=slots, slot_bytes=_SLOT_BYTES)
    return cid


def _call(g: pb.Graph, actor: str, arg: int, bind: int) -> int:
    nid = len(g.nodes)
    g.nodes.add(id=nid, kind=pb.CALL, actor=actor, method="f", name=f"n{nid}",
                bind_index=bind, args=[pb.Arg(ref=pb.NodeRef(node=arg))])
    return nid


def _output(g: pb.Graph, src: int) -> int:
    nid = len(g.nodes)
    g.nodes.add(id=nid, kind=pb.OUTPUT, name="output", args=[pb.Arg(ref=pb.NodeRef(node=src))])
    return nid


def actors_channels(actors: int = 4096, channels: int = 100_000, *,
                    reverse: bool = True) -> pb.Plan:
    """A chain of ``channels - 1`` calls round-robin over ``actors`` actors: the driver's
    input, one host channel per hop, and the output (``channels`` channels in all).

    ``reverse`` places call ``k`` on actor ``actors - 1 - k % actors``, against the order
    the simulator visits actors in.
    """
    if actors < 2 or channels < 2:
        raise ValueError("needs at least 2 actors and 2 channels")
    plan, g = _plan("actors_channels", 1, num_positional=1)
    names = [f"a{i}" for i in range(actors)]
    for n in names:
        _actor(g, n)
    g.nodes.add(id=0, kind=pb.INPUT, name="input")
    g.nodes.add(id=1, kind=pb.INPUT_ATTR, key_kind=pb.INDEX, index=0, name="input[0]")
    low = plan.lowered
    ops: dict[str, list[pb.Op]] = {n: [] for n in names}
    binds = dict.fromkeys(names, 0)
    prev, prev_owner = 1, DRIVER
    for k in range(channels - 1):
        owner = names[actors - 1 - k % actors] if reverse else names[k % actors]
        nid = _call(g, owner, prev, binds[owner])
        binds[owner] += 1
        cid = _host(low, prev_owner, [owner], prev, 1)
        low.edges.add(source=pb.NodeRef(node=prev), target=nid, transport=pb.HOST, channel=cid)
        ops[owner] += [pb.Op(kind=pb.READ, task=nid, channel=cid),
                       pb.Op(kind=pb.COMPUTE, task=nid),
                       pb.Op(kind=pb.WRITE, task=nid, channel=cid + 1)]
        prev, prev_owner = nid, owner
    out = _output(g, prev)
    cid = _host(low, prev_owner, [DRIVER], prev, 1)
    low.edges.add(source=pb.NodeRef(node=prev), target=out, transport=pb.HOST, channel=cid)
    low.input_channels.append(1)
    low.output_channels.append(cid)
    for n in names:
        low.programs.add(actor=n, ops=ops[n])
    return plan


def prefetch_capacity(nodes: int = 150_000, capacity: int = 1024, *,
                      at: float = 0.5) -> pb.Plan:
    """One actor computing a local chain of ``nodes`` calls; its loop reads the next
    execution's input (``exec_offset = 1``) at fraction ``at`` of the chain, so at least
    2 executions must be in flight; ``capacity`` executions may be.
    """
    if nodes < 2 or capacity < 2:
        raise ValueError("needs at least 2 nodes and capacity 2")
    plan, g = _plan("prefetch_capacity", capacity, num_positional=1)
    _actor(g, "a")
    g.nodes.add(id=0, kind=pb.INPUT, name="input")
    g.nodes.add(id=1, kind=pb.INPUT_ATTR, key_kind=pb.INDEX, index=0, name="input[0]")
    low = plan.lowered
    c_in = _host(low, DRIVER, ["a"], 1, capacity)
    loop: list[pb.Op] = []
    prev = 1
    split = max(1, min(nodes - 1, int(nodes * at)))
    for k in range(nodes):
        nid = _call(g, "a", prev, k)
        if k == 0:
            low.edges.add(source=pb.NodeRef(node=1), target=nid, transport=pb.HOST,
                          channel=c_in)
        else:
            low.edges.add(source=pb.NodeRef(node=prev), target=nid, transport=pb.LOCAL)
        if k == split:
            loop.append(pb.Op(kind=pb.READ, task=2, channel=c_in, exec_offset=1))
        loop.append(pb.Op(kind=pb.COMPUTE, task=nid))
        prev = nid
    out = _output(g, prev)
    c_out = _host(low, "a", [DRIVER], prev, capacity)
    low.edges.add(source=pb.NodeRef(node=prev), target=out, transport=pb.HOST, channel=c_out)
    loop.append(pb.Op(kind=pb.WRITE, task=prev, channel=c_out))
    low.input_channels.append(c_in)
    low.output_channels.append(c_out)
    low.programs.add(actor="a", prologue=[pb.Op(kind=pb.READ, task=2, channel=c_in)], ops=loop)
    return plan


def keyword_inputs(fields: int = 40_000) -> pb.Plan:
    """``fields`` keyword inputs, each an ``INPUT_ATTR`` node, all arguments of one call that
    takes them out of the whole input (one READ extracting every one)."""
    plan, g = _plan("keyword_inputs", 1)
    _actor(g, "a")
    g.nodes.add(id=0, kind=pb.INPUT, name="input")
    names = [f"k{i:06d}" for i in range(fields)]
    g.keyword_fields.extend(names)
    for i, f in enumerate(names):
        g.nodes.add(id=i + 1, kind=pb.INPUT_ATTR, key_kind=pb.FIELD, field=f, name=f"input.{f}")
    call = len(g.nodes)
    g.nodes.add(id=call, kind=pb.CALL, actor="a", method="f", name="a.f#0",
                kwargs=[pb.NamedArg(name=f, arg=pb.Arg(ref=pb.NodeRef(node=i + 1)))
                        for i, f in enumerate(names)])
    out = _output(g, call)
    low = plan.lowered
    c_in = _host(low, DRIVER, ["a"], 0, 1)
    c_out = _host(low, "a", [DRIVER], call, 1)
    for i in range(fields):
        low.edges.add(source=pb.NodeRef(node=i + 1), target=call, transport=pb.HOST,
                      channel=c_in)
    low.edges.add(source=pb.NodeRef(node=call), target=out, transport=pb.HOST, channel=c_out)
    low.input_channels.append(c_in)
    low.output_channels.append(c_out)
    low.programs.add(actor="a", ops=[
        pb.Op(kind=pb.READ, task=call, channel=c_in, extract=range(1, fields + 1)),
        pb.Op(kind=pb.COMPUTE, task=call),
        pb.Op(kind=pb.WRITE, task=call, channel=c_out)])
    return plan


def wide_collective(members: int = 4096) -> pb.Plan:
    """One allreduce over ``members`` GPU actors, each fed by the driver and read back."""
    plan, g = _plan("wide_collective", 1, num_positional=1)
    names = [f"w{i}" for i in range(members)]
    for n in names:
        _actor(g, n, gpus=1)
    g.nodes.add(id=0, kind=pb.INPUT, name="input")
    g.nodes.add(id=1, kind=pb.INPUT_ATTR, key_kind=pb.INDEX, index=0, name="input[0]")
    low = plan.lowered
    c_in = _host(low, DRIVER, names, 1, 1)
    coll = g.collectives.add(id=0, kind=pb.ALLREDUCE)
    low.communicators.add(id=0, members=names)
    progs = []
    for n in names:
        nid = len(g.nodes)
        g.nodes.add(id=nid, kind=pb.COLLECTIVE, actor=n, name=f"{n}.allreduce", collective=0,
                    args=[pb.Arg(ref=pb.NodeRef(node=1))])
        coll.nodes.append(nid)
        low.edges.add(source=pb.NodeRef(node=1), target=nid, transport=pb.HOST, channel=c_in)
        progs.append([pb.Op(kind=pb.READ, task=nid, channel=c_in),
                      pb.Op(kind=pb.COLL, task=nid, seq=0, communicator=0)])
    first = coll.nodes[0]
    out = _output(g, first)
    c_out = _host(low, names[0], [DRIVER], first, 1)
    low.edges.add(source=pb.NodeRef(node=first), target=out, transport=pb.HOST, channel=c_out)
    progs[0].append(pb.Op(kind=pb.WRITE, task=first, channel=c_out))
    low.input_channels.append(c_in)
    low.output_channels.append(c_out)
    for n, ops in zip(names, progs, strict=True):
        low.programs.add(actor=n, ops=ops)
    return plan


# name -> (generator, its size arguments): the audit's sizes, except where Limits now bounds
# the field (keyword_inputs at Limits.keyword_fields; the audit's 40,000 is refused at once).
GENERATORS = {
    "actors_channels": (actors_channels, {"actors": 4096, "channels": 100_000}),
    "prefetch_capacity": (prefetch_capacity, {"nodes": 150_000, "capacity": 1024}),
    "keyword_inputs": (keyword_inputs, {"fields": 4096}),
    "keyword_inputs_audit": (keyword_inputs, {"fields": 40_000}),
    "wide_collective": (wide_collective, {"members": 4096}),
}
