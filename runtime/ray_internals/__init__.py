"""Every use of Ray's internals by any cgc package, in one place.

Ray's DAG objects keep what the frontend's adapter needs (bound arguments, an actor's chain
of calls, type hints, a live handle's actor id) in private attributes; the runtime runs its
set-up and watch calls in actors through Ray's ``__ray_call__`` and hooks ``ray.shutdown()``
through Ray's registry of compiled graphs; the Ray drop-in (``cgc.ray_compat``) subclasses
Ray's ref types. None of this is Ray's public API, so it may change in any Ray release.
The rest of cgc (frontend, runtime, drop-in) touches Ray's internals only through the
accessors here, and ``PRIVATE_API`` lists every use: the internal's dotted name, why cgc
uses it, and the accessor the rest of cgc calls (``tests/runtime/test_ray_internals.py``
scans every package for a use elsewhere).

===========  ==========================================================================
use          meaning
===========  ==========================================================================
``READ``     an attribute read on Ray's objects (checked on sample objects)
``IMPORT``   a private module, class, function or constant that cgc imports or calls
``PATCH``    a function replaced while ``record_ray_bind_sites()`` is active
``WRITE``    an attribute cgc sets on Ray objects it builds itself (checked against the
             names the class's ``__init__`` sets)
``MARK``     a dunder Ray sets on user classes and methods (read with a default, since
             cgc's and plain classes lack it; checked by behaviour in the tests)
``NAME``     a name Ray itself gives meaning to (a concurrency group, a keyword it adds):
             checked against the source of the module that uses it
===========  ==========================================================================

Written for Ray ``WRITTEN_FOR``. ``check_version()`` warns once when the installed Ray is
another release. A missing internal is a ``RayVersionError`` naming the installed Ray and
the internal, never a bare ``AttributeError`` (``require()``, called before a Ray DAG is
converted, checks the module-level entries at once); where a missing internal only costs a
feature (the ``ray.shutdown()`` hook), the accessor returns None and warns once instead.
``check_private_api()`` checks every entry, instance attributes on sample objects included.

Importing this module does not import Ray.

Example::

    reg = compiled_dag_registry()
    if reg is not None:
        reg["cgc-session"] = hook      # a weak reference: keep ``hook`` alive yourself
"""

from __future__ import annotations

# One registry, one import name; its parts are split by what they hold: the table
# (``table``), checking Ray against it (``check``), actors and the runtime's hooks
# (``actors``), Ray's DAG nodes (``dag``).
from cgc.runtime.ray_internals.actor_access import (
    MethodCall,
    RefFields,
    call_in_actor,
    compiled_dag_registry,
    declared_num_returns,
    declared_tensor_transport,
    enables_tensor_transport,
    executable_task_record,
    handle_class,
    handle_id,
    init_ref,
    method_call,
    note_fetched,
    original_class,
    ref_fields,
    remote_class,
)
from cgc.runtime.ray_internals.check import (
    check_private_api,
    check_version,
    installed_version,
    mismatch,
    missing_internals,
    patch_original,
    require,
    version_problem,
)
from cgc.runtime.ray_internals.dag import (
    RayCollective,
    RayTypeHint,
    actor_body,
    attribute_source,
    bound_args,
    bound_kwargs,
    bound_options,
    call_chain,
    collective_kind,
    collective_of,
    downstream,
    input_attributes,
    live_bind_index,
    method_name,
    nested_flag,
    new_collective_member,
    new_collective_operation,
    new_output_placeholder,
    other_args,
    output_of,
    parent_actor,
    reduce_op,
    scan_nodes,
    type_hint,
    unbound_call,
    upstream,
)
from cgc.runtime.ray_internals.table import (
    PATCH_ACTOR_REMOTE,
    PATCH_CLASS_METHOD_BIND,
    PATCH_COLLECTIVE_BIND,
    PATCH_METHOD_REMOTE,
    PATCH_NODE_INIT,
    PATCH_TASK_REMOTE,
    PATCH_TENSOR_TRANSPORT,
    PRIVATE_API,
    SYSTEM_GROUP,
    TRACE_CTX_KWARG,
    WRITTEN_FOR,
    PatchTarget,
    RayInternal,
    RayVersionWarning,
    Use,
)

__all__ = [
    "WRITTEN_FOR",
    "Use",
    "RayInternal",
    "PRIVATE_API",
    "RayVersionWarning",
    "PatchTarget",
    "PATCH_NODE_INIT",
    "PATCH_TENSOR_TRANSPORT",
    "PATCH_CLASS_METHOD_BIND",
    "PATCH_COLLECTIVE_BIND",
    "PATCH_METHOD_REMOTE",
    "PATCH_ACTOR_REMOTE",
    "PATCH_TASK_REMOTE",
    "MethodCall",
    "method_call",
    "TRACE_CTX_KWARG",
    "SYSTEM_GROUP",
    "RayTypeHint",
    "RayCollective",
    "RefFields",
    "installed_version",
    "version_problem",
    "check_version",
    "require",
    "check_private_api",
    "missing_internals",
    "mismatch",
    "compiled_dag_registry",
    "executable_task_record",
    "call_in_actor",
    "handle_id",
    "remote_class",
    "init_ref",
    "note_fetched",
    "ref_fields",
    "scan_nodes",
    "bound_args",
    "bound_kwargs",
    "other_args",
    "downstream",
    "upstream",
    "nested_flag",
    "bound_options",
    "input_attributes",
    "attribute_source",
    "parent_actor",
    "method_name",
    "output_of",
    "live_bind_index",
    "actor_body",
    "call_chain",
    "original_class",
    "declared_num_returns",
    "declared_tensor_transport",
    "enables_tensor_transport",
    "handle_class",
    "type_hint",
    "collective_kind",
    "reduce_op",
    "collective_of",
    "unbound_call",
    "new_output_placeholder",
    "new_collective_operation",
    "new_collective_member",
    "patch_original",
]

# The Ray release (major.minor) whose internals this module was written against.
