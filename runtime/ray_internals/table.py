"""The table of Ray's internals cgc uses (``PRIVATE_API``), the Ray release it was written
for, and the names and patch targets the accessors share. Imports nothing of Ray."""

from __future__ import annotations

import enum
from dataclasses import dataclass

# The Ray release (major.minor) whose internals this registry was written against.
WRITTEN_FOR = "2.60"

# Ray's tracing wrapper adds this keyword to actor methods; users never pass it.
TRACE_CTX_KWARG = "_ray_trace_ctx"

# Ray's concurrency group for its own calls into an actor (one thread, apart from the
# actor's methods): Ray's compiled graphs wait for their loops there, and so does cgc.
SYSTEM_GROUP = "_ray_system"


class Use(enum.Enum):
    """How cgc touches one of Ray's internals."""

    READ = "read"
    IMPORT = "import"
    PATCH = "patch"
    WRITE = "write"
    MARK = "mark"
    NAME = "name"


@dataclass(frozen=True)
class RayInternal:
    """One internal of Ray that cgc uses: ``module`` then the dotted ``name`` inside it,
    how (``use``), why, and ``accessor``: the function (or constant) of
    ``cgc.runtime.ray_internals`` through which the rest of cgc uses it."""

    module: str
    name: str
    use: Use
    why: str
    accessor: str

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"


_R, _I, _P, _W, _M, _N = Use.READ, Use.IMPORT, Use.PATCH, Use.WRITE, Use.MARK, Use.NAME
_DAG, _CLS, _INP = "ray.dag.dag_node", "ray.dag.class_node", "ray.dag.input_node"
_COLL, _TT = "ray.dag.collective_node", "ray.experimental.channel.torch_tensor_type"
_TYPES, _ACT = "ray.experimental.util.types", "ray.actor"
_CDN, _REF = "ray.dag.compiled_dag_node", "ray.experimental.compiled_dag_ref"
_E = RayInternal

