"""The verifier's check of weight syncs: both ends of each sync agree with its transfer plan.

For every ``Graph.weight_syncs[i]`` and ``Lowered.transfers[i]``: the source and targets
are actors of the plan; the send node is a ``cgc.sync.send`` call on the source with one
output per bucket; each target's ``cgc.sync.recv`` call takes exactly those outputs, in
order; every parameter's byte count fits its shape and dtype; the buckets cover the
parameters with bytes once each, in order, packed from offset 0; and the digest is the
SHA-256 of the parameter list. No other node is an end of a sync.

Example: ``check_weight_syncs(plan)`` returns None for a plan ``cgc compile`` wrote.
"""

from __future__ import annotations

from typing import NoReturn

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.verify.errors import PlanStructureError
from cgc.plan_schema.weight_sync import (
    RECV_METHOD,
    SEND_METHOD,
    WeightSpecError,
    param_digest,
    param_nbytes,
)

__all__ = ["check_weight_syncs"]


def _fail(msg: str) -> NoReturn:
    raise PlanStructureError(f"invalid plan: {msg}")


def _check_ends(plan: pb.Plan, s: pb.WeightSync, nb: int, what: str) -> None:
    """Send and receive nodes: actors, methods and the bucket arguments."""
    g = plan.graph
    actors = {a.name for a in g.actors}
    for a in [s.source, *s.targets]:
        if a not in actors:
            _fail(f"{what}: actor {a!r} is not in the plan")
    if len(set(s.targets)) != len(s.targets) or s.source in s.targets:
        _fail(f"{what}: targets must be distinct actors other than the source")
    if s.send_node >= len(g.nodes):
        _fail(f"{what}: send node {s.send_node} does not exist")
    send = g.nodes[s.send_node]
    if (send.kind, send.actor, send.method) != (pb.CALL, s.source, SEND_METHOD):
        _fail(f"{what}: node {send.name} is not the {SEND_METHOD} call on {s.source}")
    if send.num_returns != nb or len(send.args) != 1:
        _fail(f"{what}: the send node must have one argument and {nb} outputs (one per "
              f"bucket), it has {len(send.args)} and {send.num_returns}")
    if len(s.recv_nodes) != len(s.targets):
        _fail(f"{what}: {len(s.recv_nodes)} receive nodes for {len(s.targets)} targets")
    want = [(s.send_node, i) for i in range(nb)]
    for target, rid in zip(s.targets, s.recv_nodes, strict=True):
        if rid >= len(g.nodes):
            _fail(f"{what}: receive node {rid} does not exist")
        r = g.nodes[rid]
        if (r.kind, r.actor, r.method) != (pb.CALL, target, RECV_METHOD):
            _fail(f"{what}: node {r.name} is not the {RECV_METHOD} call on {target}")
        got = [(a.ref.node, a.ref.output_index) if a.WhichOneof("kind") == "ref" else None
               for a in r.args]
        if got != want or r.kwargs:
            _fail(f"{what}: {r.name} must take the {nb} buckets of {send.name} in order")


def _check_buckets(s: pb.WeightSync, t: pb.TransferPlan, what: str) -> None:
    """Parameter sizes, bucket packing and coverage, and the digest."""
    specs = [(p.name, tuple(p.shape), p.dtype) for p in s.params]
    names = [p.name for p in s.params]
    if len(set(names)) != len(names):
        _fail(f"{what}: a parameter name appears twice")
    for p in s.params:
        try:
            n = param_nbytes(p.name, tuple(p.shape), p.dtype)
        except WeightSpecError as exc:
            _fail(f"{what}: {exc}")
        if n != p.nbytes:
            _fail(f"{what}: parameter {p.name!r} says {p.nbytes} bytes, its shape and dtype "
                  f"make {n}")
    seen: list[int] = []
    for i, b in enumerate(t.buckets):
        if b.index != i or not b.members:
            _fail(f"{what}: bucket {i} has index {b.index} or no members")
        at = 0
        for m in b.members:
            if m.param >= len(s.params):
                _fail(f"{what}: bucket {i} names parameter {m.param}, there are {len(s.params)}")
            p = s.params[m.param]
            if m.offset != at or m.nbytes != p.nbytes:
                _fail(f"{what}: bucket {i}: parameter {p.name!r} at offset {m.offset} with "
                      f"{m.nbytes} bytes, expected offset {at} with {p.nbytes}")
            at += m.nbytes
            seen.append(m.param)
        if b.nbytes != at:
            _fail(f"{what}: bucket {i} says {b.nbytes} bytes, its members hold {at}")
    want = [i for i, p in enumerate(s.params) if p.nbytes]
    if seen != want:
        _fail(f"{what}: the buckets must hold every parameter with bytes once, in order")
    if t.total_bytes != sum(b.nbytes for b in t.buckets):
        _fail(f"{what}: total_bytes {t.total_bytes} is not the buckets' sum")
    if t.digest != param_digest(specs):
        _fail(f"{what}: the digest {t.digest.hex()[:16]}... does not match the parameter "
              f"list ({param_digest(specs).hex()[:16]}...): the list or the digest was changed")


def check_weight_syncs(plan: pb.Plan) -> None:
    """Check every weight sync against its transfer plan (module docstring).

    Example: ``check_weight_syncs(pb.Plan())`` returns None (no syncs).

    Raises:
        PlanStructureError: the first disagreement, naming the sync and what disagrees.
    """
    g, low = plan.graph, plan.lowered
    if len(low.transfers) != len(g.weight_syncs):
        _fail(f"{len(g.weight_syncs)} weight syncs but {len(low.transfers)} transfer plans")
    for i, (s, t) in enumerate(zip(g.weight_syncs, low.transfers, strict=True)):
        what = f"weight sync {i} ({s.name!r})"
        if s.id != i or t.sync != i:
            _fail(f"{what}: id {s.id} / transfer plan of sync {t.sync}, expected {i}")
        _check_ends(plan, s, len(t.buckets), what)
        _check_buckets(s, t, what)
    ends = {s.send_node for s in g.weight_syncs} | {r for s in g.weight_syncs
                                                   for r in s.recv_nodes}
    for n in g.nodes:
        if n.method in (SEND_METHOD, RECV_METHOD) and n.id not in ends:
            _fail(f"node {n.name} calls {n.method} but belongs to no weight sync")
