"""The frontend's handle on Ray's internals: the one registry, ``cgc.runtime.ray_internals``
(re-exported here under the names the frontend and the drop-in have always used), plus
``is_ray_dag_object``, which reads only a type's public ``__module__``.

The registry lives in the runtime because every cgc package may import the runtime and
the runtime may import no compiler package: its table (``PRIVATE_API``) lists every use
of Ray's internals by the frontend, the runtime and the drop-in, with the accessor the
rest of cgc calls; nothing else in cgc touches them (``tests/runtime/test_ray_internals.py``
scans every package).

Importing this module does not import Ray.

Example::

    from cgc.frontend import ray_private as rp
    rp.require()                      # before a Ray DAG is converted
    args = rp.bound_args(node)        # Ray's DAGNode._bound_args
"""

from __future__ import annotations

from typing import Any

from cgc.runtime import ray_internals as _registry
from cgc.runtime.ray_internals import *  # noqa: F403 - the registry's names, re-exported

__all__ = [*_registry.__all__, "is_ray_dag_object"]


def is_ray_dag_object(value: Any) -> bool:
    """True for Ray DAG nodes (``ray.dag`` types), without importing Ray.

    >>> is_ray_dag_object(3)
    False

    Raises:
        Nothing.
    """
    return type(value).__module__.startswith("ray.dag")
