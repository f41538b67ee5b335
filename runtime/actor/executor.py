"""The per-actor executor: replays one actor's program in a loop thread inside the actor.

The driver drives set-up through ``actor.__ray_call__`` with the functions in
``cgc.runtime.actor.entry`` (each batched over all actors, one round at a time):

1. ``setup_probe``   - build the ``ActorLoop`` (resolve methods, decode constants); report
   node and pid.
2. ``setup_writers`` - create the writing end of every host channel this actor writes.
3. ``setup_start``   - attach readers, join communicators, warm every edge once (a PING
   per host channel, the execution-0 send/recv pairs per communicator), start the loop.
4. ``wait_loop``     - (in Ray's ``_ray_system`` concurrency group) returns when the loop
   exits, or fails when the actor dies: the driver's monitor waits on it. That group has
   one thread, so with several graphs on one actor a waiter also returns ("running") when
   another loop of the actor exits, letting the queued waiters have their turn.
5. ``stop_loop`` / ``where_blocked`` - teardown (waits for this graph's loop only) and hang
   reports.

Program semantics (docs/architecture.md): the prologue once (execution 0), then ``ops``
once per execution; an op with ``exec_offset = 1`` serves the next execution, so values
live in two tables (``tabs[0]`` for execution ``e``, ``tabs[1]`` for ``e + 1``) that rotate
after each iteration. A failing user method becomes an ``ErrorValue`` stored as every
output; a task with an ``ErrorValue`` input skips its call and forwards it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.actor.loop_setup import LoopSetup
from cgc.runtime.actor.loop_state import LoopOptions
from cgc.runtime.actor.loops import EXITS, LOOPS, LOOPS_CHANGED, LOOPS_LOCK, MAX_EXITS, TRACES
from cgc.runtime.actor.op_compile import OpCompiler
from cgc.runtime.actor.op_text import op_text
from cgc.runtime.actor.weight_sync import sync_methods
from cgc.runtime.channels.ends import close_quietly, detach_quietly, poison_quietly
from cgc.runtime.channels.errors import ChannelClosedError
from cgc.runtime.errors import SetupError

__all__ = ["ActorLoop"]


class ActorLoop(LoopSetup, OpCompiler):
    """One actor's part of one graph: endpoints, compiled ops, and the loop thread."""

    def __init__(self, gid: str, plan: pb.Plan, actor: str, obj: Any,
                 opts: LoopOptions) -> None:
        self.gid, self.plan, self.actor, self.obj = gid, plan, actor, obj
        self.opts = opts
        self.prefix = opts.prefix
        self.spin_us = opts.spin_us
        self.slot_bytes = opts.slot_bytes
        idx = [a.name for a in plan.graph.actors].index(actor)
        self.program = plan.lowered.programs[idx]
        self.writers: dict[int, Any] = {}
        self.readers: dict[int, Any] = {}
        self.comms: dict[int, Any] = {}
        # communicator id -> "nccl" | "cuda_ipc" | "host_staging" | "cpu", bound by the
        # driver from where the members landed (cgc.runtime.comm.binding; set in round 2)
        self.transports: dict[int, str] = {}
        self.streams: Any = None  # the actor's CUDA streams once a device communicator opens
        self._deferred: set[tuple[int, int]] = set()
        self.exec = 0
        self.pc = -1
        self.in_prologue = True
        self.crash: str | None = None
        self.stopping = False
        self.exited = threading.Event()
        self.thread: threading.Thread | None = None
        self.tabs: list[dict] = [{}, {}]
        self.bells: Any = None  # cgc.runtime.channels.bell.Bells when wake-ahead is on
        self._methods: dict[int, Any] = {}
        self._direct: dict[int, set[int]] | None = None
        # Weight-sync ends: checked against the live module here, in set-up round 1.
        syncs = sync_methods(plan, actor, obj) if plan.graph.weight_syncs else {}
        for op in list(self.program.prologue) + list(self.program.ops):
            if op.kind == pb.COMPUTE and op.task not in self._methods:
                node = plan.graph.nodes[op.task]
                fn = syncs.get(op.task) or getattr(obj, node.method, None)
                if not callable(fn):
                    raise SetupError(
                        f"actor {actor} ({type(obj).__qualname__}) has no method "
                        f"{node.method!r} (task {node.name})"
                    )
                self._methods[op.task] = fn
        self.captured = self._wrap_captured(actor) if opts.cuda_graphs else {}

    def _wrap_captured(self, actor: str) -> dict[str, Any]:
        """Replace the methods of the plan's captured ops by their CUDA-graph replayers
        (``cgc.runtime.gpu.cuda_graphs``); without CUDA here they stay eager."""
        if not self.program.captured_ops or "torch" not in sys.modules:
            return {}
        import torch

        if not torch.cuda.is_available():
            return {}
        from cgc.runtime.gpu.cuda_graphs import CapturedCall

        out: dict[str, Any] = {}
        for i in self.program.captured_ops:
            task = self.program.ops[i].task
            name = self.plan.graph.nodes[task].name
            call = CapturedCall(self._methods[task], name)
            self._methods[task] = out[name] = call
        return out

    def graph_stats(self) -> dict[str, Any]:
        """Per captured call: captures, replays, eager runs and why (empty: none)."""
        return {name: c.stats.as_dict() for name, c in self.captured.items()}

    # ------------------------------------------------------------------ loop
    def start(self) -> None:
        self._deferred = self._find_deferred()
        prologue = self._compile(self.program.prologue, True)
        ops = self._ring_ahead(self._compile(self.program.ops, False))
        if self.opts.trace:
            from cgc.runtime.trace import Recorder, traced

            pro_rec, ops_rec = Recorder(), Recorder()
            with LOOPS_LOCK:
                TRACES[self.gid] = (pro_rec, ops_rec)
            offs = [o.exec_offset for o in self.program.ops]

            def exec_of(off: int) -> Callable[[], int]:
                return lambda: self.exec + off

            prologue = [traced(op, i, exec_of(0), pro_rec)  # the prologue runs as execution 0
                        for i, op in enumerate(prologue)]
            ops = [traced(op, i, exec_of(offs[i]), ops_rec) for i, op in enumerate(ops)]
        if self.opts.ray_events:
            from cgc.runtime.actor.ray_events import record_ray_events

            ops = record_ray_events(ops, self.program, self.plan, self.obj)
        if self.opts.nvtx:
            from cgc.runtime.profiling import nvtx_wrap, require_nvtx

            nv = require_nvtx()
            prologue = [nvtx_wrap(op, op_text(o, self.plan), nv)
                        for op, o in zip(prologue, self.program.prologue, strict=True)]
            ops = [nvtx_wrap(op, op_text(o, self.plan), nv)
                   for op, o in zip(ops, self.program.ops, strict=True)]
        prefetch = any(o.exec_offset for o in self.program.ops)
        self.thread = threading.Thread(target=self._run, args=(prologue, ops, prefetch),
                                       name=f"cgc-loop-{self.actor}-{self.gid}", daemon=True)
        self.thread.start()

    def _run(self, prologue: list[Any], ops: list[Any], prefetch: bool) -> None:
        tabs = self.tabs
        profiler: Any = contextlib.nullcontext()
        if self.opts.torch_profile:
            from cgc.runtime.profiling import torch_profile

            profiler = torch_profile(self.opts.torch_profile, self.plan.name, self.actor)
        try:
            with profiler:
                self._replay(prologue, ops, prefetch)
        except ChannelClosedError:
            pass  # teardown or a poisoned peer: the normal way out
        except BaseException:  # noqa: BLE001 - an executor bug: report it, wake the others
            import traceback

            self.crash = traceback.format_exc()
            self.poison()
        finally:
            tabs[0].clear()
            tabs[1].clear()
            self.close()
            self.exited.set()
            with LOOPS_LOCK:
                LOOPS.pop(self.gid, None)
                EXITS[self.gid] = self.crash
                while len(EXITS) > MAX_EXITS:
                    EXITS.pop(next(iter(EXITS)))
                LOOPS_CHANGED.notify_all()

    def _replay(self, prologue: list[Any], ops: list[Any], prefetch: bool) -> None:
        """The prologue once, then the ops once per execution until a channel closes."""
        tabs = self.tabs
        for self.pc, op in enumerate(prologue):
            op()
        self.in_prologue = False
        while True:
            for self.pc, op in enumerate(ops):
                op()
            self.exec += 1
            if prefetch:
                tabs[0] = tabs[1]
                tabs[1] = {}
            else:
                tabs[0].clear()

    def poison(self) -> None:
        """Wake every blocked op of this loop (they raise ChannelClosedError)."""
        poison_quietly(list(self.writers.values()) + list(self.readers.values()))
        for comm in list(self.comms.values()):
            try:  # abort ends a device wait at once (NCCL has no timeouts of its own)
                comm.abort()
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        """Close writers (unlinks their segments), detach readers, destroy communicators."""
        close_quietly(self.writers.values())
        detach_quietly(self.readers.values())
        for comm in self.comms.values():
            try:
                comm.destroy()
            except Exception:  # noqa: BLE001
                pass
        self.writers, self.readers, self.comms = {}, {}, {}
        for call in self.captured.values():  # graphs and their memory pools
            call.reset()
        if self.bells is not None:
            self.bells.close()
            self.bells = None

    def where(self) -> dict[str, Any]:
        """Where the loop is: ``{"actor", "execution", "op", "token", "waiting"}``."""
        ops = self.program.prologue if self.in_prologue else self.program.ops
        row: dict[str, Any] = {"actor": self.actor, "execution": self.exec, "op": "",
                               "token": "", "waiting": ""}
        if self.exited.is_set():
            return {**row, "waiting": "loop exited"}
        if not 0 <= self.pc < len(ops):
            return {**row, "waiting": "starting"}
        op = ops[self.pc]
        low = self.plan.lowered
        row["execution"] = self.exec + (op.exec_offset if not self.in_prologue else 0)
        row["op"] = f"{'prologue ' if self.in_prologue else ''}{self.pc}"
        row["token"] = op_text(op, self.plan)
        if op.kind == pb.READ:
            doing = f"a value on channel c{op.channel} from {low.channels[op.channel - 1].writer}"
        elif op.kind == pb.WRITE:
            readers = ", ".join(low.channels[op.channel - 1].readers)
            doing = f"room on channel c{op.channel} (readers {readers})"
        elif op.kind in (pb.SEND, pb.RECV):
            side = "to" if op.kind == pb.SEND else "from"
            doing = (f"rendezvous {side} {op.peer} on communicator {op.communicator} "
                     f"(c{op.channel}, seq {op.seq})")
        elif op.kind == pb.COMPUTE:
            doing = f"the method {self.plan.graph.nodes[op.task].method} to return"
        else:
            doing = (f"the other members of the collective on communicator "
                     f"{op.communicator} (seq {op.seq})")
        row["waiting"] = doing
        return row
