"""Typed constants: what round-trips, what is refused, and the opt-in to pickling."""

from __future__ import annotations

import fractions

import numpy as np
import pytest
import torch

from cgc.plan_schema.values import ValueEncodeError, decode_value, encode_value, value_to_text


@pytest.mark.parametrize(
    "obj",
    [None, True, 0, -5, 2**70, 1.5, "héllo", b"\x00\x01", [1, [2, "x"]], (1, 2), {"a": 1, 2: [None]}, {}, [], ()],
)
def test_plain_values_round_trip(obj):
    value, pickled = encode_value(obj)
    assert not pickled
    back = decode_value(value)
    assert back == obj and type(back) is type(obj)


def test_numpy_round_trip():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    back = decode_value(encode_value(arr)[0])
    assert back.dtype == arr.dtype and back.shape == arr.shape and np.array_equal(back, arr)
    scalar = decode_value(encode_value(np.int16(7))[0])
    assert scalar == 7 and scalar.dtype == np.int16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_torch_round_trip(dtype):
    t = (torch.arange(6) % 2).to(dtype).reshape(2, 3)
    back = decode_value(encode_value(t)[0])
    assert isinstance(back, torch.Tensor) and back.dtype == dtype and torch.equal(back, t)


def test_unencodable_is_refused_with_its_path():
    with pytest.raises(ValueEncodeError, match=r"cfg\['ratio'\].*Fraction.*allow pickled"):
        encode_value({"ratio": fractions.Fraction(1, 3)}, path="cfg")


def test_pickle_opt_in_marks_the_value():
    value, pickled = encode_value([fractions.Fraction(1, 3)], allow_pickle=True)
    assert pickled
    assert decode_value(value) == [fractions.Fraction(1, 3)]


def test_encoding_is_deterministic():
    obj = {"b": np.ones(3), "a": [1.0, "x"]}
    assert encode_value(obj)[0].SerializeToString(deterministic=True) == encode_value(obj)[
        0
    ].SerializeToString(deterministic=True)


def test_value_text_is_short():
    assert value_to_text(encode_value(np.zeros((2, 3), np.float32))[0]) == "numpy:<f4[2,3]"
    assert value_to_text(encode_value("x" * 100)[0]).endswith("...")


def test_value_text_never_unpickles(tmp_path):
    import pickle

    marker = tmp_path / "ran"

    class Boom:
        def __reduce__(self):
            return (eval, (f"__import__('pathlib').Path({str(marker)!r}).touch()",))

    raw = pickle.dumps(Boom())
    value = encode_value([1, {"k": (2, [3])}])[0]
    inner = value.list_value.items[1].map_value.entries[0].value.tuple_value.items[1]
    inner.list_value.items.add(pickled=raw)
    n = len(raw)
    assert value_to_text(value, 200) == f"[1, {{'k': (2, [3, <pickled, {n} bytes>])}}]"
    assert value_to_text(value, 12) == "[1, {'k':... <+1 pickled>"
    assert value_to_text(encode_value((1,))[0]) == "(1,)"
    assert not marker.exists()
