"""Declaring a weight sync in the builder: a learner's module parameters into the same
module on rollout actors, in place, every execution (docs/weight_sync.md).

``weight_sync`` emits the two ends as call nodes (one bucket per output of the source's
node); the tracer turns the declaration into ``pb.Graph.weight_syncs`` and pass
``cgc.passes.weight_sync`` into the transfer plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cgc.errors import CompileError
from cgc.frontend.locations import RawLoc, capture_loc
from cgc.frontend.nodes import CallNode, DAGNode, HintSpec
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.weight_sync import (
    DEFAULT_BUCKET_BYTES,
    RECV_METHOD,
    SEND_METHOD,
    WeightSpecError,
    bucket_layout,
    param_nbytes,
)

__all__ = ["WeightSpec", "weight_sync", "SyncNode"]


@dataclass(frozen=True)
class WeightSpec:
    """The parameter list of a weight sync, known at compile time: ``(name, shape, dtype)``
    per parameter, in the module's ``named_parameters()`` order.

    Example:
        >>> spec = WeightSpec([("w", (4, 2), "float32"), ("b", (2,), "float32")])
        >>> spec.nbytes
        40

    Raises:
        WeightSpecError: a name that is not a non-empty str, twice the same name, a shape
            that is not a sequence of ints >= 0, or a dtype cgc cannot sync.
    """

    params: tuple[tuple[str, tuple[int, ...], str], ...]

    def __init__(self, params: Sequence[tuple[str, Sequence[int], Any]]) -> None:
        norm = []
        for p in params:
            name, shape, dtype = p
            if not isinstance(name, str) or not name:
                raise WeightSpecError(f"a parameter name must be a non-empty str, got {name!r}")
            if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
                raise WeightSpecError(f"parameter {name!r}: shape {tuple(shape)!r} is not ints")
            dt = str(dtype).removeprefix("torch.")
            param_nbytes(name, shape, dt)
            norm.append((name, tuple(int(d) for d in shape), dt))
        names = [n for n, _, _ in norm]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise WeightSpecError(f"parameter names appear twice: {', '.join(dup)}")
        object.__setattr__(self, "params", tuple(norm))

    @classmethod
    def of(cls, module: Any) -> WeightSpec:
        """The spec of a torch module's ``named_parameters()`` (any device, ``meta`` too).

        Example: ``WeightSpec.of(torch.nn.Linear(4, 2)).params[0]`` is
        ``("weight", (2, 4), "float32")``.

        Raises:
            WeightSpecError: as the constructor.
        """
        return cls([(n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters()])

    @classmethod
    def from_module(cls, build: Callable[[], Any]) -> WeightSpec:
        """Build the module with ``build()`` on torch's ``meta`` device (no memory, no
        weights read) and take its spec.

        Example: ``WeightSpec.from_module(lambda: torch.nn.Linear(4, 2))``.

        Raises:
            WeightSpecError: as the constructor.
        """
        import torch

        with torch.device("meta"):
            module = build()
        return cls.of(module)

    @property
    def nbytes(self) -> int:
        """Bytes of all parameters."""
        return sum(param_nbytes(*p) for p in self.params)


@dataclass(eq=False)
class _Sync:
    """One declaration, shared by its nodes (the tracer emits it once)."""

    spec: WeightSpec
    source: Any
    source_attr: str
    targets: list[Any]
    target_attr: str
    bucket_bytes: int
    name: str
    loc: RawLoc
    send: Any = None
    recvs: list[Any] = field(default_factory=list)


class SyncNode(CallNode):
    """An end of a weight sync: ``cgc.sync.send`` on the source, ``cgc.sync.recv`` on a
    target (no user method; the runtime runs it)."""

    sync: _Sync

    def __init__(self, actor: Any, method: str, args: tuple[Any, ...], num_returns: int,
                 sync: _Sync) -> None:
        self.sync = sync
        super().__init__(actor, method, args, {}, num_returns, sync.loc)


def weight_sync(source: Any, targets: Sequence[Any], spec: WeightSpec, *, after: DAGNode,
                attr: str = "model", target_attr: str | None = None,
                bucket_bytes: int = DEFAULT_BUCKET_BYTES, transport: str = "auto",
                name: str = "") -> list[CallNode]:
    """Copy ``source.<attr>``'s parameters into every ``target.<target_attr>`` in place,
    once per execution, after ``after`` (typically the learner's train step) is computed.

    The parameter list is ``spec`` (names, shapes, dtypes), fixed at compile time; the
    compiler packs it into buckets of at most ``bucket_bytes`` (one channel each, over
    ``transport``: ``"auto"``, ``"nccl"``, ``"host"``) and stores the transfer plan and the
    list's digest in the plan. Each end checks its live module against the digest at start.
    Returns one node per target: the bytes it received (an int), after its parameters were
    replaced; bind a target's next calls on it, or return it.

    Example::

        spec = cgc.WeightSpec.from_module(lambda: Policy(cfg))
        loss = learner.train.bind(*samples)
        synced = cgc.weight_sync(learner, rollouts, spec, after=loss, attr="policy")
        dag = MultiOutputNode([r.report.bind(s) for r, s in zip(rollouts, synced)])

    Raises:
        CompileError: no targets, a target twice or the source among them, an attribute
            that is not an identifier, ``after`` that is not a node, or a spec of 0 bytes.
        WeightSpecError: ``bucket_bytes`` < 1.
    """
    loc = capture_loc()
    targets = list(targets)
    tattr = attr if target_attr is None else target_attr
    problem = ("no target actors" if not targets
               else "a target appears twice" if len({id(t) for t in targets}) < len(targets)
               else "the source is among the targets" if any(t is source for t in targets)
               else f"attribute {attr!r} is not an identifier" if not attr.isidentifier()
               else f"attribute {tattr!r} is not an identifier" if not tattr.isidentifier()
               else "after= must be a node of the graph" if not isinstance(after, DAGNode)
               else "")
    layout = bucket_layout(spec.params, bucket_bytes)
    problem = problem or ("" if layout else "the spec has no parameter bytes to sync")
    if problem:
        raise CompileError(f"{loc.short()}: weight_sync: {problem}", loc=loc.short())
    sync = _Sync(spec, source, attr, targets, tattr, bucket_bytes, name or tattr, loc)
    nb = len(layout)
    sync.send = SyncNode(source, SEND_METHOD, (after,), nb, sync)
    for i, members in enumerate(layout):
        nbytes = sum(m.nbytes for m in members)
        hint = HintSpec(transport=transport, static_shape=True, direct_return=True,
                        shape=(nbytes,), dtype="uint8", loc=loc)
        sync.send._hints[None if nb == 1 else i] = hint
    buckets = [sync.send] if nb == 1 else list(sync.send)
    sync.recvs = [SyncNode(t, RECV_METHOD, tuple(buckets), 1, sync) for t in targets]
    return list(sync.recvs)


def sync_proto(sync: _Sync, sid: int, ids: dict[int, int], actor_names: dict[int, str],
               loc: pb.SourceLoc) -> pb.WeightSync:
    """The ``pb.WeightSync`` of a traced declaration (``ids``: node object id -> node id)."""
    out = pb.WeightSync(id=sid, name=sync.name, source=actor_names[id(sync.source)],
                        source_attr=sync.source_attr, target_attr=sync.target_attr,
                        bucket_bytes=sync.bucket_bytes, send_node=ids[id(sync.send)])
    out.targets.extend(actor_names[id(t)] for t in sync.targets)
    out.recv_nodes.extend(ids[id(r)] for r in sync.recvs)
    for n, shape, dt in sync.spec.params:
        out.params.add(name=n, shape=shape, dtype=dt, nbytes=param_nbytes(n, shape, dt))
    out.loc.CopyFrom(loc)
    return out
