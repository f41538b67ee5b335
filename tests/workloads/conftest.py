"""Fixtures of the workload tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def shipped(ray_cluster):
    """Ray's workers cannot import examples/: ship tinygpt by value (the Hugging Face stages
    are cgc.hf, which they import)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import ray
    import tinygpt

    ray.cloudpickle.register_pickle_by_value(tinygpt)
    yield
    ray.cloudpickle.unregister_pickle_by_value(tinygpt)
