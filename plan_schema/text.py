"""Text forms of ops, programs and whole plans (``cgc inspect``, golden tests, errors).

Only protobuf and the standard library are imported here: the runtime uses these forms in
its error messages.

Op tokens
---------
One op prints as one token without spaces::

    token   := task KIND [ "." out ] [ ":c" channel ] [ arrow peer ] [ "#" seq ] [ "+" off ] [ "~" ]
    KIND    := "R" (READ) | "C" (COMPUTE) | "W" (WRITE) | "SEND" | "RECV" | "COLL"
    arrow   := "→" (SEND: to peer) | "←" (RECV: from peer)      ("->" and "<-" also parse)

``task`` is the node id the op serves, ``out`` the output index (printed when not 0),
``channel`` the channel id (printed when not 0), ``seq`` the position in the
communicator's order (always printed for SEND/RECV/COLL), ``+off`` the exec offset
(``+1``: a prefetch for the next execution; printed when not 0), and a trailing ``~`` means
the op is issued on the communication stream. Examples::

    3R:c1        READ channel 1, for task 3
    3C           COMPUTE task 3
    3W.1:c4      WRITE output 1 of task 3 on channel 4
    3SEND:c5→b#0 SEND output 0 of task 3 on NCCL channel 5 to actor b, seq 0
    7RECV:c5←a#0~  RECV on channel 5 from a, seq 0, for task 7, on the comm stream
    9COLL#2      take part in collective node 9, seq 2
    7RECV:c5←a#3+1~  the same RECV for the next execution (prefetch)

A program prints as one line, ``actor: [prologue tokens] loop tokens`` (the bracketed part
only when the prologue is not empty). ``parse_op(format_op(op)) == op`` and
``parse_program(format_program(p)) == p`` for every well-formed op and program.
"""

from __future__ import annotations

import re

from cgc.plan_schema import plan_pb2 as pb

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
    r"(?:(?P<arrow>→|->|←|<-)(?P<peer>[A-Za-z_@][\w@.\-]*?))?"
    r"(?:#(?P<seq>\d+))?(?:\+(?P<off>\d+))?(?P<comm>~)?$"
)


def format_op(op: pb.Op) -> str:
    """One op as a token, e.g. ``"3SEND:c5→b#0~"``.

    Example: ``format_op(pb.Op(kind=pb.COMPUTE, task=3)) == "3C"``.

    Raises:
        ValueError: the op's kind is unspecified.
    """
    if op.kind not in _KINDS:
        raise ValueError(f"op has no kind: {op!r}")
    s = f"{op.task}{_KINDS[op.kind]}"
    if op.output_index:
        s += f".{op.output_index}"
    if op.channel:
        s += f":c{op.channel}"
    if op.peer:
        s += ("→" if op.kind == pb.SEND else "←") + op.peer
    if op.kind in (pb.SEND, pb.RECV, pb.COLL) or op.seq:
        s += f"#{op.seq}"
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
            f"not an op token: {token!r} (expected e.g. '3C', '3R:c1', '3SEND:c5→b#0')"
        )
    op = pb.Op(kind=_BY_CODE[m["kind"]], task=int(m["task"]))
    if m["out"]:
        op.output_index = int(m["out"])
    if m["ch"]:
        op.channel = int(m["ch"])
    if m["peer"]:
        op.peer = m["peer"]
    if m["seq"]:
        op.seq = int(m["seq"])
    if m["off"]:
        op.exec_offset = int(m["off"])
    if m["comm"]:
        op.stream = pb.COMM_STREAM
    return op


def format_program(program: pb.Program, plan: pb.Plan | None = None) -> str:
    """One program as one line: ``"w1: [2RECV:c3←w0#0] 2C 2W:c4"``.

    ``plan`` is accepted for symmetry with the other dumps and not needed.
    Example: ``format_program(pb.Program(actor="a", ops=[pb.Op(kind=pb.COMPUTE, task=1)]))
    == "a: 1C"``.
    """
    del plan
    parts = [f"{program.actor}:"]
    if program.prologue:
        parts.append("[" + " ".join(format_op(op) for op in program.prologue) + "]")
    parts.extend(format_op(op) for op in program.ops)
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

    Example: ``print(format_plan_text(plan))``.
    """
    return "\n".join(_plan_lines(plan)) + "\n"


def _loc(loc: pb.SourceLoc) -> str:
    return f"  @{loc.file}:{loc.line}" if loc.file else ""


def _arg(arg: pb.Arg) -> str:
    if arg.WhichOneof("kind") == "ref":
        r = arg.ref
        return f"%{r.node}" + (f".{r.output_index}" if r.output_index else "")
    from cgc.plan_schema.values import value_to_text

    return value_to_text(arg.constant, 40)


def _node_line(n: pb.Node) -> str:
    kind = pb.NodeKind.Name(n.kind)
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
        t = pb.Transport.Name(h.hint.transport).lower()
        dev = "" if not h.hint.device else f"/{pb.Device.Name(h.hint.device).lower()}"
        extra += f" hint[{h.output_index}]={t}{dev}"
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
    return f"  {a.name}: {cls}({len(a.ctor_args)} args) {' '.join(opts)}{ext}".rstrip()


def _channel_line(ch: pb.Channel) -> str:
    kind = {pb.CHAN_HOST: "host", pb.CHAN_NCCL: "nccl"}.get(ch.kind, "?")
    src = f"%{ch.source.node}" + (f".{ch.source.output_index}" if ch.source.output_index else "")
    extra = f" comm={ch.communicator}" if ch.kind == pb.CHAN_NCCL else f" slots={ch.slots}"
    if ch.device:
        extra += f" device={pb.Device.Name(ch.device).lower()}"
    if ch.spec.dtype:
        extra += f" spec={ch.spec.dtype}{list(ch.spec.shape)}"
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
    inputs = (
        [f"{g.num_positional} positional"]
        + [f"keywords {list(g.keyword_fields)}"] * bool(g.keyword_fields)
        + ["whole input"] * g.whole_input
    )
    out.append("inputs: " + ", ".join(inputs))
    out.append(f"actors ({len(g.actors)}):")
    out.extend(_actor_line(a) for a in g.actors)
    out.extend(
        f"  module {m.name}: embedded from {m.source_file or '?'} ({len(m.source):,} chars)"
        for m in g.modules
    )
    out.append(f"nodes ({len(g.nodes)}):")
    out.extend(_node_line(n) for n in g.nodes)
    for c in g.collectives:
        kind = pb.CollectiveKind.Name(c.kind).lower()
        out.append(
            f"  collective {c.id}: {kind}/{pb.ReduceOp.Name(c.reduce_op).lower()} "
            f"members {['%' + str(n) for n in c.nodes]}"
        )
    out.append(f"channels ({len(low.channels)}):")
    out.extend(_channel_line(ch) for ch in low.channels)
    out.append(f"  driver writes {list(low.input_channels)}, reads {list(low.output_channels)}")
    if low.communicators:
        out.append("communicators:")
        out.extend(f"  comm {c.id} {c.backend}: {' '.join(c.members)}" for c in low.communicators)
    out.append("programs:")
    out.extend("  " + format_program(p) for p in low.programs)
    out.append(
        f"config: capacity={cfg.capacity} submit_timeout={cfg.submit_timeout_s:g}s "
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
