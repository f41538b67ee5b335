"""Fixtures of the workload tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def shipped(ray_cluster):
    """Ray's workers cannot import examples/: ship the Hugging Face stages and tinygpt by
    value (imported here, not at collection: they need transformers)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import hf_stages
    import ray
    import tinygpt

    for m in (tinygpt, hf_stages):
        ray.cloudpickle.register_pickle_by_value(m)
    yield
    for m in (tinygpt, hf_stages):
        ray.cloudpickle.unregister_pickle_by_value(m)
