"""Text forms of ops, programs and whole plans (``cgc inspect``, golden tests, errors).

Only protobuf and the standard library are imported here: the runtime uses these forms in
its error messages.

Op tokens
---------
One op prints as one token without spaces::

    token   := task KIND [ "." out ] [ ":c" channel ] [ arrow peer ] [ "@g" comm ]
               [ "#" seq ] [ "{" node { "," node } "}" ] [ "+" off ] [ "~" ]
    KIND    := "R" (READ) | "C" (COMPUTE) | "W" (WRITE) | "SEND" | "RECV" | "COLL"
    arrow   := "→" (SEND: to peer) | "←" (RECV: from peer)      ("->" and "<-" also parse)

``task`` is the node id the op serves, ``out`` the output index (printed when not 0),
``channel`` the channel id (printed when not 0), ``comm`` the communicator the op runs on
and ``seq`` its position in that communicator's order (both always printed for
SEND/RECV/COLL), the braces the input attributes a READ takes out of the whole input
(``Op.extract``, printed when not empty), ``+off`` the exec offset (``+1``: a prefetch for
the next execution; printed when not 0), and a trailing ``~`` means the op is issued on
the communication stream. Examples::

    3R:c1           READ channel 1, for task 3
    3R:c1{1,2}      READ the whole input on channel 1 and take nodes 1 and 2 out of it
    3C              COMPUTE task 3
    3W.1:c4         WRITE output 1 of task 3 on channel 4
    3SEND:c5→b@g0#0 SEND output 0 of task 3 on NCCL channel 5 to actor b, communicator 0, seq 0
    7RECV:c5←a@g0#0~  RECV on channel 5 from a, seq 0, for task 7, on the comm stream
    9COLL@g1#2      take part in collective node 9 on communicator 1, seq 2
    7RECV:c5←a@g0#3+1~  the same RECV for the next execution (prefetch)

A program prints as one line, ``actor: [prologue tokens] loop tokens`` (the bracketed part
only when the prologue is not empty). ``parse_op(format_op(op)) == op`` and
``parse_program(format_program(p)) == p`` for every well-formed op and program.

The formatters never fail with a bare exception on a plan read from a file: an enum value
this cgc does not know (a newer or corrupted plan) raises ``PlanFormatError`` naming the
field.
"""

from __future__ import annotations

import re
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import PlanFormatError
from cgc.plan_schema.inputs import describe_inputs
from cgc.plan_schema.weight_sync import transfer_lines

__all__ = ["format_op", "parse_op", "format_program", "parse_program", "format_plan_text"]

_KINDS = {
    pb.READ: "R",
    pb.COMPUTE: "C",
    pb.WRITE: "W",
    pb.SEND: "SEND",
    pb.RECV: "RECV",
    pb.COLL: "COLL",
}
_BY_CODE = {v: k for k, v in _KINDS.items()}
_TOKEN = re.compile(
    r"^(?P<task>\d+)(?P<kind>SEND|RECV|COLL|R|C|W)"
    r"(?:\.(?P<out>\d+))?(?::c(?P<ch>\d+))?"
    r"(?:(?P<arrow>→|->|←|<-)(?P<peer>@?[A-Za-z_][\w.\-]*?))?"
    r"(?:@g(?P<comm>\d+))?(?:#(?P<seq>\d+))?(?:\{(?P<extract>\d+(?:,\d+)*)\})?"
    r"(?:\+(?P<off>\d+))?(?P<stream>~)?$"
)
_COMM_OPS = (pb.SEND, pb.RECV, pb.COLL)


def _name(enum: Any, value: int, what: str) -> str:  # a protobuf enum wrapper
    """``enum.Name(value)``, or PlanFormatError naming ``what`` for a value it lacks."""
    try:
        return enum.Name(value)
    except ValueError:
        raise PlanFormatError(
            f"{what} has the unknown value {value} (a plan from a newer cgc, or corrupted)"
        ) from None


