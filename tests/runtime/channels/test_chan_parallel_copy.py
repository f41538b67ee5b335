"""Large copies split across threads land byte-exact, at any offset."""

from __future__ import annotations

import numpy as np
import pytest

from cgc.runtime.channels import parallel_copy


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("nbytes", [1000, (8 << 20) + 17])
def test_copy_into_is_exact(monkeypatch, threads, nbytes):
    monkeypatch.setattr(parallel_copy, "_THREADS", threads)
    src = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    dst = bytearray(nbytes + 200)
    parallel_copy.copy_into(memoryview(dst), 64, memoryview(src), nbytes)
    assert bytes(dst[64:64 + nbytes]) == src.tobytes()
    assert dst[:64] == bytearray(64) and dst[64 + nbytes:] == bytearray(136)
