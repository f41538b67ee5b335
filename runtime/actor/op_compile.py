"""Compiling an actor's program into closures, and the CUDA stream waits between its ops.

Each ``pb.Op`` becomes one argument-less function that reads and writes the loop's value
tables (``tabs[0]`` for execution ``e``, ``tabs[1]`` for ``e + 1``); ``ActorLoop``
(``cgc.runtime.actor.executor``) inherits this and replays the closures.

Example: ``ops = loop._compile(loop.program.ops, False)``; then ``for op in ops: op()``.
"""

from __future__ import annotations

import reprlib
import sys
from collections.abc import Callable
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.collective import ReduceOp
from cgc.plan_schema.values import decode_value
from cgc.runtime.actor.loop_state import LoopState
from cgc.runtime.channels.errors import ChannelClosedError, ChannelTimeoutError, ErrorValue
from cgc.runtime.comm.collective import concat_rows
from cgc.runtime.devices import DeviceMoveError, DeviceReader, move_to
from cgc.runtime.errors import DirectReturnError, SetupError, mro_names
from cgc.runtime.messages import input_attr

__all__ = ["OpCompiler"]


def _is_tensor(v: Any) -> bool:
    """One tensor as the channels carry it out of band: a torch tensor (any device) or a
    numpy array (``cgc.runtime.channels.serial``)."""
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    return ((np is not None and isinstance(v, np.ndarray))
            or (torch is not None and isinstance(v, torch.Tensor)))


def _what(v: Any) -> str:
    """``"a tuple of 2 values"``, ``"a dict"``: what a value is, for messages."""
    if isinstance(v, (tuple, list)):
        return f"a {type(v).__name__} of {len(v)} values"
    return "None" if v is None else f"a {type(v).__name__}"


def _no_settle(tab: dict, before: Any) -> None:
    """After a receive that needs no stream bookkeeping."""


def _static_kwargs(ch: pb.Channel) -> dict[str, Any]:
    """``shape``/``dtype`` for a device send/recv on a static edge, else nothing."""
    if ch.static_shape and ch.spec.dtype and len(ch.spec.shape):
        return {"shape": tuple(ch.spec.shape), "dtype": ch.spec.dtype}
    return {}


