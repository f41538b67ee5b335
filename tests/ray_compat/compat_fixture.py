"""The drop-in installed for a whole test module, with the module's actor classes shipped by
value (Ray's workers cannot import the test folders).

A test module of this folder takes it with ``from compat_fixture import compat  # noqa: F401``
(``compat_actors`` shipped); another module makes its own with
``compat = drop_in_for(some_module)``, e.g. tests/gpu/test_gpu_ray_compat.py.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import compat_actors
import pytest
import ray

import cgc.ray_compat


def drop_in_for(*modules: ModuleType) -> Any:
    """A module-scoped autouse fixture: ``cgc.ray_compat`` installed and ``modules`` shipped
    by value for the module's tests, both undone afterwards. Needs the ``ray_cluster``
    fixture of tests/conftest.py."""

    @pytest.fixture(scope="module", autouse=True)
    def compat(ray_cluster: Any) -> Any:
        for m in modules:
            ray.cloudpickle.register_pickle_by_value(m)
        cgc.ray_compat.install()
        yield
        cgc.ray_compat.uninstall()
        for m in modules:
            ray.cloudpickle.unregister_pickle_by_value(m)

    return compat


compat = drop_in_for(compat_actors)
