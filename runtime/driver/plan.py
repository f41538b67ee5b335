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

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema import write_plan
from cgc.plan_schema.trust import TrustDecision, in_process

if TYPE_CHECKING:
    from cgc.runtime.driver.graph import CompiledGraph

__all__ = ["Plan", "load"]


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
        communicator: str | None = None,
        capacity: int | None = None,
        at_capacity: str | None = None,
        max_buffered_results: int | None = None,
        max_buffered_bytes: int | None = None,
        slot_bytes: int | None = None,
        spin_us: float | None = None,
        host_transport: str | None = None,
        trace: str | os.PathLike[str] | None = None,
        torch_profile: str | os.PathLike[str] | None = None,
        nvtx: bool | None = None,
        wake_ahead: int | None = None,
        max_frame_bytes: int | None = None,
        dashboard: bool | None = None,
        cuda_graphs: bool | None = None,
        ray_events: bool | None = None,
    ) -> CompiledGraph:
        """Verify the plan, start it on Ray and return the running graph.

        ``address``: None starts (or reuses) a local Ray sized for the plan's actors;
        ``"auto"`` or a URL joins a cluster. Every other argument overrides the plan's
        setting for this run (None keeps the plan's; ``cgc.plan_schema.defaults`` documents
        each): timeouts in seconds (0 = no limit); ``communicator`` ``"auto"`` (NCCL
        between GPUs, else the CPU communicator), ``"cpu"`` or ``"nccl"``; ``capacity``
        lowers the executions in flight (never above the plan's); ``at_capacity``
        ``"wait"`` or ``"raise"``; ``slot_bytes``: the initial slot size of channels whose
        plan entry names none; ``host_transport`` ``"auto"``, ``"shm"`` or ``"tcp"``
        (TCP everywhere, to exercise the cross-node path on one machine); ``trace``: a file
        that teardown writes a Chrome/Perfetto trace of the run to (``cgc.runtime.trace``);
        ``torch_profile``: a directory for one torch profiler trace per actor; ``nvtx``:
        NVTX ranges around every op (``cgc.runtime.profiling``); ``wake_ahead``: how many
        hops ahead of the data sleeping actors are woken (-1 auto, 0 off; ``cgc.runtime.driver.wake``);
        ``max_frame_bytes``: the largest value a TCP channel carries (default 4 GiB);
        ``dashboard``: start Ray's dashboard with the local Ray cgc starts (default off);
        ``cuda_graphs``: False runs the plan's captured calls eagerly (default: replay them
        as CUDA graphs where the actors have CUDA; ``graph.cuda_graph_stats()``).
        ``ray_events``: keep Ray Compiled Graph's per-task profiling records on each actor
        (``cgc.runtime.actor.ray_events``; the Ray drop-in's ``RAY_CGRAPH_ENABLE_PROFILING``).

        Example::

            with plan.start(get_timeout=5) as graph:
                ref = graph.execute(1)
                print(ref.get())

        Raises:
            UntrustedPlanError: the plan's trust decision does not allow it to run (checked
                before any actor is created or any code from the plan runs).
            ConfigError: an override is unknown or out of range.
            cgc.plan_schema.verify.VerifyError: the plan is malformed or its programs can deadlock.
            PlacementError: some actors cannot be placed on the cluster (named).
            SetupError: actors, channels or warm-up failed.
        """
        # Every keyword above is a ``RunConfig`` field (a test keeps the two the same), so
        # they are passed on as they are; ``RunConfig.from_plan`` checks each.
        options = {k: v for k, v in locals().items() if k not in ("self", "address")}
        from cgc.runtime.driver.start import start_graph
        from cgc.runtime.driver.trust_gate import require_trusted

        require_trusted(self)
        for path in ("trace", "torch_profile"):
            if options[path] is not None:
                options[path] = os.fspath(options[path])
        return start_graph(self, address, **options)


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
    from cgc.plan_schema.planfile import open_plan, open_plan_head
    from cgc.plan_schema.trust import decide, header_refusal, untrusted_error

    # A large plan its envelope already refuses is refused before its graph is parsed; an
    # unsigned one before its payload is even read (no signature to check it against).
    head = open_plan_head(path)
    refused = header_refusal(head if not head.header.signature else open_plan(path, parse=False),
                             trust=trust)
    if refused is not None:
        raise refused
    pf = open_plan(path)
    decision = decide(pf, trust=trust)
    if not decision.allowed:
        raise untrusted_error(decision, pf.plan.name or pf.header.name, str(path))
    return Plan(pf.plan, trust=decision)