class OpCompiler(LoopState):
    """Op compilation of one actor's program (mixed into ``ActorLoop``)."""

    # ------------------------------------------------------------------ compile
    def _compile(self, ops: Any, prologue: bool) -> list[Any]:
        return [self._compile_op(op, 0 if prologue else op.exec_offset) for op in ops]

    def _compile_op(self, op: pb.Op, off: int) -> Any:
        tabs, low, graph = self.tabs, self.plan.lowered, self.plan.graph
        if op.kind == pb.READ:
            ch = low.channels[op.channel - 1]
            read, key = self.readers[ch.id].read, (ch.source.node, ch.source.output_index)
            derive = [((n, 0), graph.nodes[n].index,
                       graph.nodes[n].field if graph.nodes[n].key_kind == pb.FIELD else None)
                      for n in op.extract]
            reader, moves = self.actor, isinstance(self.readers[ch.id], DeviceReader)

            def read_or_error() -> Any:
                try:
                    return read()
                except DeviceMoveError as exc:  # consumed; the move failed (Ray: the task's)
                    return self._error(exc.__cause__ or exc, f"{reader} (reading)", off)

            if not moves:  # only a device move can fail after the value was read
                read_or_error = read

            if not derive:
                def do_read() -> None:
                    tabs[off][key] = read_or_error()
                return do_read

            def do_read_whole() -> None:
                tab = tabs[off]
                whole = tab[key] = read_or_error()
                if isinstance(whole, ErrorValue):
                    for akey, _, _ in derive:
                        tab[akey] = whole
                    return
                for akey, index, field in derive:
                    try:
                        tab[akey] = input_attr(whole, index, field)
                    except Exception as exc:  # noqa: BLE001 - a bad input is the caller's error
                        tab[akey] = self._error(exc, "<input>", off)
            return do_read_whole
        if op.kind == pb.WRITE:
            write, key = self.writers[op.channel].write, (op.task, op.output_index)
            method = graph.nodes[op.task].method or graph.nodes[op.task].name
            ready = self._waiter([key])
            # Readers that get host tensors (device="cpu") are sent host copies: one copy
            # here, and no reader (the driver, say) touches a GPU just to move the value
            # off it - on a GPU shared without MPS that costs every process a context switch.
            to_host = low.channels[op.channel - 1].device == pb.CPU

            def do_write() -> None:
                if ready is not None:  # serializing reads a received tensor on compute
                    ready(tabs[off])
                value = tabs[off][key]
                if to_host:
                    value = move_to(value, "cpu")
                try:
                    write(value)
                except (ChannelClosedError, ChannelTimeoutError):
                    raise
                except Exception as exc:  # noqa: BLE001 - unpicklable result: nothing was written
                    bad = TypeError(f"the result of {self.actor}.{method} cannot be sent "
                                    f"({type(value).__name__}): {exc}")
                    write(self._error(bad, method, off))
            return do_write
        if op.kind == pb.COMPUTE:
            return self._compile_compute(graph.nodes[op.task], off)
        if op.kind in (pb.SEND, pb.RECV):
            ch = low.channels[op.channel - 1]
            cdesc = low.communicators[op.communicator]
            comm, peer = self.comms[cdesc.id], list(cdesc.members).index(op.peer)
            # A declared shape/dtype lets a device receiver post its receive before the
            # header arrives (and the sender check the value against the declaration).
            static = (_static_kwargs(ch)
                      if self.transports[cdesc.id] != "cpu" else {})
            if op.kind == pb.SEND:
                send, key = comm.send, (op.task, op.output_index)

                def do_send() -> None:
                    send(tabs[off][key], peer, **static)
                return do_send
            recv, key = comm.recv, (ch.source.node, ch.source.output_index)
            settle = self._settler(comm, key, op)
            if settle is _no_settle:
                def do_recv() -> None:
                    tabs[off][key] = recv(peer, **static)
                return do_recv

            def do_recv_settled() -> None:
                tab = tabs[off]
                before = comm.last_event
                tab[key] = recv(peer, **static)
                settle(tab, before)
            return do_recv_settled
        if op.kind == pb.COLL:
            return self._compile_coll(graph.nodes[op.task], op.communicator, off)
        raise SetupError(f"{self.actor}: unknown op kind {op.kind} in its program")

    def _settler(self, comm: Any, key: tuple[int, int], op: pb.Op) -> Callable[[dict, Any], None]:
        """What runs after a device receive or collective stored ``key``.

        With deferred waits (``ActorStreams.eager_wait`` off) the received value's comm
        event is kept beside it in the table; the first compute-stream op that uses the
        value waits for it there (``_waiter``). An op the plan left on the compute stream
        makes the compute stream wait at once. Host communicators move nothing on a device.
        """
        streams = self.streams
        if (streams is None or streams.eager_wait
                or self.transports[op.communicator] == "cpu"):
            return _no_settle
        evkey = ("ev", *key)
        if key in self._deferred:
            def keep(tab: dict, before: Any) -> None:
                ev = comm.last_event
                if ev is not before:
                    tab[evkey] = ev
            return keep

        def wait_now(tab: dict, before: Any) -> None:
            ev = comm.last_event
            if ev is not before:
                streams.compute_after(ev)
        return wait_now

    def _find_deferred(self) -> set[tuple[int, int]]:
        """Values received on the comm stream whose compute-stream wait is left to their
        first user: outputs of RECV/COLL ops the plan put on ``COMM_STREAM`` when this
        actor's streams defer waits."""
        if self.streams is None or self.streams.eager_wait:
            return set()
        low, out = self.plan.lowered, set()
        for o in list(self.program.prologue) + list(self.program.ops):
            if o.stream != pb.COMM_STREAM or self.transports[o.communicator] == "cpu":
                continue
            if o.kind == pb.RECV:
                src = low.channels[o.channel - 1].source
                out.add((src.node, src.output_index))
            elif o.kind == pb.COLL:
                out.add((o.task, 0))
        return out

    def _waiter(self, keys: list[tuple[int, int]]) -> Callable[[dict], None] | None:
        """Before a compute-stream op that uses ``keys``: wait for the deferred receives
        among them (None when none is deferred; see ``_settler``)."""
        evkeys = [("ev", *k) for k in keys if k in self._deferred]
        if not evkeys:
            return None
        compute_after = self.streams.compute_after

        def wait(tab: dict) -> None:
            for ek in evkeys:
                ev = tab.pop(ek, None)
                if ev is not None:
                    compute_after(ev)
        return wait

    def _op_of_task(self, task: int) -> pb.Op:
        """This actor's COLL op of collective node ``task``."""
        for o in list(self.program.prologue) + list(self.program.ops):
            if o.kind == pb.COLL and o.task == task:
                return o
        raise SetupError(f"{self.actor}: no COLL op for task {task}")

    def _error(self, exc: BaseException, method: str, off: int) -> ErrorValue:
        tb = exc.__traceback__
        if tb is not None and tb.tb_next is not None:  # drop the executor's own frame
            exc = exc.with_traceback(tb.tb_next)
        return ErrorValue.from_exception(exc, actor=self.actor, method=method,
                                         exec_index=self.exec + off, mro=mro_names(exc))

    def _direct_outputs(self) -> dict[int, set[int]]:
        """task -> its outputs on a direct_return edge (one pass over the channels, made
        once: per task it would cost tasks x channels)."""
        if self._direct is None:
            self._direct = {}
            for ch in self.plan.lowered.channels:
                if ch.direct_return:
                    self._direct.setdefault(ch.source.node, set()).add(ch.source.output_index)
        return self._direct

    def _compile_compute(self, node: pb.Node, off: int) -> Any:
        tabs, fn, method, task = self.tabs, self._methods[node.id], node.method, node.id
        where = f"node %{node.id} ({node.name})"
        specs = [(True, (a.ref.node, a.ref.output_index)) if a.WhichOneof("kind") == "ref"
                 else (False, decode_value(a.constant, f"{where} args[{i}]"))
                 for i, a in enumerate(node.args)]
        kspecs = [(kw.name, kw.arg.WhichOneof("kind") == "ref",
                   (kw.arg.ref.node, kw.arg.ref.output_index)
                   if kw.arg.WhichOneof("kind") == "ref"
                   else decode_value(kw.arg.constant, f"{where} kwargs[{kw.name!r}]"))
                  for kw in node.kwargs]
        nret = node.num_returns or 1
        outs = [(task, i) for i in range(nret)]
        ev_type = ErrorValue
        # Outputs on an edge the plan declares direct_return: each must be one tensor.
        direct = sorted(self._direct_outputs().get(task, ()))
        ready = self._waiter([v for r, v in specs if r] + [v for _, r, v in kspecs if r])

        def do_compute() -> None:
            tab = tabs[off]
            if ready is not None:
                ready(tab)
            args = [tab[v] if r else v for r, v in specs]
            kwargs = {n: (tab[v] if r else v) for n, r, v in kspecs} if kspecs else {}
            err = None
            for v in args:
                if type(v) is ev_type:
                    err = v
                    break
            else:
                for v in kwargs.values():
                    if type(v) is ev_type:
                        err = v
                        break
            if err is None:
                try:
                    result = fn(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - app errors travel as values
                    err = self._error(exc, method, off)
            if err is not None:
                for k in outs:
                    tab[k] = err
            elif nret == 1:
                tab[outs[0]] = result
            elif isinstance(result, (tuple, list)) and len(result) == nret:
                for k, v in zip(outs, result, strict=True):
                    tab[k] = v
            else:
                got = f"{len(result)} values" if isinstance(result, (tuple, list)) else \
                    f"a {type(result).__name__}"
                bad = ValueError(f"{node.name} returned {got}, the plan expects {nret} "
                                 f"(num_returns={nret})")
                for k in outs:
                    tab[k] = self._error(bad, method, off)
            for i in direct:
                v = tab[outs[i]]
                if type(v) is not ev_type and not _is_tensor(v):
                    tab[outs[i]] = self._error(DirectReturnError(
                        f"{node.name} ({type(self.obj).__qualname__}.{method}) returned "
                        f"{_what(v)} (`{reprlib.repr(v)}`) as output {i}, but the plan "
                        "declares that edge "
                        "direct_return: exactly one tensor (a torch.Tensor or a numpy array), "
                        "never wrapped; return one tensor or drop _direct_return"), method, off)
        return do_compute

    def _compile_coll(self, node: pb.Node, communicator: int, off: int) -> Any:
        graph, low, tabs = self.plan.graph, self.plan.lowered, self.tabs
        coll = graph.collectives[node.collective]
        cdesc = low.communicators[communicator]  # the plan's choice (verified at start)
        comm = self.comms[cdesc.id]
        a = node.args[0]
        in_key, out_key = (a.ref.node, a.ref.output_index), (node.id, 0)
        red, kind = ReduceOp(coll.reduce_op), coll.kind
        coll_name = node.name.removeprefix(f"{self.actor}.")  # errors say "<actor>.<this>"
        # Every communicator runs the collective itself, with the one rule of
        # cgc.runtime.comm.collective; an upstream error on any member comes back as
        # every member's result (errors are agreed on before any device op).
        native = {pb.ALLREDUCE: lambda x: comm.allreduce(x, red),
                  pb.ALLGATHER: ((lambda x: concat_rows(comm.allgather(x))) if coll.concat
                                 else comm.allgather),
                  pb.REDUCESCATTER: lambda x: comm.reducescatter(x, red)}[kind]
        if self.transports[cdesc.id] != "cpu":
            settle = self._settler(comm, out_key, self._op_of_task(node.id))

            def run(x: Any) -> Any:
                before = comm.last_event
                out = native(x)
                settle(tabs[off], before)
                return out
        else:
            run = native

        def do_coll() -> None:
            tab = tabs[off]
            try:
                tab[out_key] = run(tab[in_key])
            except ChannelClosedError:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. shapes that differ by member
                tab[out_key] = self._error(exc, coll_name, off)
        return do_coll