PRIVATE_API: tuple[RayInternal, ...] = (
    # --- the frontend's Ray DAG adapter: reading Ray's DAG nodes
    _E("ray.dag.py_obj_scanner", "_PyObjScanner", _I, "find the nodes among arguments",
       "scan_nodes"),
    _E(_DAG, "DAGNode._bound_args", _R, "a node's positional arguments", "bound_args"),
    _E(_DAG, "DAGNode._bound_kwargs", _R, "a node's keyword arguments", "bound_kwargs"),
    _E(_DAG, "DAGNode._bound_other_args_to_resolve", _R, "links to parent nodes", "other_args"),
    _E(_DAG, "DAGNode._downstream_nodes", _R, "consumers: find dangling calls", "downstream"),
    _E(_DAG, "DAGNode._upstream_nodes", _R, "producers: Ray's checks, in its order",
       "upstream"),
    _E(_DAG, "DAGNode._args_contain_nested_dag_node", _R,
       "Ray's own 'node in a container' flag (the drop-in rejects as Ray does)", "nested_flag"),
    _E(_DAG, "DAGNode._bound_options", _R, "actor options, num_returns", "bound_options"),
    _E(_DAG, "DAGNode._type_hint", _R, "with_tensor_transport hints", "type_hint"),
    _E(_DAG, "DAGNode.__init__", _P, "note where each node is created", "PATCH_NODE_INIT"),
    _E(_DAG, "DAGNode.with_tensor_transport", _P, "note where a hint is given",
       "PATCH_TENSOR_TRANSPORT"),
    _E(_INP, "InputNode.input_attribute_nodes", _R, "inp[k] nodes made so far",
       "input_attributes"),
    _E(_INP, "InputAttributeNode._dag_input_node", _R, "the InputNode of inp[k]",
       "attribute_source"),
    _E(_INP, "InputAttributeNode.key", _R, "k of inp[k]", "attribute_source"),
    _E(_CLS, "ClassNode._body", _R, "the @ray.remote class", "actor_body"),
    _E(_CLS, "ClassNode._last_call", _R, "the actor's chain of binds (bind order)",
       "call_chain"),
    _E(_CLS, "ClassNode._last_call", _W, "extend the chain with collective members",
       "new_collective_member"),
    _E(_CLS, "ClassMethodNode._parent_class_node", _R, "the actor a call runs on",
       "parent_actor"),
    _E(_CLS, "ClassMethodNode._prev_class_method_call", _R, "the chain of binds",
       "call_chain"),
    _E(_CLS, "ClassMethodNode._bind_index", _R, "bind order on a live handle",
       "live_bind_index"),
    _E(_CLS, "ClassMethodNode.is_class_method_output", _R, "a multi-return output",
       "output_of"),
    _E(_CLS, "ClassMethodNode.class_method_call", _R, "the call an output is of", "output_of"),
    _E(_CLS, "ClassMethodNode.output_idx", _R, "which output of the call", "output_of"),
    _E(_CLS, "ClassMethodNode.get_method_name", _R, "the method's name", "method_name"),
    _E(_CLS, "ClassMethodNode", _I, "build multi-return placeholders (ClassNode)",
       "new_output_placeholder"),
    _E(_CLS, "_UnboundClassMethodNode._actor", _R, "the ClassNode of actor.m", "unbound_call"),
    _E(_CLS, "_UnboundClassMethodNode._method_name", _R, "m of actor.m", "unbound_call"),
    _E(_CLS, "_UnboundClassMethodNode._options", _R, "actor.m.options(...)", "unbound_call"),
    _E(_CLS, "_UnboundClassMethodNode.bind", _P, "multi-return on ClassNodes",
       "PATCH_CLASS_METHOD_BIND"),
    _E("ray.dag.function_node", "FunctionNode._body", _R, "name it in the error",
       "actor_body"),
    _E("ray.dag.constants", "IS_CLASS_METHOD_OUTPUT_KEY", _I, "placeholder nodes",
       "new_output_placeholder"),
    _E("ray.dag.constants", "PARENT_CLASS_NODE_KEY", _I, "placeholder, member nodes",
       "new_output_placeholder"),
    _E("ray.dag.constants", "PREV_CLASS_METHOD_CALL_KEY", _I, "collective members",
       "new_collective_member"),
    _E("ray.dag.constants", "COLLECTIVE_OPERATION_KEY", _I, "collective members",
       "new_collective_member"),
    _E(_COLL, "CollectiveOutputNode", _I, "collectives among ClassNode actors",
       "new_collective_member"),
    _E(_COLL, "CollectiveOutputNode._collective_op", _R, "a member's operation",
       "collective_of"),
    _E(_COLL, "_CollectiveOperation", _I, "collectives among ClassNode actors",
       "new_collective_operation"),
    _E(_COLL, "_CollectiveOperation._op", _R, "AllReduceOp / AllGatherOp / ...",
       "collective_of"),
    _E(_COLL, "_CollectiveOperation._op", _W, "collectives among ClassNode actors",
       "new_collective_operation"),
    _E(_COLL, "_CollectiveOperation._type_hint", _R, "the collective's transport",
       "collective_of"),
    _E(_COLL, "_CollectiveOperation._type_hint", _W, "the collective's transport",
       "new_collective_operation"),
    _E(_COLL, "_CollectiveOperation._actor_handles", _W, "its ClassNode actors",
       "new_collective_operation"),
    _E(_COLL, "_CollectiveOperation.actor_handles", _R, "members' rank order",
       "collective_of"),
    _E("ray.experimental.collective.operations", "_bind", _P, "ClassNode members",
       "PATCH_COLLECTIVE_BIND"),
    _E(_TYPES, "AllGatherOp", _I, "the collective's kind", "collective_kind"),
    _E(_TYPES, "AllReduceOp", _I, "the collective's kind", "collective_kind"),
    _E(_TYPES, "ReduceScatterOp", _I, "the collective's kind", "collective_kind"),
    _E(_TYPES, "AllReduceOp.reduceOp", _R, "the reduce op", "reduce_op"),
    _E(_TT, "TorchTensorType", _I, "hint kind; the transport of ClassNode members",
       "type_hint"),
    _E(_TT, "TorchTensorType.ACCELERATOR", _I, "default collective transport",
       "new_collective_operation"),
    _E(_TT, "TorchTensorType.transport", _R, "the hint's transport", "type_hint"),
    _E(_TT, "TorchTensorType._communicator", _R, "a named communicator", "type_hint"),
    _E(_TT, "TorchTensorType._device", _R, "the hint's device", "type_hint"),
    _E(_TT, "TorchTensorType._static_shape", _R, "_static_shape=True", "type_hint"),
    _E(_TT, "TorchTensorType._direct_return", _R, "_direct_return=True", "type_hint"),
    _E("ray.experimental.channel.auto_transport_type", "AutoTransportType", _I,
       "the default hint", "type_hint"),
    _E("ray.util.tracing.tracing_helper", "_ray_trace_ctx", _N, "the keyword Ray's tracing "
       "adds to actor methods: not a user parameter", "TRACE_CTX_KWARG"),
    # --- actor classes and live handles (frontend and runtime)
    _E(_ACT, "ActorClass.__ray_metadata__", _R, "a @ray.remote class's data", "remote_class"),
    _E(_ACT, "_ActorClassMetadata.modified_class", _R, "Ray's class wrapper", "remote_class"),
    _E(_ACT, "__ray_actor_class__", _M, "the user class of the wrapper", "original_class"),
    _E(_ACT, "__ray_num_returns__", _M, "@ray.method(num_returns=k)", "declared_num_returns"),
    _E(_ACT, "ActorHandle._ray_actor_id", _R, "identify a live actor (frontend: a handle "
       "given to compile; runtime: bind a plan's external actor)", "handle_id"),
    _E(_ACT, "ActorHandle.__ray_call__", _R, "run a function inside a live actor: the "
       "frontend asks what it holds, the runtime sets up, watches, stops and asks its "
       "loops", "call_in_actor"),
    _E(_CDN, "_ray_system", _N, "Ray's concurrency group for its own calls: the runtime "
       "waits for each loop there, beside the actor's methods", "call_in_actor"),
    # --- tracing a step of plain actor calls (cgc.frontend.step_tracer)
    _E(_ACT, "ActorMethod._remote", _P, "a traced step: a call becomes a graph node",
       "PATCH_METHOD_REMOTE"),
    _E(_ACT, "ActorClass._remote", _P, "a traced step creates no actor; a model file's "
       "module-level Cls.remote() is a plan actor offline", "PATCH_ACTOR_REMOTE"),
    _E("ray.remote_function", "RemoteFunction._remote", _P, "a traced step calls no task",
       "PATCH_TASK_REMOTE"),
    _E(_ACT, "__ray_tensor_transport__", _M, "@ray.method(tensor_transport=...) on a "
       "model file's class", "declared_tensor_transport"),
    _E(_ACT, "ActorMethod._actor", _R, "the handle a traced call runs on", "method_call"),
    _E(_ACT, "ActorMethod._method_name", _R, "the traced call's method", "method_call"),
    _E(_ACT, "ActorMethod._num_returns", _R, "@ray.method(num_returns=k)", "method_call"),
    _E(_ACT, "ActorMethod._tensor_transport", _R, "@ray.method(tensor_transport=...)",
       "method_call"),
    _E(_ACT, "ActorHandle._ray_enable_tensor_transport", _R, "a traced RDT call plain Ray "
       "would refuse (no enable_tensor_transport): warn", "enables_tensor_transport"),
    _E(_ACT, "ActorHandle._ray_actor_creation_function_descriptor", _R,
       "a live actor's class", "handle_class"),
    _E("ray._raylet", "PythonFunctionDescriptor.module_name", _R, "its module",
       "handle_class"),
    _E("ray._raylet", "PythonFunctionDescriptor.class_name", _R, "its class", "handle_class"),
    # --- the runtime
    _E(_CDN, "_compiled_dags", _I, "ray.shutdown() tears down each entry first: cgc's "
       "session hook (runtime/driver/session.py) is one, for every cgc graph",
       "compiled_dag_registry"),
    _E(_CDN, "_ExecutableTaskRecord", _I, "Ray's per-task profiling record, which a "
       "RAY_CGRAPH_ENABLE_PROFILING user reads off the actor (runtime/actor/ray_events.py)",
       "executable_task_record"),
    # --- the Ray drop-in's ref types (subclasses of Ray's; Ray's __init__ is skipped)
    _E(_REF, "CompiledDAGRef._dag", _W, "Ray's fields, under Ray's names, so the "
       "inherited methods and a reader of Ray's ref see them", "init_ref"),
    _E(_REF, "CompiledDAGRef._execution_index", _W, "as _dag", "init_ref"),
    _E(_REF, "CompiledDAGRef._channel_index", _W, "as _dag", "init_ref"),
    _E(_REF, "CompiledDAGRef._ray_get_called", _W, "as _dag", "note_fetched"),
    _E(_REF, "CompiledDAGFuture._dag", _W, "as CompiledDAGRef._dag", "init_ref"),
    _E(_REF, "CompiledDAGFuture._execution_index", _W, "as _dag", "init_ref"),
    _E(_REF, "CompiledDAGFuture._channel_index", _W, "as _dag", "init_ref"),
    _E(_REF, "CompiledDAGFuture._fut", _W, "as _dag", "init_ref"),
)
del _R, _I, _P, _W, _M, _N, _E


class RayVersionWarning(UserWarning):
    """The installed Ray is not the release cgc's use of Ray's internals was written for."""


@dataclass(frozen=True)
class PatchTarget:
    """A function of Ray replaced while bind sites are recorded: ``module.owner.attr``
    (``owner`` is "" for a module-level function)."""

    module: str
    owner: str
    attr: str


PATCH_NODE_INIT = PatchTarget(_DAG, "DAGNode", "__init__")
PATCH_TENSOR_TRANSPORT = PatchTarget(_DAG, "DAGNode", "with_tensor_transport")
PATCH_CLASS_METHOD_BIND = PatchTarget(_CLS, "_UnboundClassMethodNode", "bind")
PATCH_COLLECTIVE_BIND = PatchTarget("ray.experimental.collective.operations", "", "_bind")
PATCH_METHOD_REMOTE = PatchTarget(_ACT, "ActorMethod", "_remote")
PATCH_ACTOR_REMOTE = PatchTarget(_ACT, "ActorClass", "_remote")
PATCH_TASK_REMOTE = PatchTarget("ray.remote_function", "RemoteFunction", "_remote")


