"""The drop-in installed for a whole test module, with ``compat_actors`` shipped by value.

A test module takes it with ``from compat_fixture import compat  # noqa: F401``.
"""

from __future__ import annotations

import compat_actors
import pytest
import ray

import cgc.ray_compat


@pytest.fixture(scope="module", autouse=True)
def compat(ray_cluster):
    # Ray's workers cannot import this test folder: ship its classes by value.
    ray.cloudpickle.register_pickle_by_value(compat_actors)
    cgc.ray_compat.install()
    yield
    cgc.ray_compat.uninstall()
    ray.cloudpickle.unregister_pickle_by_value(compat_actors)
