"""Tensor values on device edges: split a value into a header and its device tensors, and back.

A value sent over a device transport (NCCL, CUDA IPC) travels in two parts:

- a small **header** over a host side-channel: ``status`` ("ok" or "error"), one
  ``TensorMeta(shape, dtype, nbytes)`` per device tensor, and the **skeleton**: the value
  pickled (protocol 5, in-band) with every device tensor replaced by a placeholder. CPU
  tensors, numpy arrays and any other picklable object stay inside the skeleton. An
  ``ErrorValue`` travels as the header's ``error`` and no tensor moves at all;
- the **tensors** themselves, as flat ``uint8`` views (any dtype moves as raw bytes),
  through the device transport.

Placeholders work at any depth (lists, dicts, dataclasses, arbitrary objects) because they
use pickle's ``persistent_id`` hook; the same tensor object appearing twice is sent once
and comes back as one tensor in both places. A value that *is* one device tensor skips
pickle entirely (``skeleton is None``).

Which objects count as "device tensors" is a parameter (``is_device``), so the same code
runs on CPU in CI with CPU tensors standing in (see ``cpu_stand_in``).

Example (CPU tensors standing in for CUDA ones):
    >>> import torch
    >>> from cgc.runtime.gpu.tensors import make_header, open_header, cpu_stand_in
    >>> x = torch.arange(4)
    >>> hdr, tensors = make_header({"x": x, "n": 3}, is_device=cpu_stand_in)
    >>> [m.shape for m in hdr.metas], hdr.status
    ([(4,)], 'ok')
    >>> open_header(hdr, tensors)["n"]
    3

The skeleton is unpickled on the receiving actor: it comes from a peer of the same graph
over a channel only the graph's actors can open (the same trust as every host channel).
"""

from __future__ import annotations

import io
import math
import pickle
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from cgc.runtime.channels.errors import ErrorValue

__all__ = [
    "TensorMeta",
    "Header",
    "STATUS_OK",
    "STATUS_ERROR",
    "is_cuda_tensor",
    "cpu_stand_in",
    "split_value",
    "rebuild_value",
    "make_header",
    "error_header",
    "open_header",
    "dtype_name",
    "torch_dtype",
    "tensor_meta",
    "as_bytes",
    "static_meta",
]

STATUS_OK = "ok"
STATUS_ERROR = "error"


class TensorMeta(NamedTuple):
    """Shape, dtype name (``"float16"``, no ``torch.`` prefix) and byte size of one tensor."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int


class Header(NamedTuple):
    """What the host side-channel carries per value (pickled by the ring).

    Attributes:
        tag: what the sender is doing ("p2p", "coll:allreduce.sum", ...): a receiver running
            a different op on this pair raises instead of misreading.
        status: ``STATUS_OK`` or ``STATUS_ERROR``.
        metas: one ``TensorMeta`` per device tensor, in placeholder order.
        skeleton: pickled value with placeholders; None when the value is ``tensors[0]``.
        error: the ``ErrorValue`` when ``status`` is error.
        ext: transport fields (CUDA IPC: slot, offsets, buffer generation).
    """

    tag: str
    status: str
    metas: tuple[TensorMeta, ...]
    skeleton: bytes | None
    error: ErrorValue | None = None
    ext: Any = None


def is_cuda_tensor(obj: Any) -> bool:
    """True for a torch tensor on a CUDA device (the default "device tensor" test)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor) and obj.is_cuda


