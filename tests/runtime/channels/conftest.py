"""Channel test fixtures: a unique name prefix per test, and a /dev/shm leak check."""

from __future__ import annotations

import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # child processes import chan_children


@pytest.fixture
def prefix():
    """A unique segment-name prefix; the test fails if anything is left under it."""
    from cgc.runtime.channels import cleanup_segments, list_segments

    p = f"cgc-test-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    yield p
    left = list_segments(p)
    cleanup_segments(p)
    assert left == [], f"leaked segments: {left}"