def format_op(op: pb.Op) -> str:
    """One op as a token, e.g. ``"3SEND:c5→b@g0#0~"``.

    Example: ``format_op(pb.Op(kind=pb.COMPUTE, task=3)) == "3C"``.

    Raises:
        PlanFormatError: the op's kind is unspecified or unknown.
    """
    if op.kind not in _KINDS:
        raise PlanFormatError(
            f"an op (task {op.task}) has kind {op.kind}, which is not a known op kind"
        )
    s = f"{op.task}{_KINDS[op.kind]}"
    if op.output_index:
        s += f".{op.output_index}"
    if op.channel:
        s += f":c{op.channel}"
    if op.peer:
        s += ("→" if op.kind == pb.SEND else "←") + op.peer
    if op.kind in _COMM_OPS or op.communicator:
        s += f"@g{op.communicator}"
    if op.kind in _COMM_OPS or op.seq:
        s += f"#{op.seq}"
    if op.extract:
        s += "{" + ",".join(map(str, op.extract)) + "}"
    if op.exec_offset:
        s += f"+{op.exec_offset}"
    if op.stream == pb.COMM_STREAM:
        s += "~"
    return s


def parse_op(token: str) -> pb.Op:
    """Parse a token written by ``format_op``.

    Example: ``parse_op("3W.1:c4") == pb.Op(kind=pb.WRITE, task=3, output_index=1, channel=4)``.

    Raises:
        ValueError: the token does not follow the grammar (the message quotes it).
    """
    m = _TOKEN.match(token.strip())
    if m is None:
        raise ValueError(
            f"not an op token: {token!r} (expected e.g. '3C', '3R:c1', '3SEND:c5→b@g0#0')"
        )
    op = pb.Op(kind=_BY_CODE[m["kind"]], task=int(m["task"]))
    if m["out"]:
        op.output_index = int(m["out"])
    if m["ch"]:
        op.channel = int(m["ch"])
    if m["peer"]:
        op.peer = m["peer"]
    if m["comm"]:
        op.communicator = int(m["comm"])
    if m["seq"]:
        op.seq = int(m["seq"])
    if m["extract"]:
        op.extract.extend(int(i) for i in m["extract"].split(","))
    if m["off"]:
        op.exec_offset = int(m["off"])
    if m["stream"]:
        op.stream = pb.COMM_STREAM
    return op


def format_program(program: pb.Program, plan: pb.Plan | None = None) -> str:
    """One program as one line: ``"w1: [2RECV:c3←w0@g0#0] 2C 2W:c4"``.

    ``plan`` is accepted for symmetry with the other dumps and not needed.
    Example: ``format_program(pb.Program(actor="a", ops=[pb.Op(kind=pb.COMPUTE, task=1)]))
    == "a: 1C"``.

    Raises:
        PlanFormatError: an op of an unknown kind (the message names the actor).
    """
    del plan
    parts = [f"{program.actor}:"]
    try:
        if program.prologue:
            parts.append("[" + " ".join(format_op(op) for op in program.prologue) + "]")
        parts.extend(format_op(op) for op in program.ops)
    except PlanFormatError as exc:
        raise PlanFormatError(f"program of actor {program.actor!r}: {exc}") from None
    return " ".join(parts)


def parse_program(line: str) -> pb.Program:
    """Parse a line written by ``format_program``.

    Raises:
        ValueError: no ``actor:`` prefix, an unclosed ``[``, or a bad token.
    """
    actor, sep, rest = line.partition(":")
    if not sep or not actor.strip():
        raise ValueError(f"not a program line: {line!r} (expected 'actor: tokens')")
    prog = pb.Program(actor=actor.strip())
    rest = rest.strip()
    if rest.startswith("["):
        inner, close, rest = rest[1:].partition("]")
        if not close:
            raise ValueError(f"unclosed prologue in {line!r}")
        prog.prologue.extend(parse_op(t) for t in inner.split())
    prog.ops.extend(parse_op(t) for t in rest.split())
    return prog


