"""The one table of run-time defaults, ``RunConfig`` (the typed settings of one run), and
``LIMITS`` (the bounds every plan field must keep).

The compiler writes ``DEFAULTS`` into every plan's ``ExecConfig`` (pass ``config``); the
runtime reads a plan's ``ExecConfig`` and applies the user's ``start()`` / ``cgc run``
overrides through ``RunConfig.from_plan``. Nothing else holds a default for these settings,
so the compiler, the CLI and the runtime cannot disagree.

Timeouts are seconds; in ``RunConfig`` ``None`` means "no limit". In an ``ExecConfig`` a
field left at 0 (a hand-built plan) takes the default from this table.

``LIMITS`` bounds what a plan may ask for (capacity, ring sizes, counts); the structure
check (``cgc.plan_schema.verify.check_structure``) rejects a plan beyond them with a
``PlanLimitError`` naming the field and the limit, before anything is allocated or simulated. A user with a
real reason passes ``limits=dataclasses.replace(LIMITS, capacity=4096)`` to ``verify_plan``.

Example:
    >>> from cgc.plan_schema import plan_pb2 as pb
    >>> cfg = RunConfig.from_plan(pb.ExecConfig(capacity=3), get_timeout=5)
    >>> cfg.capacity, cfg.get_timeout, cfg.submit_timeout
    (3, 5.0, 10.0)
    >>> RunConfig.from_plan(pb.ExecConfig(capacity=3), get_timeout=0).get_timeout is None
    True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import ConfigError

__all__ = [
    "DEFAULTS",
    "RunConfig",
    "AT_CAPACITY",
    "COMMUNICATORS",
    "HOST_TRANSPORTS",
    "Limits",
    "LIMITS",
    "MAX_BUFFERED_BYTES",
    "MIN_SLOT_BYTES",
    "ring_slot_bytes",
]

# ExecConfig field -> default. Why these values: a submission waits only for room (10 s is
# long); LLM steps can take many seconds (60 s get); NCCL communicator set-up can take tens of
# seconds on big clusters (120 s); a 50 us spin hides the futex wake-up on the hot path
# without burning an idle core; 1 MiB slots hold typical activations inline.
DEFAULTS: dict[str, float | int] = {
    "submit_timeout_s": 10.0,
    "get_timeout_s": 60.0,
    "teardown_timeout_s": 10.0,
    "setup_timeout_s": 120.0,
    "spin_us": 50,
    "default_slot_bytes": 1 << 20,
    "max_buffered_results": 1000,
}

# Results buffered for refs not fetched yet hold their shared-memory blocks: 2 GiB of them.
MAX_BUFFERED_BYTES = 2 << 30

# The smallest inline payload of a ring slot, whatever a plan or a run asks (see below).
MIN_SLOT_BYTES = 256


def ring_slot_bytes(*sizes: int) -> int:
    """The inline payload bytes of one ring slot: the one rule for "0 means the default".

    ``sizes`` go from the most specific to the least: a channel's own ``Channel.slot_bytes``,
    then the run's default (``RunConfig.slot_bytes``: ``start(slot_bytes=...)``, else the
    plan's ``ExecConfig.default_slot_bytes``). The first that is not 0 counts; when all are
    0 (or none is given), ``DEFAULTS["default_slot_bytes"]`` (1 MiB). The result is never
    below ``MIN_SLOT_BYTES`` (256): the ring refuses slots under 64 bytes, and the warm-up
    ``PING`` (53 bytes pickled) and other small values must stay inline; a smaller slot
    would send each of them through a data block from the pool, a shared-memory
    allocation per write.

    The runtime sizes every ring with it, the structure check and the compiler's ring check
    add it up for ``Limits.ring_bytes``, and ``RunConfig`` resolves the run's default with
    it, so they all agree on what a plan reserves.

    Example:
        >>> ring_slot_bytes(4096, 8192), ring_slot_bytes(0, 8192), ring_slot_bytes(0, 0)
        (4096, 8192, 1048576)
        >>> ring_slot_bytes(64), ring_slot_bytes()
        (256, 1048576)

    Raises:
        ValueError: a negative size (plans hold unsigned ones; ``RunConfig.from_plan``
            refuses a negative override with a ``ConfigError`` first).
    """
    if any(n < 0 for n in sizes):
        raise ValueError(f"a slot size cannot be negative: {sizes}")
    chosen = next((n for n in sizes if n), int(DEFAULTS["default_slot_bytes"]))
    return max(int(chosen), MIN_SLOT_BYTES)

AT_CAPACITY = {"wait": pb.AT_CAPACITY_WAIT, "raise": pb.AT_CAPACITY_RAISE}

_GIB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Upper bounds on plan fields; a plan beyond one is rejected before it runs.

    Why bounds at all: a plan file is input from strangers, and a few bytes can ask for
    anything (``capacity = 2**32 - 1``, ``num_returns = 10**9``, terabytes of rings). Each
    bound is far above what the compiler writes for real graphs and far below what would
    exhaust a machine. Counts bound the verifier's and the runtime's work per plan byte.

    Attributes:
        capacity: ``ExecConfig.capacity`` (the compiler's own choice is at most 8; Ray's
            default ``_max_inflight_executions`` is 10).
        slots: ``Channel.slots`` of one host channel.
        slot_bytes: ``Channel.slot_bytes`` and ``ExecConfig.default_slot_bytes`` (inline
            bytes per slot; larger values travel in data blocks anyway).
        ring_bytes: the sum over host channels of ``slots * slot_bytes`` (0 bytes: the
            config's default), i.e. the shared memory the rings reserve.
        num_returns: ``Node.num_returns`` of one call.
        actors, nodes, channels, communicators: lengths of those plan lists.
        ops: ops in all programs together (prologues included).
        communicator_size: members of one communicator.
        buffered_results: ``ExecConfig.max_buffered_results``.
        spin_us: ``ExecConfig.spin_us`` (a busy-wait of one second is already absurd).
        executions: executions the verifier may be asked to step.
        verify_steps: op steps the simulator may take (executions x ops): a plan whose
            deadlock check needs more is refused, unless 4 executions' worth covers it
            (every plan without prefetch ops, or with them at one place per loop, is
            always checked; ``cgc.plan_schema.verify.simulate`` says why few executions suffice).
        keyword_fields, positional: ``Graph.keyword_fields`` and ``Graph.num_positional``
            (the arguments of one execution).
        collectives, modules, edges: lengths of ``Graph.collectives``, ``Graph.modules``
            and ``Lowered.edges``.
        outputs: the OUTPUT node's arguments (and ``Lowered.output_channels``).
        arguments: arguments of one call or constructor (``args`` plus ``kwargs``).
        resources: custom resources of one actor (``ActorOptions.resources``).
        resource_amount: ``num_cpus``, ``num_gpus`` and each custom resource of one actor.
        memory_bytes: ``ActorOptions.memory`` of one actor.
        max_concurrency: ``ActorOptions.max_concurrency``.
        costs: entries of ``ScheduleInfo.costs`` (informational).
        value_items: items (list and tuple items, dict entries, all levels) of one
            constant, constructor argument or example input.
        value_depth: how deep lists, tuples and dicts nest in one value (protobuf itself
            refuses to read plans nested much deeper, about 48 levels).
        bigint_digits: decimal digits of one ``Value.bigint_value`` (Python's own limit for
            turning a string into an int, ``sys.get_int_max_str_digits()``, is 4300).
        tensor_dims: dimensions of one tensor value or ``TensorSpec``.
        tensor_bytes: bytes one declared ``TensorSpec`` (a static edge's tensor) stands for.
        weight_params: parameters of one weight sync (``WeightSync.params``), and members
            of one of its buckets (format 1.7).
        file_bytes: the size of a plan file, checked before it is read (protobuf cannot
            parse a message of 2 GiB or more; the compiler's plans are kilobytes to a few
            megabytes, with embedded sources).
    """

    capacity: int = 1024
    slots: int = 1024
    slot_bytes: int = _GIB
    ring_bytes: int = 32 * _GIB
    num_returns: int = 4096
    actors: int = 4096
    nodes: int = 1_000_000
    channels: int = 1_000_000
    communicators: int = 4096
    ops: int = 4_000_000
    communicator_size: int = 4096
    buffered_results: int = 1_000_000
    spin_us: int = 1_000_000
    executions: int = 4096
    verify_steps: int = 2_000_000
    keyword_fields: int = 4096
    positional: int = 4096
    collectives: int = 500_000
    modules: int = 1024
    edges: int = 4_000_000
    outputs: int = 1_000_000
    arguments: int = 65_536
    resources: int = 256
    resource_amount: float = 65_536.0
    memory_bytes: int = 1 << 50
    max_concurrency: int = 100_000
    costs: int = 1_000_000
    value_items: int = 1_000_000
    value_depth: int = 32
    bigint_digits: int = 4300
    tensor_dims: int = 32
    tensor_bytes: int = 1 << 40
    weight_params: int = 1_000_000
    file_bytes: int = _GIB


