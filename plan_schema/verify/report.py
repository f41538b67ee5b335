"""Deadlock reports: a per-process table with the stuck op marked, and the wait-for cycle.

Example of a message::

    deadlock: no process can move (stepping 4 executions, capacity 2)
      process   exec  pos   op
      a         0     2/8   3RECV:c3←b#1   <-- stuck
      b         0     1/8   4RECV:c4←a#0   <-- stuck
      @driver   1     3/12  write c1       <-- stuck
    wait-for cycle: a waits for b (RECV from b on c3), b waits for a (RECV from a on c4)
    programs (the stuck op in >> <<):
      a: 1C 1W:c1 >>3RECV:c3←b#1<< 3C 3SEND:c4→b#0
"""

from __future__ import annotations

from typing import Any

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op

__all__ = ["deadlock_message", "waits_for"]

_WINDOW = 4  # ops shown on each side of the stuck op


def _tok(name: str, op: pb.Op) -> str:
    if name == DRIVER:  # the driver's ops are bare channel reads and writes
        return f"{'write' if op.kind == pb.WRITE else 'read'} c{op.channel}"
    return format_op(op)


def waits_for(sim: Any, name: str) -> list[tuple[str, str]]:
    """``[(process, why)]`` that the blocked process ``name`` waits for."""
    p = sim.procs[name]
    op, e = p.head
    ch = sim.channels.get(op.channel)
    if op.kind == pb.READ:
        return [(ch.writer, f"READ on c{ch.id}: not written yet")]
    if op.kind == pb.WRITE:
        low = min(sim.reads[ch.id].values())
        slow = [r for r, n in sorted(sim.reads[ch.id].items()) if n == low]
        slots = getattr(sim, "slots", {}).get(ch.id, ch.slots)
        return [(r, f"WRITE on c{ch.id}: ring of {slots} full") for r in slow]
    if op.kind == pb.SEND:
        return [(op.peer, f"SEND to {op.peer} on c{op.channel}")]
    if op.kind == pb.RECV:
        return [(op.peer, f"RECV from {op.peer} on c{op.channel}")]
    if op.kind == pb.COLL:
        out = []
        for actor in sim.coll_members.get(op.task, []):
            h = sim.procs[actor].head
            if (
                h is None
                or h[0].kind != pb.COLL
                or h[1] != e
                or sim.coll_of.get(h[0].task) != sim.coll_of.get(op.task)
            ):
                out.append((actor, f"COLL #{op.seq} of node {op.task}"))
        return out
    return []


def _cycle(sim: Any, blocked: list[str]) -> tuple[list[str], list[str]]:
    """Follow the first blocked wait target from the first blocked process until a repeat."""
    start = blocked[0]
    path, why, seen = [start], [], {start: 0}
    cur = start
    while True:
        targets = waits_for(sim, cur)
        nxt = next(((t, w) for t, w in targets if t in blocked), None)
        if nxt is None:  # waits only for finished processes: a chain, not a cycle
            done = targets[0] if targets else ("?", "nothing")
            why.append(f"{cur} waits for {done[0]} ({done[1]}), which has finished")
            return path, why
        t, w = nxt
        why.append(f"{cur} waits for {t} ({w})")
        if t in seen:
            i = seen[t]
            return path[i:], why[i:]
        seen[t] = len(path)
        path.append(t)
        cur = t


def deadlock_message(sim: Any) -> tuple[str, list[str]]:
    """The table, the cycle and the program slices of a stuck simulation."""
    blocked = [n for n in sim.order if sim.procs[n].head is not None]
    lines = [
        f"deadlock: no process can move (stepping {sim.n} executions, capacity {sim.capacity})",
        f"  {'process':<10}{'exec':<6}{'pos':<10}op",
    ]
    for name in sim.order:
        p = sim.procs[name]
        if p.head is None:
            lines.append(f"  {name:<10}{'-':<6}{'done':<10}")
            continue
        op, e = p.head
        pos = f"{p.pc}/{p.length}"
        lines.append(f"  {name:<10}{e:<6}{pos:<10}{_tok(name, op):<18} <-- stuck")
    cycle, why = _cycle(sim, blocked)
    kind = (
        "wait-for cycle"
        if len(why) == len(cycle) and "finished" not in why[-1]
        else "wait-for chain"
    )
    lines.append(f"{kind}: " + ", ".join(why))
    lines.append("programs (the stuck op in >> <<):")
    for name in sim.order:
        p = sim.procs[name]
        if name == DRIVER or p.head is None:
            continue
        lo, hi = max(0, p.pc - _WINDOW), min(p.length, p.pc + _WINDOW + 1)
        toks = [
            _tok(name, op) if i != p.pc else f">>{_tok(name, op)}<<"
            for i, (op, _) in enumerate(p.window(lo, hi), lo)
        ]
        lines.append(
            f"  {name}: "
            + ("... " if lo else "")
            + " ".join(toks)
            + (" ..." if hi < p.length else "")
        )
    return "\n".join(lines), cycle
