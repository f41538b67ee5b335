"""Pickle protocol 5 with out-of-band buffers for numpy arrays and CPU torch tensors.

``Serializer.dumps(value)`` returns the pickle bytes plus a list of raw byte views (the
array/tensor memory, not copied); the channel copies each once into shared memory and
``loads(data, buffers)`` rebuilds arrays *on* the given buffers (zero-copy). numpy arrays
come back read-only (as in Ray); tensors come back as tensors sharing the buffer memory.

Example:
    >>> import numpy as np
    >>> from cgc.runtime.channels.serial import Serializer, loads
    >>> data, bufs = Serializer().dumps({"x": np.arange(4)})
    >>> len(bufs), loads(data, [bytearray(b) for b in bufs])["x"].tolist()
    (1, [0, 1, 2, 3])
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

import numpy as np

__all__ = ["Serializer", "loads"]

# Values of these exact types never hold out-of-band buffers: plain pickle.dumps is fastest.
_PLAIN = frozenset({int, float, bool, type(None), str, bytes, complex})
_ARRAY_MEMO_MAX = 64  # distinct (dtype, shape) pairs of bare arrays whose pickle is kept


def _rebuild_ndarray(buf: Any, dtype: Any, shape: tuple[int, ...], order: str) -> np.ndarray:
    a = np.frombuffer(buf, dtype=dtype)
    if a.shape != shape:
        a = a.reshape(shape, order="F" if order == "F" else "C")
    a.flags.writeable = False  # readers may share the memory: read-only, as Ray does
    return a


def _rebuild_tensor(buf: Any, dtype_name: str, shape: tuple[int, ...]) -> Any:
    import torch

    dtype = getattr(torch, dtype_name)
    if len(memoryview(buf)) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        if t is np.ndarray:
            dt = obj.dtype
            if dt.hasobject or dt.itemsize == 0:
                return NotImplemented
            if obj.flags.c_contiguous:
                order, flat = "C", obj.reshape(-1)
            elif obj.flags.f_contiguous:
                order, flat = "F", obj.T.reshape(-1)
            else:
                order, flat = "C", np.ascontiguousarray(obj).reshape(-1)
            dspec = dt.str if dt.fields is None and dt.subdtype is None else dt
            # Why raw bytes: the buffer protocol rejects some dtypes (datetime64, ...).
            raw = pickle.PickleBuffer(flat.view(np.uint8))
            return _rebuild_ndarray, (raw, dspec, obj.shape, order)
        torch = sys.modules.get("torch")
        if torch is not None and t is torch.Tensor:
            if (obj.requires_grad or obj.device.type != "cpu" or obj.layout != torch.strided
                    or obj.is_quantized or obj.is_conj() or obj.is_neg()):
                return NotImplemented  # torch's own pickling handles (or rejects) these
            flat = obj.contiguous().reshape(-1).view(torch.uint8).numpy()
            return _rebuild_tensor, (pickle.PickleBuffer(flat), str(obj.dtype)[6:],
                                     tuple(obj.shape))
        return NotImplemented


class Serializer:
    """Reusable pickler (one per writer; not thread-safe): no per-call pickler set-up."""

    def __init__(self) -> None:
        self._bio = io.BytesIO()
        self._bufs: list[pickle.PickleBuffer] = []
        self._pickler = _Pickler(self._bio, protocol=5, buffer_callback=self._bufs.append)
        # (dtype str, shape, writeable) -> pickle bytes of a bare C-contiguous array.
        # Why: the bytes do not depend on the array's contents (its one buffer travels out
        # of band), and the pickler's per-call work is ~5-10 us on a 1 MiB hop.
        self._array_memo: dict[tuple[str, tuple[int, ...], bool], bytes] = {}

    def dumps(self, value: Any) -> tuple[bytes, list[memoryview]]:
        """Pickle ``value``; returns (pickle bytes, raw 1-D byte views of out-of-band data).

        Raises:
            pickle.PicklingError, TypeError: the value cannot be pickled.
        """
        t = type(value)
        if t in _PLAIN:
            return pickle.dumps(value, protocol=5), []
        if t is np.ndarray and value.flags.c_contiguous:
            dt = value.dtype
            # Why writeable is in the key: a read-only buffer adds a READONLY_BUFFER opcode.
            key = (dt.str, value.shape, value.flags.writeable)
            data = self._array_memo.get(key)
            if data is not None and dt.fields is None and dt.subdtype is None:
                # The same bytes the pickler made for this key (reducer_override's C case).
                return data, [pickle.PickleBuffer(value.reshape(-1).view(np.uint8)).raw()]
        data, raws = self._dump(value)
        if t is np.ndarray and len(raws) == 1 and value.flags.c_contiguous:
            dt = value.dtype
            if dt.fields is None and dt.subdtype is None and not dt.hasobject and dt.itemsize:
                if len(self._array_memo) >= _ARRAY_MEMO_MAX:
                    self._array_memo.clear()
                self._array_memo[(dt.str, value.shape, value.flags.writeable)] = data
        return data, raws

    def _dump(self, value: Any) -> tuple[bytes, list[memoryview]]:
        bio = self._bio
        bio.seek(0)
        bio.truncate()
        self._bufs.clear()
        try:
            self._pickler.dump(value)
        finally:
            self._pickler.clear_memo()
        raws = [b.raw() for b in self._bufs]
        self._bufs.clear()
        return bio.getvalue(), raws


# Pickle bytes seen with one buffer -> (dtype str, shape, read-only buffer) when they are
# exactly the bytes ``Serializer`` makes for a bare C-contiguous array of that kind, else None.
_LOADS_MEMO: dict[bytes, tuple[str, tuple[int, ...], bool] | None] = {}
_LOADS_MEMO_MAX = 256
_LOADS_MEMO_BYTES = 512  # a bare array's pickle is ~100-150 bytes


def loads(data: Any, buffers: list[Any]) -> Any:
    """Unpickle ``data`` with out-of-band ``buffers`` (kept, not copied, by arrays).

    A bare array whose pickle bytes were seen before is rebuilt directly (why: the
    unpickler's global look-up and call cost ~5 us per 1 MiB hop); the bytes name the
    same rebuild with the same arguments, so the result is the same.
    """
    if len(buffers) != 1 or len(data) > _LOADS_MEMO_BYTES:
        return pickle.loads(data, buffers=buffers)
    key = bytes(data)
    try:
        known = _LOADS_MEMO[key]  # one look-up: another thread may clear the memo
    except KeyError:
        value = pickle.loads(key, buffers=buffers)
        _learn(key, value, buffers[0])
        return value
    if known is None:
        return pickle.loads(key, buffers=buffers)
    dspec, shape, readonly = known
    # Read-only as the unpickler makes it for a READONLY_BUFFER.
    buf = memoryview(buffers[0]).toreadonly() if readonly else buffers[0]
    return _rebuild_ndarray(buf, dspec, shape, "C")


def _learn(key: bytes, value: Any, buf: Any) -> None:
    """Remember whether ``key`` is the pickle of the bare array ``value`` (exactly the
    bytes a serializer makes for its dtype and shape: then loading ``key`` is that
    rebuild, whatever the buffer). ``buf``: the buffer it was loaded from."""
    kind = None
    if type(value) is np.ndarray and value.flags.c_contiguous:
        dt = value.dtype
        if dt.fields is None and dt.subdtype is None and not dt.hasobject and dt.itemsize:
            # The two forms a writer makes, each pickled over ``buf`` itself (it goes out
            # of band: no copy, no allocation): from a read-only array (``value``) and
            # from a writable one (only when ``buf`` is writable; else not learnt).
            if key == Serializer()._dump(value)[0]:
                kind = (dt.str, value.shape, True)
            elif not memoryview(buf).readonly:
                writable = np.ndarray(value.shape, dt, buffer=buf)
                if key == Serializer()._dump(writable)[0]:
                    kind = (dt.str, value.shape, False)
    if len(_LOADS_MEMO) >= _LOADS_MEMO_MAX:
        _LOADS_MEMO.clear()
    _LOADS_MEMO[key] = kind
