"""``Plan``: a compiled plan in memory, and ``load`` to read one from a ``.cgplan`` file.

A ``Plan`` wraps the ``pb.Plan`` protobuf plus two optional in-process side tables that
``cgc.compile(dag)`` fills: live Ray actor handles and actor classes, both by actor name.
Files carry neither; a loaded plan finds its classes by import (or embedded source) and its
external actors by name. Every ``Plan`` carries its trust decision (``Plan.trust``): ``load``
decides it from the file's content and signature; a plan built in this process is its
caller's own. ``start()`` refuses a plan its decision does not cover before anything runs.

Example::

    plan = cgc.runtime.load("echo.cgplan")
    with plan.start() as graph:
        print(graph.execute("hi").get())
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cgc.plan_schema import DRIVER, PlanFormatError, write_plan
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.trust import TrustDecision, in_process

if TYPE_CHECKING:
    from cgc.runtime.driver import CompiledGraph

__all__ = ["Plan", "load", "check_runnable"]


class Plan:
    """A plan in memory: ``proto`` (a ``pb.Plan``) plus live handles and classes by actor.

    Example: ``Plan(proto).start()`` (``cgc.compile(dag)`` builds one for you).
    """

    def __init__(
        self,
        proto: pb.Plan,
        *,
        live_handles: Mapping[str, Any] | None = None,
        classes: Mapping[str, Any] | None = None,
        trust: TrustDecision | None = None,
    ) -> None:
        self.proto = proto
        self.live_handles: dict[str, Any] = dict(live_handles or {})
        self.classes: dict[str, Any] = dict(classes or {})
        # None: built in this process (cgc.compile, Plan(proto)), so the caller's own.
        self.trust: TrustDecision = trust if trust is not None else in_process()

    @property
    def name(self) -> str:
        """The plan's name (the model file's stem for compiled files)."""
        return self.proto.name

    def __repr__(self) -> str:
        g = self.proto.graph
        return (
            f"<cgc.Plan {self.name!r}: {len(g.actors)} actors, {len(g.nodes)} nodes, "
            f"{len(self.proto.lowered.channels)} channels>"
        )

    def save(self, path: str | os.PathLike[str], *, sign: bool = True) -> None:
        """Write the plan to ``path`` (atomically), signed with the user's key unless
        ``sign`` is False. Live handles and classes are not saved.

        The key is made on first use (``cgc.plan_schema.signing``), so a plan saved and
        loaded by the same user needs no ``trust=True``.

        Example: ``cgc.compile(dag).save("graph.cgplan")``.

        Raises:
            OSError: the file cannot be written.
            KeyFileError: the user's key file is malformed or open to other users.
        """
        key = None
        if sign:
            from cgc.plan_schema.signing import load_or_create_key

            key = load_or_create_key()
        write_plan(self.proto, path, key=key)

    def start(
        self,
        address: str | None = None,
        *,
        submit_timeout: float | None = None,
        get_timeout: float | None = None,
        teardown_timeout: float | None = None,
        setup_timeout: float | None = None,
        communicator: str = "auto",
        capacity: int | None = None,
        spin_us: int | None = None,
        host_transport: str = "auto",
    ) -> CompiledGraph:
        """Start the plan on Ray and return the running graph.

        ``address``: None starts (or reuses) a local Ray sized for the plan's actors;
        ``"auto"`` or a URL joins a cluster. Timeouts (seconds) default to ``plan.config``
        (0 there: submit 30 s, get unlimited, teardown 10 s, set-up 120 s). ``communicator``:
        ``"auto"`` (NCCL with GPUs, else the CPU communicator) or ``"cpu"``.
        ``capacity`` lowers the executions in flight (never above the driver channels'
        slots); ``spin_us`` overrides the plan's busy-wait; ``host_transport``: ``"auto"``
        (shared memory on one node, TCP across nodes) or ``"tcp"`` (TCP everywhere, to
        exercise the cross-node path on one machine).

        Example::

            with plan.start(get_timeout=5) as graph:
                ref = graph.execute(1)
                print(ref.get())

        Raises:
            UntrustedPlanError: the plan's trust decision does not allow it to run (checked
                before any actor is created or any code from the plan runs).
            PlanFormatError: the plan has no lowered part or is inconsistent.
            PlacementError: some actors cannot be placed on the cluster (named).
            SetupError: actors, channels or warm-up failed.
        """
        from cgc.runtime.start import start_graph
        from cgc.runtime.trust_gate import require_trusted

        require_trusted(self)

        return start_graph(
            self,
            address,
            submit_timeout=submit_timeout,
            get_timeout=get_timeout,
            teardown_timeout=teardown_timeout,
            setup_timeout=setup_timeout,
            communicator=communicator,
            capacity=capacity,
            spin_us=spin_us,
            host_transport=host_transport,
        )


def load(path: str | os.PathLike[str], *, trust: bool = False) -> Plan:
    """Read a ``.cgplan`` file into a ``Plan``, deciding whether it may run here.

    A plan that holds embedded source, pickled values, a runtime_env or external actors
    loads only when signed by a key the user trusts (their own, or one in their
    trusted-keys file) or with ``trust=True``; the decision is kept as ``Plan.trust``.
    Loading never unpickles or executes anything from the file.

    Example: ``plan = cgc.load("echo.cgplan")``.

    Raises:
        PlanFormatError: missing, not a plan, truncated, corrupted or too new.
        UntrustedPlanError: the plan needs trust and nothing vouches for it; the message
            lists exactly what would run.
        KeyFileError: the user's key files are malformed or open to other users.
    """
    from cgc.plan_schema.planfile import open_plan
    from cgc.plan_schema.trust import decide, untrusted_error

    pf = open_plan(path)
    decision = decide(pf, trust=trust)
    if not decision.allowed:
        raise untrusted_error(decision, pf.plan.name or pf.header.name, str(path))
    return Plan(pf.plan, trust=decision)


def check_runnable(proto: pb.Plan) -> None:
    """Check the lowered part is there and consistent enough to run.

    Raises:
        PlanFormatError: what is missing or inconsistent, naming the actor or channel.
    """
    g, low = proto.graph, proto.lowered
    where = f"plan {proto.name!r}"
    if not g.actors:
        raise PlanFormatError(f"{where} has no actors")
    if len(low.programs) != len(g.actors):
        raise PlanFormatError(
            f"{where} has {len(low.programs)} programs for {len(g.actors)} actors "
            "(not lowered? compile it with `cgc compile` or cgc.compile)"
        )
    names = [a.name for a in g.actors]
    for actor, prog in zip(g.actors, low.programs, strict=True):
        if prog.actor != actor.name:
            raise PlanFormatError(f"{where}: program {prog.actor!r} is not actor {actor.name!r}")
    endpoints = set(names) | {DRIVER}
    n_nodes = len(g.nodes)
    for i, ch in enumerate(low.channels):
        if ch.id != i + 1:
            raise PlanFormatError(f"{where}: channel ids must be dense from 1 (got {ch.id})")
        if ch.writer not in endpoints or any(r not in endpoints for r in ch.readers):
            raise PlanFormatError(f"{where}: channel {ch.id} names an unknown endpoint")
        if not ch.readers:
            raise PlanFormatError(f"{where}: channel {ch.id} has no readers")
        if ch.source.node >= n_nodes:
            raise PlanFormatError(f"{where}: channel {ch.id} carries unknown node")
        if ch.kind == pb.CHAN_NCCL and ch.communicator >= len(low.communicators):
            raise PlanFormatError(f"{where}: channel {ch.id} names a missing communicator")
    n_ch = len(low.channels)
    for cid in list(low.input_channels) + list(low.output_channels):
        if not 1 <= cid <= n_ch:
            raise PlanFormatError(f"{where}: driver channel {cid} does not exist")
    for prog in low.programs:
        for op in list(prog.prologue) + list(prog.ops):
            if op.task >= n_nodes or op.channel > n_ch:
                raise PlanFormatError(
                    f"{where}: program of {prog.actor!r} has an op on unknown task/channel"
                )
