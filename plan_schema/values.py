"""Typed constant values: Python objects <-> ``pb.Value``.

Encodable: None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays and scalars,
torch tensors (stored as CPU bytes with their device noted). Anything else is refused with
``ValueEncodeError`` unless the caller allows pickling, which marks the plan as needing trust.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import EXIT_INVALID_INPUT, CgcError

__all__ = ["ValueEncodeError", "encode_value", "decode_value", "value_to_text", "DTYPE_BYTES"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class ValueEncodeError(CgcError):
    """A constant cannot be stored as a typed value; ``path`` says where inside it."""

    exit_code = EXIT_INVALID_INPUT

    def __init__(self, message: str, path: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.problem = problem or message  # the message without its how-to-fix hint


def encode_value(
    obj: Any, *, allow_pickle: bool = False, path: str = "value"
) -> tuple[pb.Value, bool]:
    """Encode ``obj``; return ``(value, used_pickle)``.

    Example: ``encode_value({"lr": 0.1})[0].map_value.entries[0].key.str_value == "lr"``.

    Raises:
        ValueEncodeError: ``obj`` (or something inside it, named by ``path``) has a type
            that cannot be encoded and ``allow_pickle`` is False.
    """
    used = [False]
    value = _encode(obj, allow_pickle, path, used)
    return value, used[0]


def _encode(obj: Any, allow_pickle: bool, path: str, used: list[bool]) -> pb.Value:
    v = pb.Value()
    if obj is None:
        v.null = pb.NULL_VALUE
    elif isinstance(obj, bool):
        v.bool_value = obj
    elif isinstance(obj, int) and type(obj) is int:
        if _INT64_MIN <= obj <= _INT64_MAX:
            v.int_value = obj
        else:
            v.bigint_value = str(obj)
    elif type(obj) is float:
        v.float_value = obj
    elif type(obj) is str:
        v.str_value = obj
    elif type(obj) is bytes:
        v.bytes_value = obj
    elif type(obj) is list:
        v.list_value.SetInParent()  # an empty list must still select the oneof
        v.list_value.items.extend(
            _encode(x, allow_pickle, f"{path}[{i}]", used) for i, x in enumerate(obj)
        )
    elif type(obj) is tuple:
        v.tuple_value.SetInParent()
        v.tuple_value.items.extend(
            _encode(x, allow_pickle, f"{path}[{i}]", used) for i, x in enumerate(obj)
        )
    elif type(obj) is dict:
        v.map_value.SetInParent()
        for k, x in obj.items():
            entry = v.map_value.entries.add()
            entry.key.CopyFrom(_encode(k, allow_pickle, f"{path} key {k!r}", used))
            entry.value.CopyFrom(_encode(x, allow_pickle, f"{path}[{k!r}]", used))
    elif _is_numpy(obj):
        _encode_numpy(obj, v)
    elif _is_torch_tensor(obj):
        _encode_torch(obj, v)
    elif allow_pickle:
        try:
            v.pickled = pickle.dumps(obj, protocol=5)
        except Exception as exc:  # pickling runs arbitrary code: report, don't crash
            raise ValueEncodeError(
                f"{path}: cannot pickle {type(obj).__name__}: {exc}", path
            ) from None
        used[0] = True
    else:
        problem = (
            f"{path}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be stored in a "
            "plan (plans hold None, bool, int, float, str, bytes, list, tuple, dict, numpy "
            "arrays and torch tensors)"
        )
        raise ValueEncodeError(
            f"{problem}; pass it as an input, or allow pickled constants (--allow-pickle / "
            "allow_pickle=True), which makes the plan need trust to load",
            path,
            problem,
        )
    return v


def _is_numpy(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, (np.ndarray, np.generic))


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _encode_numpy(obj: Any, v: pb.Value) -> None:
    import numpy as np

    arr = np.asarray(obj)
    if arr.dtype.hasobject:
        raise ValueEncodeError("numpy arrays of Python objects cannot be stored in a plan")
    t = v.tensor_value
    t.framework = "numpy" if isinstance(obj, np.ndarray) else "numpy-scalar"
    t.dtype = arr.dtype.newbyteorder("<").str if arr.dtype.byteorder == ">" else arr.dtype.str
    t.shape.extend(arr.shape)
    t.data = np.ascontiguousarray(arr).astype(t.dtype, copy=False).tobytes()


def _encode_torch(obj: Any, v: pb.Value) -> None:
    import torch

    t = v.tensor_value
    t.framework = "torch"
    t.dtype = str(obj.dtype).removeprefix("torch.")
    t.shape.extend(obj.shape)
    t.device = obj.device.type
    cpu = obj.detach().to("cpu").contiguous()
    # Go through bytes of a uint8 view so that dtypes numpy lacks (bfloat16) survive.
    t.data = cpu.reshape(-1).view(torch.uint8).numpy().tobytes() if cpu.numel() else b""


def decode_value(v: pb.Value) -> Any:
    """Rebuild the Python object a ``pb.Value`` stands for.

    A pickled value is unpickled, which runs code from the plan: call this only for a
    plan the trust decision allowed (``cgc.plan_schema.trust``). Dumps use
    ``value_to_text``, which never unpickles.

    Example: ``decode_value(encode_value([1, "a"])[0]) == [1, "a"]``.

    Raises:
        ValueError: the value is empty or names an unknown dtype.
    """
    kind = v.WhichOneof("kind")
    if kind == "null":
        return None
    if kind in ("bool_value", "int_value", "float_value", "str_value", "bytes_value"):
        return getattr(v, kind)
    if kind == "bigint_value":
        return int(v.bigint_value)
    if kind == "list_value":
        return [decode_value(x) for x in v.list_value.items]
    if kind == "tuple_value":
        return tuple(decode_value(x) for x in v.tuple_value.items)
    if kind == "map_value":
        return {decode_value(e.key): decode_value(e.value) for e in v.map_value.entries}
    if kind == "tensor_value":
        return _decode_tensor(v.tensor_value)
    if kind == "pickled":
        return pickle.loads(v.pickled)
    raise ValueError("empty value in plan")


def _decode_tensor(t: pb.TensorValue) -> Any:
    import numpy as np

    if t.framework in ("numpy", "numpy-scalar"):
        arr = np.frombuffer(t.data, dtype=np.dtype(t.dtype)).reshape(tuple(t.shape)).copy()
        return arr[()] if t.framework == "numpy-scalar" else arr
    if t.framework == "torch":
        import torch

        dtype = getattr(torch, t.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {t.dtype!r} in plan")
        raw = torch.frombuffer(bytearray(t.data), dtype=torch.uint8) if t.data else None
        out = raw.view(dtype) if raw is not None else torch.empty(0, dtype=dtype)
        return out.reshape(tuple(t.shape))
    raise ValueError(f"unknown tensor framework {t.framework!r} in plan")


def value_to_text(v: pb.Value, limit: int = 60) -> str:
    """Short one-line form of a value for dumps: ``3``, ``'a'``, ``numpy:<f4[4,4]``.

    Built from the protobuf alone: a pickle, at any depth, shows as ``<pickled, N bytes>``
    and is never unpickled (dumps of untrusted plans run nothing). When the text is cut
    to ``limit``, pickles cut off are still counted at its end.

    Example: ``value_to_text(encode_value([1, "a"])[0]) == "[1, 'a']"``.
    """
    parts: list[str] = []
    _text(v, parts, limit + 1)
    text = "".join(parts)
    if len(text) <= limit:
        return text
    cut = text[: limit - 3] + "..."
    hidden = _count_pickles(v) - cut.count("<pickled,")
    return cut + (f" <+{hidden} pickled>" if hidden > 0 else "")


def _text(v: pb.Value, out: list[str], budget: int) -> None:
    """Append the text of ``v`` to ``out``, stopping soon after ``budget`` characters."""
    if sum(map(len, out)) > budget:
        return
    kind = v.WhichOneof("kind")
    if kind in ("list_value", "tuple_value"):
        items = getattr(v, kind).items
        out.append("[" if kind == "list_value" else "(")
        for i, x in enumerate(items):
            if i:
                out.append(", ")
            _text(x, out, budget)
            if sum(map(len, out)) > budget:
                return
        out.append("]" if kind == "list_value" else ("," * (len(items) == 1) + ")"))
    elif kind == "map_value":
        out.append("{")
        for i, e in enumerate(v.map_value.entries):
            if i:
                out.append(", ")
            _text(e.key, out, budget)
            out.append(": ")
            _text(e.value, out, budget)
            if sum(map(len, out)) > budget:
                return
        out.append("}")
    else:
        out.append(_scalar_text(v, kind))


def _scalar_text(v: pb.Value, kind: str | None) -> str:
    if kind == "tensor_value":
        t = v.tensor_value
        return f"{t.framework}:{t.dtype}[{','.join(map(str, t.shape))}]"
    if kind == "pickled":
        return f"<pickled, {len(v.pickled):,} bytes>"
    if kind == "bytes_value" and len(v.bytes_value) > 16:
        return f"<bytes {len(v.bytes_value)} B>"
    if kind == "null":
        return "None"
    if kind == "bigint_value":
        return v.bigint_value[:40] + ("..." if len(v.bigint_value) > 40 else "")
    if kind in ("bool_value", "int_value", "float_value", "str_value", "bytes_value"):
        return repr(getattr(v, kind))
    return "<empty>"


def _count_pickles(v: pb.Value) -> int:
    kind = v.WhichOneof("kind")
    if kind == "pickled":
        return 1
    if kind in ("list_value", "tuple_value"):
        return sum(_count_pickles(x) for x in getattr(v, kind).items)
    if kind == "map_value":
        return sum(_count_pickles(e.key) + _count_pickles(e.value) for e in v.map_value.entries)
    return 0


# Element sizes of the tensor dtypes a plan may declare (``TensorSpec.dtype``, torch's
# names without the ``torch.`` prefix): the compiler sizes slots from them, the frontend
# checks declarations against them.
DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}
