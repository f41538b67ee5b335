"""The state a lowering run threads through the passes, the options, and the Pass record.

Each pass is a plain function ``run(state) -> None`` with a precondition and a
postcondition, both plain functions that raise ``PassInvariantError`` (a compiler bug, not
a user error) when they do not hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import LIMITS, Limits
from cgc.plan_schema.errors import CgcError

__all__ = ["LowerOptions", "LowerState", "Pass", "PassInvariantError", "require"]


class PassInvariantError(CgcError):
    """A pass's pre- or postcondition failed: a bug in cgc, reported with the pass name."""


@dataclass
class LowerOptions:
    """Knobs of ``lower``.

    Attributes:
        overlap: None = on where it helps (plans with NCCL ops), True/False force it.
        costs: estimated microseconds per call, keyed ``"actor.method"`` (or ``"method"``
            for every actor), plus ``"transfer"`` for one channel transfer.
        slots: force every channel's ring depth (None = chosen per channel).
        verify_executions: executions the verifier steps (None = what decides every
            number of executions; see ``cgc.plan_schema.verify.simulate``).
        capacity: force ``config.capacity`` (None = computed from the pipeline depth);
            Ray's ``_max_inflight_executions``.
        at_capacity: ``"wait"`` (``execute()`` waits for room, cgc's default) or
            ``"raise"`` (it raises at once, as Ray Compiled Graph does); written to
            ``config.at_capacity``.
        limits: the bounds the plan must keep (``cgc.plan_schema.defaults.LIMITS``).
        gpu_hint_without_gpu: what a ``device="gpu"`` hint towards a reader without a GPU
            gets: ``"refuse"`` (cgc's compile-time error) or ``"run"`` (Ray 2.60's rule,
            for ``cgc.ray_compat``: the edge is compiled and the reader's move to the GPU
            fails when it runs, where Ray's does).
    """

    overlap: bool | None = None
    costs: dict[str, float] = field(default_factory=dict)
    slots: int | None = None
    verify_executions: int | None = None
    capacity: int | None = None
    at_capacity: str = "wait"
    limits: Limits = LIMITS
    gpu_hint_without_gpu: str = "refuse"


@dataclass
class LowerState:
    """Everything the passes share: the plan being filled, the working graph, scratch."""

    plan: pb.Plan
    options: LowerOptions
    # the working graph (cgc.ir.attrs); lower() builds it from plan.graph before any pass
    g: nx.MultiDiGraph = field(default_factory=nx.MultiDiGraph)
    # actor -> task ids in bind order
    tasks: dict[str, list[int]] = field(default_factory=dict)
    # (node, output_index, pb.ChannelKind) -> channel id
    channel_of: dict[tuple[int, int, int], int] = field(default_factory=dict)
    # collective id -> communicator id
    coll_comm: dict[int, int] = field(default_factory=dict)
    # pipeline stage of every task (longest path in cross-actor hops)
    stage: dict[int, int] = field(default_factory=dict)
    costs_used: dict[str, float] = field(default_factory=dict)
    makespan_us: float = 0.0
    # per-pass scratch space (e.g. what a postcondition compares against)
    scratch: dict = field(default_factory=dict)

    @property
    def lowered(self) -> pb.Lowered:
        return self.plan.lowered


@dataclass(frozen=True)
class Pass:
    """One pass: ``run`` plus the conditions checked before and after it."""

    name: str
    run: Callable[[LowerState], None]
    pre: Callable[[LowerState], None] = lambda s: None
    post: Callable[[LowerState], None] = lambda s: None


def require(cond: bool, pass_name: str, message: str) -> None:
    """Raise PassInvariantError(``"<pass>: <message>"``) unless ``cond``."""
    if not cond:
        raise PassInvariantError(f"internal error in pass {pass_name}: {message}")
