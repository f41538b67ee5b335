"""Typed constant values: Python objects <-> ``pb.Value``.

Encodable: None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays and scalars,
torch tensors (stored as CPU bytes with their device noted). Anything else is refused with
``ValueEncodeError`` unless the caller allows pickling, which marks the plan as needing trust.
"""

from __future__ import annotations

import pickle
import re
import sys
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import LIMITS
from cgc.plan_schema.errors import EXIT_INVALID_INPUT, CgcError, PlanFormatError

__all__ = ["ValueEncodeError", "ValueDecodeError", "encode_value", "decode_value",
           "value_to_text", "DTYPE_BYTES", "TORCH_DTYPE_BYTES", "numpy_itemsize",
           "MAX_DEPTH"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# Nesting of list/tuple/dict values a plan may hold (``Limits.value_depth``): protobuf
# refuses to parse a plan whose values nest much deeper (about 48 levels in a call
# argument), so deeper values are refused when encoded, not when the plan is read back.
MAX_DEPTH = LIMITS.value_depth


class ValueEncodeError(CgcError):
    """A constant cannot be stored as a typed value; ``path`` says where inside it."""

    exit_code = EXIT_INVALID_INPUT

    def __init__(self, message: str, path: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.problem = problem or message  # the message without its how-to-fix hint


class ValueDecodeError(PlanFormatError):
    """A plan's value cannot be turned back into a Python object (exit code 4); ``path``
    names the value (``example_args[0]``, ``actor w0 ctor_args[1]``) and where inside it.

    The structure check (``cgc.plan_schema.verify``) refuses such values before anything
    runs; this is what decoding raises for a plan that was never checked.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


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
    value = _encode(obj, allow_pickle, path, used, 0)
    return value, used[0]


def _encode(obj: Any, allow_pickle: bool, path: str, used: list[bool], depth: int) -> pb.Value:
    v = pb.Value()
    if depth >= MAX_DEPTH and type(obj) in (list, tuple, dict):
        raise ValueEncodeError(
            f"{path}: nested more than {MAX_DEPTH} levels deep (lists, tuples and dicts "
            "inside each other); a plan cannot hold it", path)
    d = depth + 1
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
            _encode(x, allow_pickle, f"{path}[{i}]", used, d) for i, x in enumerate(obj)
        )
    elif type(obj) is tuple:
        v.tuple_value.SetInParent()
        v.tuple_value.items.extend(
            _encode(x, allow_pickle, f"{path}[{i}]", used, d) for i, x in enumerate(obj)
        )
    elif type(obj) is dict:
        v.map_value.SetInParent()
        for k, x in obj.items():
            entry = v.map_value.entries.add()
            entry.key.CopyFrom(_encode(k, allow_pickle, f"{path} key {k!r}", used, d))
            entry.value.CopyFrom(_encode(x, allow_pickle, f"{path}[{k!r}]", used, d))
    elif _is_numpy(obj):
        _encode_numpy(obj, v, path)
    elif _is_torch_tensor(obj):
        _encode_torch(obj, v, path)
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


def _encode_numpy(obj: Any, v: pb.Value, path: str) -> None:
    import numpy as np

    arr = np.asarray(obj)
    if arr.dtype.hasobject:
        raise ValueEncodeError(f"{path}: numpy arrays of Python objects cannot be stored in "
                               "a plan", path)
    t = v.tensor_value
    t.framework = "numpy" if isinstance(obj, np.ndarray) else "numpy-scalar"
    t.dtype = arr.dtype.newbyteorder("<").str if arr.dtype.byteorder == ">" else arr.dtype.str
    if numpy_itemsize(t.dtype) is None:
        raise ValueEncodeError(f"{path}: numpy dtype {arr.dtype} ({t.dtype!r}) cannot be "
                               "stored in a plan", path)
    t.shape.extend(arr.shape)
    t.data = np.ascontiguousarray(arr).astype(t.dtype, copy=False).tobytes()


def _encode_torch(obj: Any, v: pb.Value, path: str) -> None:
    import torch

    t = v.tensor_value
    t.framework = "torch"
    t.dtype = str(obj.dtype).removeprefix("torch.")
    if t.dtype not in TORCH_DTYPE_BYTES:
        raise ValueEncodeError(f"{path}: torch dtype {obj.dtype} cannot be stored in a plan "
                               f"(known: {', '.join(sorted(TORCH_DTYPE_BYTES))})", path)
    t.shape.extend(obj.shape)
    t.device = obj.device.type
    cpu = obj.detach().to("cpu").contiguous()
    # Go through bytes of a uint8 view so that dtypes numpy lacks (bfloat16) survive.
    t.data = cpu.reshape(-1).view(torch.uint8).numpy().tobytes() if cpu.numel() else b""


def decode_value(v: pb.Value, path: str = "value") -> Any:
    """Rebuild the Python object a ``pb.Value`` stands for.

    A pickled value is unpickled, which runs code from the plan: call this only for a
    plan the trust decision allowed (``cgc.plan_schema.trust``). Dumps use
    ``value_to_text``, which never unpickles. ``path`` names the value in messages.

    Example: ``decode_value(encode_value([1, "a"])[0]) == [1, "a"]``.

    Raises:
        ValueDecodeError: the value (or something inside it, named by its path) is empty,
            names an unknown dtype, has a shape its data does not fill, a dict key that
            cannot be one, an int of too many digits, or a pickle that fails to load.
    """
    try:
        return _decode(v, path)
    except ValueDecodeError:
        raise
    except RecursionError:
        raise ValueDecodeError(f"{path}: nested too deep to decode", path) from None
    except Exception as exc:  # noqa: BLE001 - a malformed value, whatever it trips over
        raise ValueDecodeError(
            f"{path}: cannot be decoded: {type(exc).__name__}: {exc}", path) from None


def _decode(v: pb.Value, path: str) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "null":
        return None
    if kind in ("bool_value", "int_value", "float_value", "str_value", "bytes_value"):
        return getattr(v, kind)
    if kind == "bigint_value":
        if not _BIGINT.fullmatch(v.bigint_value):
            raise ValueDecodeError(f"{path}: bigint_value {v.bigint_value[:20]!r} is not a "
                                   "decimal integer", path)
        return int(v.bigint_value)
    if kind == "list_value":
        return [_decode(x, f"{path}[{i}]") for i, x in enumerate(v.list_value.items)]
    if kind == "tuple_value":
        return tuple(_decode(x, f"{path}[{i}]") for i, x in enumerate(v.tuple_value.items))
    if kind == "map_value":
        out = {}
        for i, e in enumerate(v.map_value.entries):
            key = _decode(e.key, f"{path} key {i}")
            value = _decode(e.value, f"{path}[{i}]")
            try:
                out[key] = value
            except TypeError:
                raise ValueDecodeError(f"{path}: key {i} is a {type(key).__name__}, which "
                                       "cannot be a dict key", path) from None
        return out
    if kind == "tensor_value":
        return _decode_tensor(v.tensor_value, path)
    if kind == "pickled":
        return pickle.loads(v.pickled)
    raise ValueDecodeError(f"{path}: an empty value (no kind set)", path)


# ``bigint_value``'s form: what ``str(int)`` writes.
_BIGINT = re.compile(r"-?[0-9]+")

# numpy dtype strings a plan may hold (``dtype.str`` as ``encode_value`` writes it):
# byte order, kind, item size and, for datetimes, the unit. Object arrays never.
_NUMPY_DTYPE = re.compile(
    r"(?P<order>[<>|=])(?:"
    r"(?P<kind>b)(?P<b>1)|(?P<kind2>[iu])(?P<iu>1|2|4|8)|(?P<kind3>f)(?P<f>2|4|8)"
    r"|(?P<kind4>c)(?P<c>8|16)|(?P<kind5>[SUV])(?P<n>[1-9][0-9]{0,8})"
    r"|(?P<kind6>[Mm])8(?:\[(?:[1-9][0-9]{0,3})?(?:Y|M|W|D|h|m|s|ms|us|ns|ps|fs|as)\])?)"
)


def numpy_itemsize(dtype: str) -> int | None:
    """Bytes per item of a numpy dtype string a plan may hold, or None when it may not.

    Example:
        >>> numpy_itemsize("<f4"), numpy_itemsize("<U3"), numpy_itemsize("|O")
        (4, 12, None)
    """
    m = _NUMPY_DTYPE.fullmatch(dtype)
    if m is None:
        return None
    if m["kind5"]:
        return int(m["n"]) * (4 if m["kind5"] == "U" else 1)
    if m["kind6"]:
        return 8
    return int(m["b"] or m["iu"] or m["f"] or m["c"])


# torch dtypes a plan may hold (names as ``str(dtype)`` without ``torch.``), with their
# item sizes: the ones a tensor can be rebuilt as from raw bytes.
TORCH_DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1,
    "bool": 1, "complex64": 8, "complex128": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def _decode_tensor(t: pb.TensorValue, path: str) -> Any:
    import numpy as np

    if t.framework in ("numpy", "numpy-scalar"):
        if numpy_itemsize(t.dtype) is None:
            raise ValueDecodeError(f"{path}: numpy dtype {t.dtype!r} cannot be stored in a "
                                   "plan", path)
        arr = np.frombuffer(t.data, dtype=np.dtype(t.dtype)).reshape(tuple(t.shape)).copy()
        return arr[()] if t.framework == "numpy-scalar" else arr
    if t.framework == "torch":
        import torch

        dtype = getattr(torch, t.dtype, None) if t.dtype in TORCH_DTYPE_BYTES else None
        if not isinstance(dtype, torch.dtype):
            raise ValueDecodeError(f"{path}: unknown torch dtype {t.dtype!r}", path)
        raw = torch.frombuffer(bytearray(t.data), dtype=torch.uint8) if t.data else None
        out = raw.view(dtype) if raw is not None else torch.empty(0, dtype=dtype)
        return out.reshape(tuple(t.shape))
    raise ValueDecodeError(f"{path}: unknown tensor framework {t.framework!r}", path)


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
