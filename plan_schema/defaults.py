"""The one table of run-time defaults, and ``RunConfig``: the typed settings of one run.

The compiler writes ``DEFAULTS`` into every plan's ``ExecConfig`` (pass ``config``); the
runtime reads a plan's ``ExecConfig`` and applies the user's ``start()`` / ``cgc run``
overrides through ``RunConfig.from_plan``. Nothing else holds a default for these settings,
so the compiler, the CLI and the runtime cannot disagree.

Timeouts are seconds; in ``RunConfig`` ``None`` means "no limit". In an ``ExecConfig`` a
field left at 0 (a hand-built plan) takes the default from this table.

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

__all__ = ["DEFAULTS", "RunConfig", "AT_CAPACITY", "COMMUNICATORS", "HOST_TRANSPORTS"]

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

AT_CAPACITY = {"wait": pb.AT_CAPACITY_WAIT, "raise": pb.AT_CAPACITY_RAISE}
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


@dataclass(frozen=True)
class RunConfig:
    """Effective settings of one run: the plan's ``ExecConfig`` plus the user's overrides.

    Attributes:
        capacity: executions in flight before ``execute()`` waits (or raises).
        at_capacity: ``"wait"`` (up to ``submit_timeout``) or ``"raise"`` (Ray's behaviour).
        submit_timeout, get_timeout: seconds, ``None`` = no limit.
        teardown_timeout, setup_timeout: seconds (always finite).
        spin_us: busy-wait before a channel wait sleeps.
        slot_bytes: initial slot size of channels whose plan entry names none.
        max_buffered_results: results the driver holds for refs not fetched yet.
        communicator: ``"auto"`` (NCCL between GPUs, CUDA IPC on a shared GPU, else CPU),
            ``"cpu"`` (the CPU communicator everywhere) or ``"nccl"`` (fail without GPUs).
        host_transport: ``"auto"`` (shared memory on one node, TCP across nodes), ``"shm"``
            or ``"tcp"`` (TCP everywhere, to exercise the cross-node path on one machine).
        trace: a file to write a Chrome/Perfetto trace of the run to at teardown ("" = off).
        torch_profile: a directory for one torch profiler trace per actor ("" = off).
        nvtx: NVTX ranges around every op, for Nsight Systems.
    """

    capacity: int
    at_capacity: str = "wait"
    submit_timeout: float | None = 10.0
    get_timeout: float | None = 60.0
    teardown_timeout: float = 10.0
    setup_timeout: float = 120.0
    spin_us: float = 50.0
    slot_bytes: int = 1 << 20
    max_buffered_results: int = 1000
    communicator: str = "auto"
    host_transport: str = "auto"
    trace: str = ""
    torch_profile: str = ""
    nvtx: bool = False

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
                f"{plan_cap} executions; compile with a larger capacity to raise it)")
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
        buffered = int(over.get("max_buffered_results",
                                _plan_value(config, "max_buffered_results")))
        if spin < 0 or buffered < 1:
            raise ConfigError("spin_us must be >= 0 and max_buffered_results >= 1")
        return cls(
            capacity=cap,
            at_capacity=at_cap,
            submit_timeout=timeout("submit_timeout", "submit_timeout_s"),
            get_timeout=timeout("get_timeout", "get_timeout_s"),
            teardown_timeout=timeout("teardown_timeout", "teardown_timeout_s") or 3600.0,
            setup_timeout=timeout("setup_timeout", "setup_timeout_s") or 3600.0,
            spin_us=spin,
            slot_bytes=int(over.get("slot_bytes", _plan_value(config, "default_slot_bytes"))),
            max_buffered_results=buffered,
            communicator=comm,
            host_transport=host,
            trace=str(over.get("trace", "")),
            torch_profile=str(over.get("torch_profile", "")),
            nvtx=bool(over.get("nvtx", False)),
        )