# The limits every plan is checked against unless the caller passes others.
LIMITS = Limits()
COMMUNICATORS = ("auto", "cpu", "nccl")
HOST_TRANSPORTS = ("auto", "shm", "tcp")


def _limit(v: float | None) -> float | None:
    """0, negative or infinite means "no limit" (None)."""
    if v is None or v <= 0 or math.isinf(v):
        return None
    return float(v)


def _plan_value(config: pb.ExecConfig, field: str) -> Any:
    v = getattr(config, field)
    return v if v else DEFAULTS[field]


# The largest value one TCP frame carries unless the run says otherwise (4 GiB), and the
# smallest limit a run may set (a header and a small value must always fit).
MAX_FRAME_BYTES = 1 << 32
MIN_FRAME_BYTES = 64 * 1024


@dataclass(frozen=True)
class RunConfig:
    """Effective settings of one run: the plan's ``ExecConfig`` plus the user's overrides.

    Attributes:
        capacity: executions in flight before ``execute()`` waits (or raises).
        at_capacity: ``"wait"`` (up to ``submit_timeout``) or ``"raise"`` (Ray's behaviour).
        submit_timeout, get_timeout: seconds, ``None`` = no limit.
        teardown_timeout, setup_timeout: seconds (always finite).
        spin_us: busy-wait before a channel wait sleeps.
        slot_bytes: initial slot size of channels whose plan entry names none (an
            override, else the plan's ``default_slot_bytes``, resolved by
            ``ring_slot_bytes``; an override of 0 means the plan's).
        max_buffered_results: results the driver holds for refs not fetched yet.
        max_buffered_bytes: payload bytes of those results (large values are read
            zero-copy, so this bounds shared memory held by unfetched results).
        communicator: ``"auto"`` (NCCL between GPUs, CUDA IPC on a shared GPU, else CPU),
            ``"cpu"`` (the CPU communicator everywhere) or ``"nccl"`` (fail without GPUs).
        host_transport: ``"auto"`` (shared memory on one node, TCP across nodes), ``"shm"``
            or ``"tcp"`` (TCP everywhere, to exercise the cross-node path on one machine).
        trace: a file to write a Chrome/Perfetto trace of the run to at teardown ("" = off).
        torch_profile: a directory for one torch profiler trace per actor ("" = off).
        nvtx: NVTX ranges around every op, for Nsight Systems.
        wake_ahead: how many hops ahead of the data waiting actors are woken
            (``cgc.runtime.driver.wake``); -1 = auto (half the cores, off below 4), 0 = off.
        max_frame_bytes: the largest value (pickle plus buffers) a TCP channel carries;
            a larger frame is refused before anything is allocated or sent (the
            execution gets the error as its value). At least 64 KiB.
        dashboard: when cgc starts the local Ray itself, start Ray's dashboard too (off
            by default: it costs start-up time and a plan run does not need it); ignored
            when joining a cluster or reusing a Ray this process already started.
        cuda_graphs: replay the plan's captured calls (``Program.captured_ops``) as CUDA
            graphs where the actors have CUDA (False: every call eager).
        ray_events: every actor keeps Ray Compiled Graph's per-task profiling records in
            its ``__ray_cgraph_events`` attribute (``cgc.runtime.actor.ray_events``; the drop-in
            turns it on under ``RAY_CGRAPH_ENABLE_PROFILING``).
    """

    # Defaults come from the one table above (a RunConfig built by hand agrees with a plan).
    capacity: int
    at_capacity: str = "wait"
    submit_timeout: float | None = float(DEFAULTS["submit_timeout_s"])
    get_timeout: float | None = float(DEFAULTS["get_timeout_s"])
    teardown_timeout: float = float(DEFAULTS["teardown_timeout_s"])
    setup_timeout: float = float(DEFAULTS["setup_timeout_s"])
    spin_us: float = float(DEFAULTS["spin_us"])
    slot_bytes: int = int(DEFAULTS["default_slot_bytes"])
    max_buffered_results: int = int(DEFAULTS["max_buffered_results"])
    max_buffered_bytes: int = MAX_BUFFERED_BYTES
    communicator: str = "auto"
    host_transport: str = "auto"
    trace: str = ""
    torch_profile: str = ""
    nvtx: bool = False
    wake_ahead: int = -1
    max_frame_bytes: int = MAX_FRAME_BYTES
    dashboard: bool = False
    cuda_graphs: bool = True
    ray_events: bool = False

    @classmethod
    def from_plan(cls, config: pb.ExecConfig, **overrides: Any) -> RunConfig:
        """The plan's settings with ``overrides`` (``None`` values are ignored) applied.

        ``capacity`` may lower the plan's capacity, never raise it: the plan's driver
        channels hold exactly ``config.capacity`` executions.

        Example: ``RunConfig.from_plan(plan.config, get_timeout=5, communicator="cpu")``.

        Raises:
            ConfigError: an unknown setting, a value out of range, or a capacity above the
                plan's.
        """
        over = {k: v for k, v in overrides.items() if v is not None}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(over) - names)
        if unknown:
            raise ConfigError(f"unknown run setting(s): {', '.join(unknown)}")
        plan_cap = int(config.capacity)
        if plan_cap < 1:
            raise ConfigError("the plan's capacity is 0: it was not lowered by the compiler")
        cap = int(over.get("capacity", plan_cap))
        if not 1 <= cap <= plan_cap:
            raise ConfigError(
                f"capacity {cap} is outside 1..{plan_cap} (the plan's driver channels hold "
                f"{plan_cap} executions; compile with a larger capacity to raise it)"
            )
        at_cap = over.get("at_capacity")
        if at_cap is None:
            at_cap = "raise" if config.at_capacity == pb.AT_CAPACITY_RAISE else "wait"
        if at_cap not in AT_CAPACITY:
            raise ConfigError(f"at_capacity must be 'wait' or 'raise', not {at_cap!r}")
        comm = over.get("communicator", "auto")
        if comm not in COMMUNICATORS:
            raise ConfigError(f"communicator must be one of {COMMUNICATORS}, not {comm!r}")
        host = over.get("host_transport", "auto")
        if host not in HOST_TRANSPORTS:
            raise ConfigError(f"host_transport must be one of {HOST_TRANSPORTS}, not {host!r}")

        def timeout(name: str, field: str) -> float | None:
            if name in over:
                return _limit(float(over[name]))
            return _limit(float(_plan_value(config, field)))

        # 0 is a real choice for spin_us (sleep at once), so the plan's value stands as is.
        spin = float(over.get("spin_us", config.spin_us))
        buffered = int(
            over.get("max_buffered_results", _plan_value(config, "max_buffered_results"))
        )
        if spin < 0 or buffered < 1:
            raise ConfigError("spin_us must be >= 0 and max_buffered_results >= 1")
        slot = int(over.get("slot_bytes", 0))
        if not 0 <= slot <= LIMITS.slot_bytes:
            raise ConfigError(f"slot_bytes must be within 0..{LIMITS.slot_bytes:,} "
                              f"(Limits.slot_bytes; 0: the plan's), not {slot:,}")
        frame = int(over.get("max_frame_bytes", MAX_FRAME_BYTES))
        if frame < MIN_FRAME_BYTES:
            raise ConfigError(f"max_frame_bytes must be >= {MIN_FRAME_BYTES} (64 KiB), "
                              f"not {frame}")
        return cls(
            capacity=cap,
            at_capacity=at_cap,
            submit_timeout=timeout("submit_timeout", "submit_timeout_s"),
            get_timeout=timeout("get_timeout", "get_timeout_s"),
            teardown_timeout=timeout("teardown_timeout", "teardown_timeout_s") or 3600.0,
            setup_timeout=timeout("setup_timeout", "setup_timeout_s") or 3600.0,
            spin_us=spin,
            slot_bytes=ring_slot_bytes(slot, config.default_slot_bytes),
            max_buffered_results=buffered,
            max_buffered_bytes=int(over.get("max_buffered_bytes", MAX_BUFFERED_BYTES)),
            communicator=comm,
            host_transport=host,
            trace=str(over.get("trace", "")),
            torch_profile=str(over.get("torch_profile", "")),
            nvtx=bool(over.get("nvtx", False)),
            wake_ahead=int(over.get("wake_ahead", -1)),
            max_frame_bytes=frame,
            dashboard=bool(over.get("dashboard", False)),
            cuda_graphs=bool(over.get("cuda_graphs", True)),
            ray_events=bool(over.get("ray_events", False)),
        )