def format_plan_text(plan: pb.Plan) -> str:
    """The whole plan, readable: what ``cgc inspect`` prints and golden tests compare.

    Each line is escaped (``cgc.plan_schema.display.escape``): a string from the plan never
    starts a line of its own or drives a terminal.

    Example: ``print(format_plan_text(plan))``.

    Raises:
        PlanFormatError: the plan holds an enum value this cgc does not know (the message
            names the field); other damage prints as it is (``cgc check`` finds it).
    """
    from cgc.plan_schema.display import escape

    return "\n".join(escape(line) for line in _plan_lines(plan)) + "\n"


def _loc(loc: pb.SourceLoc) -> str:
    return f"  @{loc.file}:{loc.line}" if loc.file else ""


def _arg(arg: pb.Arg) -> str:
    if arg.WhichOneof("kind") == "ref":
        r = arg.ref
        return f"%{r.node}" + (f".{r.output_index}" if r.output_index else "")
    from cgc.plan_schema.values import value_to_text

    return value_to_text(arg.constant, 40)


def _node_line(n: pb.Node) -> str:
    kind = _name(pb.NodeKind, n.kind, f"node %{n.id} kind")
    args = ", ".join([_arg(a) for a in n.args] + [f"{k.name}={_arg(k.arg)}" for k in n.kwargs])
    if n.kind == pb.INPUT_ATTR:
        key = f"[{n.index}]" if n.key_kind == pb.INDEX else f".{n.field}"
        return f"  %{n.id} = input{key}"
    if n.kind == pb.INPUT:
        return f"  %{n.id} = input"
    if n.kind == pb.OUTPUT:
        return f"  %{n.id} = output({args})" + (" multi" if n.multi_output else "")
    extra = f" -> {n.num_returns} outputs" if n.num_returns > 1 else ""
    if n.kind == pb.COLLECTIVE:
        extra += f" collective={n.collective}"
    for h in n.hints:
        t = _name(pb.Transport, h.hint.transport, f"node %{n.id} transport hint").lower()
        dev = _name(pb.Device, h.hint.device, f"node %{n.id} device hint").lower()
        extra += f" hint[{h.output_index}]={t}" + (f"/{dev}" if h.hint.device else "")
        if h.hint.requested:
            extra += f"(rdt:{h.hint.requested})"
    if n.cuda_graph:
        extra += " cuda_graph"
    return f"  %{n.id} = {n.name or kind.lower()}({args}){extra}{_loc(n.loc)}"


def _actor_line(a: pb.Actor) -> str:
    o = a.options
    opts = [f"{f}={getattr(o, f):g}" for f in ("num_cpus", "num_gpus", "memory") if o.HasField(f)]
    opts += [f"{r.name}={r.amount:g}" for r in o.resources]
    cls = f"{a.cls.module}.{a.cls.qualname}" if a.cls.module else a.cls.qualname
    ext = (
        f" external={a.external.name or a.external.actor_id}"
        if (a.external.name or a.external.actor_id)
        else ""
    )
    held = a.external.placement
    if held.observed:  # what a live actor held when compiled
        ext += " held=" + (",".join(f"{r.name}:{r.amount:g}" for r in held.resources) or "-")
        ext += f" gpus={','.join(held.gpu_ids)}" if held.gpu_ids else ""
    return f"  {a.name}: {cls}({len(a.ctor_args)} args) {' '.join(opts)}{ext}".rstrip()


