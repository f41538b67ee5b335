"""What a collective computes from its members' contributions: the one rule every
communicator (CPU, CUDA IPC, host staging, NCCL's host path) and the executor follow.

- ``allreduce``: the elementwise reduction of every rank's value, in rank order, on every
  rank (``reduce_values``).
- ``allgather``: every rank's value, in rank order (a plan's ``Collective.concat``: those
  values concatenated along dim 0, one value - Ray's allgather; ``concat_rows``).
- ``reducescatter``: the reduction, split along dim 0 into ``world`` equal chunks; rank r
  keeps chunk r. Dim 0 must divide by the world size, as in Ray and NCCL: otherwise the
  collective fails with ``CollectiveShapeError`` naming the sizes — never leftover rows
  dropped without a word.

Inputs must agree in shape and dtype on every rank (``ValueError`` otherwise).

Example:
    >>> import numpy as np
    >>> parts = [np.arange(4.0), np.arange(4.0) + 10]
    >>> combine("reducescatter", parts, ReduceOp.SUM, rank=1, world=2).tolist()
    [14.0, 16.0]
    >>> combine("reducescatter", [np.arange(3.0)] * 2, ReduceOp.SUM, rank=0, world=2)
    Traceback (most recent call last):
    ...
    cgc.runtime.comm.collective.CollectiveShapeError: reducescatter: dim 0 (3) is not divisible by the world size 2
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cgc.plan_schema.collective import ReduceOp

__all__ = ["ReduceOp", "CollectiveShapeError", "reduce_values", "scatter_rows", "scatter_part",
           "combine", "concat_rows"]


class CollectiveShapeError(ValueError):
    """A collective's inputs cannot be split as it needs (reducescatter's dim 0)."""


def reduce_values(values: list[Any], op: ReduceOp | str) -> Any:
    """Reduce same-shaped numpy arrays or torch tensors elementwise, in list order.

    Returns the input type and dtype (AVG of integers floors, as a sum // n).

    Example:
        >>> reduce_values([np.array([1, 5]), np.array([3, 2])], ReduceOp.MAX).tolist()
        [3, 5]

    Raises:
        TypeError: a value is not an array or a tensor (a Python number, a list).
        ValueError: shapes or dtypes differ, or an unknown op.
    """
    op = ReduceOp.of(op)
    for v in values:
        if not (hasattr(v, "shape") and hasattr(v, "dtype")):
            raise TypeError(f"a {op.name.lower()} reduction takes numpy arrays or torch tensors, not "
                            f"{type(v).__name__}: wrap the value (np.asarray(x)) before the "
                            "collective")
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


def scatter_rows(shape: Any, world: int) -> int:
    """Rows of dim 0 each rank keeps in a reducescatter of inputs shaped ``shape``.

    Example: ``scatter_rows((8, 3), 4) == 2``.

    Raises:
        CollectiveShapeError: a scalar, or dim 0 not divisible by ``world``.
    """
    dims = tuple(shape)
    if not dims:
        raise CollectiveShapeError("reducescatter: the input is a scalar; it needs a dim 0 "
                                   f"divisible by the world size {world}")
    if dims[0] % world:
        raise CollectiveShapeError(f"reducescatter: dim 0 ({dims[0]}) is not divisible by the "
                                   f"world size {world}")
    return dims[0] // world


def scatter_part(full: Any, rank: int, world: int) -> Any:
    """Rank ``rank``'s chunk of a reduced ``full`` (a copy, not a view of ``full``).

    Raises:
        CollectiveShapeError: as ``scatter_rows``.
    """
    n = scatter_rows(full.shape, world)
    part = full[rank * n:(rank + 1) * n]
    return part.copy() if hasattr(part, "copy") else part.clone()


def combine(kind: str, parts: list[Any], op: ReduceOp | str | None, rank: int,
            world: int) -> Any:
    """Rank ``rank``'s result of collective ``kind`` ("allreduce", "allgather",
    "reducescatter") from every rank's contribution ``parts`` (rank order).

    Raises:
        CollectiveShapeError: reducescatter's dim 0 does not divide by ``world``.
        ValueError: inputs differ in shape or dtype; an unknown kind or op.
    """
    if kind == "allgather":
        return list(parts)
    if kind == "reducescatter":
        scatter_rows(parts[0].shape, world)  # before the work: the same error on every rank
    if kind not in ("allreduce", "reducescatter"):
        raise ValueError(f"unknown collective {kind!r}")
    full = reduce_values(parts, ReduceOp.SUM if op is None else op)
    return full if kind == "allreduce" else scatter_part(full, rank, world)


def concat_rows(values: list[Any]) -> Any:
    """An allgather's values (numpy arrays or torch tensors, in rank order) concatenated
    along dim 0, on their device: Ray's allgather result.

    Example:
        >>> concat_rows([np.arange(2.0), np.arange(2.0) + 5]).tolist()
        [0.0, 1.0, 5.0, 6.0]

    Raises:
        TypeError: a value is not an array or a tensor.
    """
    first = values[0]
    if type(first).__module__.startswith("torch"):
        import torch

        return torch.cat(values, dim=0)
    if not all(isinstance(v, np.ndarray) for v in values):
        raise TypeError("Ray's allgather concatenates tensors, not "
                        f"{type(first).__name__}: gather torch tensors or numpy arrays")
    return np.concatenate(values, axis=0)
