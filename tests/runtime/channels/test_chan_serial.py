"""The serializer's shortcut for bare arrays writes exactly what the pickler writes.

``Serializer.dumps`` keeps the pickle bytes of a bare C-contiguous array per (dtype,
shape): those bytes never depend on the contents (the one buffer travels out of band).
So a second array of the same kind must give the same bytes as a fresh pickler, and
its own buffer; kinds the shortcut does not cover (structured, object, Fortran order,
subclasses) still go through the pickler.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from cgc.runtime.channels.serial import Serializer, loads


def _fresh(value):
    return Serializer().dumps(value)


@pytest.mark.parametrize("make", [
    lambda i: np.full(1000, i, np.float32),
    lambda i: np.arange(12, dtype=">i8").reshape(3, 4) * i,
    lambda i: np.array(i, np.int16),  # 0-d
    lambda i: np.zeros((2, 0, 3), np.float64),
    lambda i: np.arange(6).astype("datetime64[ns]") + i,
])
def test_repeated_bare_array_matches_a_fresh_pickler(make):
    ser = Serializer()
    for i in range(3):
        x = make(i)
        data, raws = ser.dumps(x)
        want, want_raws = _fresh(x)
        assert data == want
        assert [bytes(r) for r in raws] == [bytes(r) for r in want_raws]
        got = loads(data, [bytearray(r) for r in raws])
        assert got.dtype == x.dtype and got.shape == x.shape and np.array_equal(got, x)


@pytest.mark.parametrize("x", [
    np.zeros(4, dtype=[("a", "<i4"), ("b", "<f4")]),  # structured
    np.array([1, "a", None], dtype=object),
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    np.arange(12.0)[::2],  # not contiguous
    np.ma.masked_array([1.0, 2.0]),  # a subclass
])
def test_other_arrays_still_go_through_the_pickler(x):
    ser = Serializer()
    for _ in range(2):
        data, raws = ser.dumps(x)
        got = loads(data, [bytearray(r) for r in raws])
        assert type(got) is type(x) and got.dtype == x.dtype and got.shape == x.shape
        assert np.array_equal(np.asarray(got), np.asarray(x))
    assert not ser._array_memo


def test_structured_dtype_never_takes_a_plain_void_entry():
    ser = Serializer()
    ser.dumps(np.zeros(4, "V8"))  # plain void: kept under ("|V8", (4,))
    s = np.zeros(4, dtype=[("a", "<i4"), ("b", "<f4")])
    assert s.dtype.str == "|V8"
    data, raws = ser.dumps(s)
    assert loads(data, [bytearray(r) for r in raws]).dtype == s.dtype


@pytest.mark.parametrize("readonly", [False, True])
def test_remembered_bare_array_loads_as_the_unpickler_would(readonly):
    ser = Serializer()
    for i in range(3):  # first: unpickled and learnt; then: rebuilt from the memo
        x = np.full((3, 4), i, np.float64)
        x.flags.writeable = not readonly
        data, raws = ser.dumps(x)
        want = pickle.loads(data, buffers=[bytearray(r) for r in raws])
        got = loads(data, [bytearray(r) for r in raws])
        assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, x) and not got.flags.writeable
        # A read-only buffer stays read-only, as with the unpickler's READONLY_BUFFER.
        assert memoryview(got.base).readonly == memoryview(want.base).readonly


def test_other_pickles_with_one_buffer_are_not_shortcut():
    ser = Serializer()
    for i in range(3):
        v = {"a": np.full(8, i, np.int32)}
        data, raws = ser.dumps(v)
        got = loads(data, [bytearray(r) for r in raws])
        assert type(got) is dict and np.array_equal(got["a"], v["a"])


def test_learning_allocates_nothing_and_skips_what_it_cannot_check():
    # A writable array's pickle arriving with a read-only buffer (bytes): the writable
    # form cannot be rebuilt over that buffer without a copy, so it is never shortcut.
    ser = Serializer()
    for i in range(3):
        x = np.full(7, i, np.int8)
        data, raws = ser.dumps(x)
        got = loads(data, [bytes(raws[0])])
        assert np.array_equal(got, x) and not got.flags.writeable
