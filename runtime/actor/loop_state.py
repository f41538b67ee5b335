"""What one actor loop holds: the options the driver sent it, and the state its parts share.

``LoopOptions`` travels in set-up round 1 (``cgc.runtime.actor.entry.setup_probe``).
``LoopState`` declares the attributes that ``ActorLoop.__init__`` (``cgc.runtime.actor.executor``)
sets and that its set-up (``cgc.runtime.actor.loop_setup``) and op compilation
(``cgc.runtime.actor.op_compile``) read, so each part type-checks on its own.

Example: ``LoopOptions(prefix="cgc-1a2b-", spin_us=50.0)``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import MAX_FRAME_BYTES

__all__ = ["LoopOptions", "LoopState"]


@dataclass(frozen=True)
class LoopOptions:
    """What the driver decided at start that every actor's loop needs (sent in round 1).

    Attributes:
        prefix: the graph's unguessable name prefix (channel and communicator names).
        secret: the graph's key for TCP channel set-up proofs (travels only in Ray's own,
            authenticated set-up calls).
        spin_us: busy-wait before a channel wait sleeps.
        slot_bytes: initial slot size for channels whose plan entry names none.
        fake_hosts: test-only: this actor joins NCCL as a host of its own
            (``cgc.runtime.comm.testing.fake_hosts.apply_fake_hosts``).
        probe_gpu: report this actor's GPU in round 1 (False: no GPU transport possible).
        trace: record a time slice per op (``cgc.runtime.trace``).
        torch_profile: directory for a torch profiler trace of the loop ("" = off).
        nvtx: an NVTX range around every op (``cgc.runtime.profiling``).
        ray_events: keep Ray's per-task profiling records on the actor
            (``cgc.runtime.actor.ray_events``).
        wake_ahead: how many depths ahead of itself an actor rings when it starts work
            (0 = wake-ahead off); the depths are the plan's (``Program.wake_depth``).
        max_frame_bytes: the largest value this actor's TCP channels carry.
        cuda_graphs: replay the plan's captured ops (``Program.captured_ops``) as CUDA
            graphs where the actor has CUDA (False: run them eagerly).
    """

    prefix: str
    secret: bytes = b""
    spin_us: float = 0.0
    slot_bytes: int = 0
    fake_hosts: bool = False
    probe_gpu: bool = False
    trace: bool = False
    torch_profile: str = ""
    nvtx: bool = False
    ray_events: bool = False
    wake_ahead: int = 0
    max_frame_bytes: int = MAX_FRAME_BYTES
    cuda_graphs: bool = True


class LoopState:
    """The attributes of one actor's loop (``cgc.runtime.actor.executor.ActorLoop`` sets them)."""

    gid: str
    plan: pb.Plan
    actor: str
    obj: Any
    opts: LoopOptions
    prefix: str
    spin_us: float
    slot_bytes: int
    program: pb.Program
    writers: dict[int, Any]
    readers: dict[int, Any]
    comms: dict[int, Any]
    transports: dict[int, str]
    streams: Any
    _deferred: set[tuple[int, int]]
    exec: int
    pc: int
    in_prologue: bool
    crash: str | None
    stopping: bool
    exited: threading.Event
    thread: threading.Thread | None
    tabs: list[dict]
    bells: Any
    _methods: dict[int, Any]
    _direct: dict[int, set[int]] | None