def _channel_line(ch: pb.Channel) -> str:
    kind = _name(pb.ChannelKind, ch.kind, f"channel c{ch.id} kind")
    kind = {pb.CHAN_HOST: "host", pb.CHAN_NCCL: "nccl"}.get(ch.kind, kind.lower())
    src = f"%{ch.source.node}" + (f".{ch.source.output_index}" if ch.source.output_index else "")
    extra = f" comm={ch.communicator}" if ch.kind == pb.CHAN_NCCL else f" slots={ch.slots}"
    if ch.device:
        extra += f" device={_name(pb.Device, ch.device, f'channel c{ch.id} device').lower()}"
    if ch.spec.dtype:
        extra += f" spec={ch.spec.dtype}{list(ch.spec.shape)}"
    if ch.direct_return:
        extra += " direct"
    return (
        f"  c{ch.id} {kind} {src} {ch.writer} -> {','.join(ch.readers)}{extra}"
        f" bytes={ch.slot_bytes} ({ch.reason})"
    )


def _plan_lines(plan: pb.Plan) -> list[str]:
    g, low, cfg = plan.graph, plan.lowered, plan.config
    out = [
        f"plan {plan.name!r}"
        + (f" from {plan.source.file}:{plan.source.attr}" if plan.source.file else "")
    ]
    out.append("inputs: " + describe_inputs(g))
    out.append(f"actors ({len(g.actors)}):")
    out.extend(_actor_line(a) for a in g.actors)
    out.extend(
        f"  module {m.name}: embedded from {m.source_file or '?'} ({len(m.source):,} chars)"
        for m in g.modules
    )
    out.append(f"nodes ({len(g.nodes)}):")
    out.extend(_node_line(n) for n in g.nodes)
    for c in g.collectives:
        kind = _name(pb.CollectiveKind, c.kind, f"collective {c.id} kind").lower()
        op = _name(pb.ReduceOp, c.reduce_op, f"collective {c.id} reduce_op").lower()
        out.append(f"  collective {c.id}: {kind}/{op} members {['%' + str(n) for n in c.nodes]}")
    out.append(f"channels ({len(low.channels)}):")
    out.extend(_channel_line(ch) for ch in low.channels)
    out.append(f"  driver writes {list(low.input_channels)}, reads {list(low.output_channels)}")
    if low.communicators:
        out.append("communicators:")
        out.extend(f"  comm {c.id}: {' '.join(c.members)}" for c in low.communicators)
    out.extend(transfer_lines(plan))
    out.append("programs:")
    out.extend("  " + format_program(p) for p in low.programs)
    depths = [f"{p.actor}={p.wake_depth}" for p in low.programs if p.wake_depth]
    if depths:
        out.append(f"wake depths: {' '.join(depths)}")
    captured = [f"{p.actor}=" + ",".join(format_op(p.ops[i]) if i < len(p.ops) else f"op{i}?"
                                         for i in p.captured_ops)
                for p in low.programs if p.captured_ops]
    if captured:  # each a region of its own: one CUDA graph replayed per execution
        out.append(f"cuda graphs: {' '.join(captured)}")
    at_cap = _name(pb.AtCapacity, cfg.at_capacity, "ExecConfig.at_capacity")
    out.append(
        f"config: capacity={cfg.capacity} at_capacity={at_cap.removeprefix('AT_CAPACITY_').lower()} "
        f"submit_timeout={cfg.submit_timeout_s:g}s "
        f"get_timeout={cfg.get_timeout_s:g}s teardown={cfg.teardown_timeout_s:g}s "
        f"setup={cfg.setup_timeout_s:g}s spin={cfg.spin_us}us slot_bytes={cfg.default_slot_bytes} "
        f"max_buffered={cfg.max_buffered_results}"
    )
    s = low.schedule
    costs = " ".join(f"{c.key}={c.micros:g}" for c in s.costs)
    out.append(
        f"schedule: {s.scheduler or '-'} makespan={s.makespan_us:g}us overlap={str(s.overlap).lower()} "
        f"verified_executions={s.verified_executions}"
    )
    if costs:
        out.append(f"costs(us): {costs}")
    return out
