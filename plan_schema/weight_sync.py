"""Weight sync, the rules both compiler and runtime share: the canonical parameter list, its
digest and the bucket layout (docs/weight_sync.md).

A weight sync copies a torch module's parameters from one actor (the learner) into the
same module on other actors (rollouts), in place, every execution. The compiler stores the
list of parameters (name, shape, dtype), how they are packed into buckets and a digest of
the list in the plan; each end recomputes the digest from its live module at start.

Example:
    >>> params = [("w", (2, 3), "float32"), ("b", (3,), "float32")]
    >>> [[(m.param, m.offset, m.nbytes) for m in b] for b in bucket_layout(params, 16)]
    [[(0, 0, 24)], [(1, 0, 12)]]
    >>> param_digest(params).hex()[:12]
    'f50ec09c74a9'
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import CgcError

__all__ = [
    "SEND_METHOD",
    "RECV_METHOD",
    "DTYPE_BYTES",
    "DEFAULT_BUCKET_BYTES",
    "ParamSpec",
    "Member",
    "WeightSpecError",
    "param_nbytes",
    "param_digest",
    "bucket_layout",
    "sync_summary",
    "transfer_lines",
]

# The methods of the two ends' CALL nodes: not identifiers, so no user method has them.
SEND_METHOD = "cgc.sync.send"
RECV_METHOD = "cgc.sync.recv"
DEFAULT_BUCKET_BYTES = 256 << 20

# Bytes per element of every dtype a parameter may have (torch's names, without "torch.").
DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8, "complex128": 16,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}

ParamSpec = tuple[str, Sequence[int], str]  # (name, shape, dtype)


class WeightSpecError(CgcError, ValueError):
    """A parameter list that cannot be synced: an unknown dtype, a bad shape or name."""


@dataclass(frozen=True)
class Member:
    """A parameter's bytes in a bucket: ``param`` (index in the list), ``offset``, ``nbytes``."""

    param: int
    offset: int
    nbytes: int


def param_nbytes(name: str, shape: Sequence[int], dtype: str) -> int:
    """Bytes of one parameter.

    Example: ``param_nbytes("w", (2, 3), "bfloat16")`` is 12.

    Raises:
        WeightSpecError: an unknown dtype or a negative dimension (naming the parameter).
    """
    if dtype not in DTYPE_BYTES:
        raise WeightSpecError(f"parameter {name!r}: dtype {dtype!r} cannot be synced "
                              f"(known: {', '.join(sorted(DTYPE_BYTES))})")
    n = DTYPE_BYTES[dtype]
    for d in shape:
        if d < 0:
            raise WeightSpecError(f"parameter {name!r}: negative dimension in {tuple(shape)}")
        n *= d
    return n


def _canonical(params: Sequence[ParamSpec]) -> bytes:
    """One line per parameter, ``name<TAB>dtype<TAB>d0,d1``, in order."""
    return "".join(f"{n}\t{dt}\t{','.join(str(int(d)) for d in s)}\n"
                   for n, s, dt in params).encode()


def param_digest(params: Sequence[ParamSpec]) -> bytes:
    """SHA-256 of the canonical (name, dtype, shape) sequence: equal lists, equal digests.

    Example: ``len(param_digest([("w", (2,), "float32")]))`` is 32.

    Raises:
        Nothing: any sequence of (str, ints, str) has a digest.
    """
    return hashlib.sha256(_canonical(params)).digest()


def bucket_layout(params: Sequence[ParamSpec], bucket_bytes: int) -> list[list[Member]]:
    """Pack the parameters, in order and whole, into buckets of at most ``bucket_bytes``;
    a parameter larger than that gets a bucket of its own. No bucket is empty (a list
    without bytes has no bucket).

    Example: ``len(bucket_layout([("a", (4,), "float32")] * 3, 32))`` is 2.

    Raises:
        WeightSpecError: ``bucket_bytes`` < 1, or a parameter ``param_nbytes`` refuses.
    """
    if bucket_bytes < 1:
        raise WeightSpecError(f"bucket_bytes must be at least 1, got {bucket_bytes}")
    buckets: list[list[Member]] = []
    cur: list[Member] = []
    used = 0
    for i, (name, shape, dtype) in enumerate(params):
        n = param_nbytes(name, shape, dtype)
        if n == 0:
            continue
        if cur and used + n > bucket_bytes:
            buckets.append(cur)
            cur, used = [], 0
        cur.append(Member(i, used, n))
        used += n
    if cur:
        buckets.append(cur)
    return buckets


def sync_summary(sync: pb.WeightSync, transfer: pb.TransferPlan) -> str:
    """``"4 params, 1,680 bytes, 3 buckets, digest 8044e1fb88355f09"``: a sync in one phrase.

    Example: ``sync_summary(pb.WeightSync(), pb.TransferPlan())`` is
    ``"0 params, 0 bytes, 0 buckets, digest -"``.

    Raises:
        Nothing: any pair of messages has a summary.
    """
    return (f"{len(sync.params)} params, {transfer.total_bytes:,} bytes, "
            f"{len(transfer.buckets)} buckets, digest {transfer.digest.hex()[:16] or '-'}")


def _member_text(sync: pb.WeightSync, m: pb.BucketMember) -> str:
    """``w2[32,4]float32@512``: a parameter at its offset in a bucket."""
    p = sync.params[m.param] if m.param < len(sync.params) else pb.WeightParam(name="?")
    return f"{p.name}[{','.join(str(d) for d in p.shape)}]{p.dtype}@{m.offset}"


def transfer_lines(plan: pb.Plan, max_members: int = 4) -> list[str]:
    """The weight syncs of a plan as ``cgc inspect`` prints them: one line per sync, one per
    bucket (its first ``max_members`` parameters, then how many more); none without syncs.

    Example: ``transfer_lines(pb.Plan())`` is ``[]``.

    Raises:
        Nothing: a plan with fewer transfer plans than syncs prints the ones it has.
    """
    g = plan.graph
    if not g.weight_syncs:
        return []
    out = [f"weight syncs ({len(g.weight_syncs)}):"]
    for s, t in zip(g.weight_syncs, plan.lowered.transfers, strict=False):
        targets = ",".join(f"{a}.{s.target_attr}" for a in s.targets)
        out.append(f"  sync {s.id} {s.name!r}: {s.source}.{s.source_attr} -> {targets}: "
                   f"{sync_summary(s, t)} (bucket_bytes={s.bucket_bytes:,})")
        for b in t.buckets:
            shown = " ".join(_member_text(s, m) for m in b.members[:max_members])
            more = len(b.members) - max_members
            out.append(f"    bucket {b.index}: {b.nbytes:,} bytes, {len(b.members)} params: "
                       f"{shown}" + (f" ... ({more} more)" if more > 0 else ""))
    return out