def cpu_stand_in(obj: Any) -> bool:
    """True for any torch tensor: CPU tests let CPU tensors play the device tensors."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def dtype_name(t: Any) -> str:
    """``"float16"`` for a float16 torch tensor (the wire name of its dtype)."""
    return str(t.dtype).removeprefix("torch.")


def torch_dtype(name: str) -> Any:
    """The torch dtype for a wire name (``"float16"`` or ``"torch.float16"``).

    Example:
        >>> torch_dtype("torch.int64")
        torch.int64

    Raises:
        ValueError: not a torch dtype name (the name came from a peer or a plan).
    """
    import torch

    dt = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r}")
    return dt


def tensor_meta(t: Any) -> TensorMeta:
    """``TensorMeta`` of torch tensor ``t`` (its bytes if it were contiguous)."""
    return TensorMeta(tuple(t.shape), dtype_name(t), t.numel() * t.element_size())


def static_meta(shape: Sequence[int], dtype: str) -> TensorMeta:
    """``TensorMeta`` of a declared static tensor (a plan's ``Channel.spec``).

    Raises:
        ValueError: unknown dtype or a negative dimension.
    """
    import torch

    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"static shape {dims} has a negative dimension")
    dt = torch_dtype(dtype)
    size = torch.empty((), dtype=dt).element_size()
    return TensorMeta(dims, dtype_name(torch.empty((), dtype=dt)), math.prod(dims) * size)


def as_bytes(t: Any) -> Any:
    """A flat ``uint8`` view of torch tensor ``t`` (which must be contiguous).

    Raises:
        ValueError: ``t`` is not contiguous (make it contiguous on the comm stream first).
    """
    if not t.is_contiguous():
        raise ValueError("as_bytes needs a contiguous tensor")
    return t.reshape(-1).view(sys.modules["torch"].uint8)


class _Splitter(pickle.Pickler):
    def __init__(self, file: Any, is_device: Callable[[Any], bool]) -> None:
        super().__init__(file, protocol=5)
        self.tensors: list[Any] = []
        self._seen: dict[int, int] = {}
        self._is_device = is_device

    def persistent_id(self, obj: Any) -> Any:
        if not self._is_device(obj):
            return None
        idx = self._seen.get(id(obj))
        if idx is None:  # the same tensor twice in one value moves once
            idx = self._seen[id(obj)] = len(self.tensors)
            self.tensors.append(obj)
        return idx


class _Rebuilder(pickle.Unpickler):
    def __init__(self, file: Any, tensors: Sequence[Any]) -> None:
        super().__init__(file)
        self._tensors = tensors

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is not int or not 0 <= pid < len(self._tensors):
            raise pickle.UnpicklingError(f"bad tensor placeholder {pid!r} in a header")
        return self._tensors[pid]


def split_value(value: Any, is_device: Callable[[Any], bool] | None = None
                ) -> tuple[bytes | None, list[Any]]:
    """Split ``value`` into (skeleton, device tensors in placeholder order).

    ``skeleton`` is None when ``value`` itself is one device tensor (no pickling at all).

    Example:
        >>> import torch
        >>> sk, ts = split_value([torch.ones(2), "a"], is_device=cpu_stand_in)
        >>> len(ts), rebuild_value(sk, ts)[1]
        (1, 'a')

    Raises:
        pickle.PicklingError, TypeError: something in ``value`` cannot be pickled.
    """
    is_device = is_device or is_cuda_tensor
    if is_device(value):
        return None, [value]
    bio = io.BytesIO()
    p = _Splitter(bio, is_device)
    p.dump(value)
    return bio.getvalue(), p.tensors


def rebuild_value(skeleton: bytes | None, tensors: Sequence[Any]) -> Any:
    """Inverse of ``split_value``: the value with ``tensors`` put back in place.

    Raises:
        pickle.UnpicklingError: the skeleton names a placeholder that ``tensors`` lacks.
    """
    if skeleton is None:
        if len(tensors) != 1:
            raise pickle.UnpicklingError(f"a bare-tensor header with {len(tensors)} tensors")
        return tensors[0]
    return _Rebuilder(io.BytesIO(skeleton), tensors).load()


def make_header(value: Any, tag: str = "p2p", is_device: Callable[[Any], bool] | None = None,
                ext: Any = None) -> tuple[Header, list[Any]]:
    """The header and device tensors for ``value`` (an ``ErrorValue`` gives an error header).

    The tensors are returned as given (possibly non-contiguous or with ``requires_grad``);
    the transport makes byte views of them on its comm stream.

    Raises:
        pickle.PicklingError, TypeError: ``value`` cannot be pickled.
    """
    if type(value) is ErrorValue:
        return error_header(value, tag, ext), []
    skeleton, tensors = split_value(value, is_device)
    return Header(tag, STATUS_OK, tuple(tensor_meta(t) for t in tensors), skeleton, None,
                  ext), tensors


def error_header(err: ErrorValue, tag: str = "p2p", ext: Any = None) -> Header:
    """A header that carries ``err`` in place of a value (no tensor follows)."""
    return Header(tag, STATUS_ERROR, (), None, err, ext)


def open_header(header: Header, tensors: Sequence[Any]) -> Any:
    """The value a header describes, given its received tensors (an error header: the
    ``ErrorValue``)."""
    if header.status == STATUS_ERROR:
        return header.error
    return rebuild_value(header.skeleton, tensors)
