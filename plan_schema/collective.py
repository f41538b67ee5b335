"""The collectives a plan can issue, and their reductions: one vocabulary, the plan's own.

``ReduceOp`` *is* the plan's ``pb.ReduceOp`` (same members, same numbers), so the frontend
writes it into a plan without a table and the runtime reads it back the same way; its
``word`` (``"sum"``) is what communicators put in their call tags. ``KIND_WORDS`` names
each ``pb.CollectiveKind``. How contributions combine lives in one place too:
``cgc.runtime.comm.collective``.

Example:
    >>> ReduceOp.of("max") is ReduceOp.MAX and ReduceOp(2) is ReduceOp.MAX
    True
    >>> ReduceOp.AVG.word, KIND_WORDS[pb.REDUCESCATTER]
    ('avg', 'reducescatter')
"""

from __future__ import annotations

import enum

from cgc.plan_schema import plan_pb2 as pb

__all__ = ["ReduceOp", "KIND_WORDS"]


class ReduceOp(enum.IntEnum):
    """How a reducing collective combines values: the plan's ``pb.ReduceOp`` (the members
    Ray's ``ReduceOp`` and NCCL share)."""

    SUM = pb.SUM
    PRODUCT = pb.PRODUCT
    MAX = pb.MAX
    MIN = pb.MIN
    AVG = pb.AVG

    @property
    def word(self) -> str:
        """The lower-case name (``"sum"``), as call tags and messages spell it."""
        return self.name.lower()

    @classmethod
    def of(cls, op: ReduceOp | str | int) -> ReduceOp:
        """The op from itself, its name in any case (``"SUM"``, ``"sum"``) or its number.

        Raises:
            ValueError: no such reduce op.
        """
        if isinstance(op, str):
            try:
                return cls[op.upper()]
            except KeyError:
                raise ValueError(f"unknown reduce op {op!r} (SUM, PRODUCT, MAX, MIN, AVG)") \
                    from None
        return cls(op)


KIND_WORDS: dict[int, str] = {pb.ALLREDUCE: "allreduce", pb.ALLGATHER: "allgather",
                              pb.REDUCESCATTER: "reducescatter"}
