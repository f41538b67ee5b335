"""The communicator interface (NCCL-shaped) and the reduction ops.

A ``Communicator`` is one rank's handle on a group. Semantics follow NCCL: ``send``
completes only when the peer's matching ``recv`` takes the value (rendezvous); every
collective returns on a rank only after all ranks have contributed. Calls on one rank
happen in the plan's ``Op.seq`` order, identical on all members. A GPU implementation
(cupy/torch NCCL) subclasses this and may use ``shape``/``dtype`` hints on ``recv``.

Example:
    >>> from cgc.runtime.channels.comm import ReduceOp, reduce_values
    >>> import numpy as np
    >>> reduce_values([np.array([1, 5]), np.array([3, 2])], ReduceOp.MAX).tolist()
    [3, 5]
"""

from __future__ import annotations

import abc
import enum
from typing import Any

import numpy as np

__all__ = ["Communicator", "ReduceOp", "reduce_values"]


class ReduceOp(enum.Enum):
    """Reductions of allreduce / reducescatter (the set Ray and NCCL share)."""

    SUM = "sum"
    PRODUCT = "product"
    MAX = "max"
    MIN = "min"
    AVG = "avg"


def reduce_values(values: list[Any], op: ReduceOp | str) -> Any:
    """Reduce same-shaped numpy arrays or torch tensors elementwise, in list order.

    Returns the input type and dtype (AVG of integers floors, as a sum // n).

    Raises:
        ValueError: shapes or dtypes differ, or an unknown op.
    """
    op = ReduceOp(op.lower() if isinstance(op, str) else op)
    first = values[0]
    for v in values[1:]:
        if tuple(v.shape) != tuple(first.shape) or v.dtype != first.dtype:
            raise ValueError(f"collective inputs differ: {tuple(first.shape)}/{first.dtype} "
                             f"vs {tuple(v.shape)}/{v.dtype}")
    if isinstance(first, np.ndarray):
        fn = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
              ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}[op]
        acc = np.array(first, copy=True)
        for v in values[1:]:
            fn(acc, v, out=acc)
        if op is ReduceOp.AVG:
            if acc.dtype.kind in "fc":
                acc /= len(values)
            else:
                acc //= len(values)
        return acc
    import torch

    acc = first.clone()
    for v in values[1:]:
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            acc.add_(v)
        elif op is ReduceOp.PRODUCT:
            acc.mul_(v)
        elif op is ReduceOp.MAX:
            torch.maximum(acc, v, out=acc)
        else:
            torch.minimum(acc, v, out=acc)
    if op is ReduceOp.AVG:
        if acc.is_floating_point() or acc.is_complex():
            acc.div_(len(values))
        else:
            acc = torch.div(acc, len(values), rounding_mode="floor").to(first.dtype)
    return acc


class Communicator(abc.ABC):
    """One rank of a communicator group (NCCL semantics; see the module docstring)."""

    rank: int
    world_size: int

    @abc.abstractmethod
    def send(self, value: Any, peer: int, timeout: float | None = None) -> None:
        """Send ``value`` to rank ``peer``; returns once the peer's ``recv`` has taken it.

        Raises:
            ChannelTimeoutError, ChannelClosedError.
        """

    @abc.abstractmethod
    def recv(self, peer: int, shape: Any = None, dtype: Any = None,
             timeout: float | None = None) -> Any:
        """Receive the next value sent by ``peer`` (shape/dtype: hints for GPU backends).

        Raises:
            ChannelTimeoutError, ChannelClosedError.
        """

    @abc.abstractmethod
    def allreduce(self, value: Any, op: ReduceOp | str = ReduceOp.SUM,
                  timeout: float | None = None) -> Any:
        """Elementwise reduction over all ranks; every rank gets the same result."""

    @abc.abstractmethod
    def allgather(self, value: Any, timeout: float | None = None) -> list[Any]:
        """Every rank's value, in rank order (a GPU backend returns views of one buffer)."""

    @abc.abstractmethod
    def reducescatter(self, value: Any, op: ReduceOp | str = ReduceOp.SUM,
                      timeout: float | None = None) -> Any:
        """Reduce over ranks, then rank r keeps chunk r of dim 0 (dim 0 % world_size == 0)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Release the group; peers blocked on this rank raise ChannelClosedError."""
