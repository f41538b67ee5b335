"""Plans an attacker would craft, for the trust tests: pickles that leave a marker file when
unpickled, envelopes written by hand (any header bit, a recomputed checksum, any signature)."""

from __future__ import annotations

import hashlib
import pickle
import struct
from pathlib import Path

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.version import MAGIC


class _Marker:
    """Unpickles by calling ``eval``: touches ``path`` and returns ``value``."""

    def __init__(self, path: Path, value: object) -> None:
        self.path, self.value = str(path), value

    def __reduce__(self):
        return (eval, (f"__import__('pathlib').Path({self.path!r}).touch() or {self.value!r}",))


def marker_pickle(path: Path, value: object = None) -> bytes:
    """Pickle bytes whose unpickling creates ``path`` (and yields ``value``)."""
    return pickle.dumps(_Marker(path, value), protocol=5)


def pickled(path: Path, value: object = None) -> pb.Value:
    return pb.Value(pickled=marker_pickle(path, value))


def envelope(plan: pb.Plan, *, needs_trust_bit: bool = False,
             signature: bytes = b"", signer_key: bytes = b"") -> bytes:
    """A plan file as an attacker writes it: any header bit, a correct checksum."""
    payload = plan.SerializeToString(deterministic=True)
    header = pb.PlanHeader(
        format_version=pb.FormatVersion(major=plan.format_version.major or 1,
                                        minor=plan.format_version.minor),
        producer="crafted", payload_sha256=hashlib.sha256(payload).digest(),
        payload_len=len(payload), needs_trust=needs_trust_bit, name=plan.name,
        signature=signature, signer_key=signer_key,
    ).SerializeToString(deterministic=True)
    return MAGIC + struct.pack("<I", len(header)) + header + payload


def split(data: bytes) -> tuple[pb.PlanHeader, pb.Plan]:
    (hlen,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    return (pb.PlanHeader.FromString(data[start:start + hlen]),
            pb.Plan.FromString(data[start + hlen:]))


def nest_pickles(plan: pb.Plan, marker: Path) -> None:
    """Put marker pickles at depth everywhere values live: a node constant (inside a list
    and a dict), an actor constructor argument, an example input."""
    node = next(n for n in plan.graph.nodes if n.kind == pb.CALL)
    arg = node.args.add()
    inner = arg.constant.list_value.items
    inner.add(int_value=1)
    deeper = inner.add()
    deeper.list_value.items.add().CopyFrom(pickled(marker))
    kw = node.kwargs.add(name="cfg")
    entry = kw.arg.constant.map_value.entries.add()
    entry.key.str_value = "k"
    entry.value.CopyFrom(pickled(marker))
    plan.graph.actors[0].ctor_args.add().tuple_value.items.add().CopyFrom(pickled(marker))
    plan.has_example_inputs = True
    del plan.example_args[:]  # the graph takes one argument: the pickle replaces any example
    plan.example_args.add().CopyFrom(pickled(marker))
