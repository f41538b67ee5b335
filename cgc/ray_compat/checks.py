"""Ray's own compile-time checks of a DAG, in Ray's order and with Ray 2.60's words, for the
drop-in (cgc's own API keeps cgc's messages, which name the node's ``.bind()`` line).

A Ray program that tests or catches Ray's rejections (``pytest.raises(ValueError,
match=...)``) must see the same exception and text under ``cgc.ray_compat``. So before cgc
compiles a Ray DAG, ``check_ray_dag`` walks it the way Ray's ``experimental_compile`` does
(from the root ``InputNode``, breadth first over consumers and producers: Ray's task order)
and raises what Ray raises. What each check decides, and where the drop-in deliberately
differs, is in docs/ray_compat.md ("What differs"):

==============================================  ========================================
Ray's check                                     drop-in
==============================================  ========================================
compiled twice / two nodes compiled             rejected, Ray's words
no InputNode upstream                           rejected, Ray's words
a node inside a list/tuple/dict/object arg      rejected, Ray's words (as far as Ray's own
                                                flag sees; cgc's check catches the rest)
a remote function; an unknown node type         rejected, Ray's words
``Actor.bind()`` (ClassNode) actors             **accepted** (cgc creates the actor)
a DAG node bound as a keyword argument          rejected, Ray's words
``inp[k]`` with k neither int nor str           rejected, Ray's words
the whole input mixed with ``inp[k]``           rejected, Ray's words
input attributes that reach no output           rejected, Ray's words
leaf nodes (no consumer, not an output)         rejected, Ray's words
a task whose arguments are all constants        rejected, Ray's words
an accelerator hint on the input                rejected, Ray's words
an accelerator edge the driver reads           rejected, Ray's words
an accelerator communicator's actor without     rejected, Ray's words (the actors are asked,
an accelerator (not a CPU communicator)         as Ray asks them)
an accelerator edge whose readers all run on    Ray's ``AssertionError``; readers on the
the writer's actor                              writer's actor beside others are accepted
                                                (local readers, as in Ray 2.60)
``_default_communicator`` / buffer size values  rejected, Ray's words
==============================================  ========================================

Example::

    ray_dag = check_ray_dag(dag)            # raises as Ray would
    ray_dag.inputs.check(args, kwargs)      # execute()'s argument check, Ray's words
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cgc.frontend import ray_private as rp
from cgc.ray_compat.auto_hints import resolve_auto_hints

__all__ = ["RayInputs", "RayDag", "check_ray_dag", "check_compile_args", "accelerator_hint",
           "COMPILED_TWICE"]

COMPILED_TWICE = (
    "It is not allowed to call `experimental_compile` on the same DAG object multiple times "
    "no matter whether `teardown` is called or not. Please reuse the existing compiled DAG "
    "or create a new one.")


@dataclass(frozen=True)
class RayInputs:
    """What ``execute()`` must be called with, as Ray counts it: ``positional`` arguments
    exactly (1 for a DAG that takes the whole input) and every keyword in ``keywords``
    (others are ignored, as in Ray)."""

    positional: int
    keywords: tuple[str, ...]
    whole: bool

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Ray's ``_check_inputs``.

        Raises:
            ValueError: the wrong number of positional arguments, or a keyword missing.
        """
        if len(args) != self.positional:
            raise ValueError(
                "dag.execute() or dag.execute_async() must be called with "
                f"{self.positional} positional args, got {len(args)}")
        for key in self.keywords:
            if key not in kwargs:
                raise ValueError(
                    f"dag.execute() or dag.execute_async() must be called with kwarg `{key}`")


def check_compile_args(buffer_size_bytes: Any, default_communicator: Any) -> None:
    """The argument checks of Ray's ``CompiledDAG`` constructor.

    Raises:
        ValueError: Ray's message for a bad ``_default_communicator`` or buffer size.
    """
    from ray.experimental.channel.communicator import Communicator

    if isinstance(default_communicator, str):
        if default_communicator != "create":
            raise ValueError("The only allowed string for default_communicator is 'create', "
                             f"got {default_communicator}")
    elif default_communicator is not None and not isinstance(default_communicator,
                                                             Communicator):
        raise ValueError("The default_communicator must be None, a string, or a "
                         f"Communicator, got {type(default_communicator)}")
    if not isinstance(buffer_size_bytes, int) or buffer_size_bytes <= 0:
        raise ValueError(
            f"`buffer_size_bytes` must be a positive integer, found {buffer_size_bytes}")


def _find_root(dag: Any) -> Any:
    from ray.dag import InputNode

    node = dag
    while not isinstance(node, InputNode):
        ups = rp.upstream(node)
        if not ups:
            raise ValueError("No InputNode found in the DAG: when traversing upwards, "
                             f"no upstream node was found for {node}.")
        node = ups[0]
    return node


def _nested_error(root: Any, node: Any) -> ValueError:
    from ray.dag import DAGNode

    for arg in rp.bound_args(node):
        if isinstance(arg, DAGNode):
            continue
        found = rp.scan_nodes([arg])
        if found:
            return ValueError(
                f"Found {len(found)} DAGNodes from the arg {arg} in {root}. Please ensure "
                "that the argument is a single DAGNode and that a DAGNode is not allowed "
                "to be placed inside any type of container.")
    return ValueError(f"a DAG node is nested in an argument of {node}")


def _tasks(root: Any) -> list[Any]:
    """Every node connected to ``root``, in Ray's task order (its traversal's checks on
    the way)."""
    order: list[Any] = []
    seen: set[int] = set()
    queue = [root]
    compiled_at = None
    while queue:
        node = queue.pop(0)
        if rp.nested_flag(node):
            raise _nested_error(root, node)
        if id(node) in seen:
            continue
        if getattr(node, "is_cgraph_output_node", False):
            if compiled_at is not None:
                raise ValueError(
                    "The DAG was compiled more than once. The following two nodes call "
                    f"`experimental_compile`: (1) {compiled_at}, (2) {node}")
            compiled_at = node
        seen.add(id(node))
        order.append(node)
        queue.extend(n for n in rp.downstream(node) + rp.upstream(node) if id(n) not in seen)
    return order


def accelerator_hint(node: Any) -> bool:
    """Whether ``node`` carries an accelerator (NCCL or communicator) transport hint."""
    hint = rp.type_hint(node)
    return hint is not None and not hint.auto and (
        hint.transport == "accelerator" or hint.communicator is not None)


def _is_call(node: Any) -> bool:
    from ray.dag import ClassMethodNode

    return isinstance(node, ClassMethodNode) and rp.output_of(node) is None


@dataclass
class _Walk:
    """What Ray's preprocessing learns: consumers by node id, the input signature."""

    consumers: dict[int, list[Any]]
    positional: set[int]
    keywords: set[str]
    direct: bool | None = None


def _no_communicator(node: Any) -> bool:
    """An accelerator transport (p2p hint or collective) without a communicator of its own."""
    from ray.dag import CollectiveOutputNode

    if isinstance(node, CollectiveOutputNode):
        if rp.output_of(node) is not None:  # one bucket's output: its operation is checked
            return False
        return rp.collective_of(node).hint.communicator is None
    hint = rp.type_hint(node)
    return accelerator_hint(node) and hint is not None and hint.communicator is None


def _preprocess(tasks: list[Any], root: Any, default_communicator: Any) -> _Walk:
    from ray.dag import (
        ClassMethodNode,
        ClassNode,
        DAGNode,
        FunctionNode,
        InputAttributeNode,
        InputNode,
        MultiOutputNode,
    )

    walk = _Walk({id(t): [] for t in tasks}, set(), set())
    for node in tasks:
        if isinstance(node, ClassNode):
            continue  # a cgc extension: the actor is created by cgc
        if not isinstance(node, (InputNode, InputAttributeNode, MultiOutputNode,
                                 ClassMethodNode)):
            if isinstance(node, FunctionNode):
                raise NotImplementedError(
                    "Compiled DAGs currently only support actor method nodes")
            raise ValueError(f"Found unsupported node of type {type(node)}")
        if isinstance(node, (InputNode, InputAttributeNode)) and accelerator_hint(node):
            raise ValueError("DAG inputs cannot be transferred via accelerator because the "
                             "driver cannot participate in the communicator group")
        if default_communicator is None and _is_call(node) and _no_communicator(node):
            raise ValueError(
                f"DAGNode {node} has no custom communicator specified. Please specify a "
                "custom communicator for the DAGNode using `with_tensor_transport()`, or "
                "specify a communicator or 'create' for _default_communicator when calling "
                "experimental_compile().")
        if any(isinstance(v, DAGNode) for v in rp.bound_kwargs(node).values()):
            raise ValueError("Compiled DAG currently does not support binding to other DAG "
                             "nodes as kwargs")
        if isinstance(node, (InputNode, InputAttributeNode)):
            continue
        for arg in rp.bound_args(node):
            if not isinstance(arg, DAGNode):
                continue
            producer = arg
            if isinstance(arg, InputAttributeNode):
                key = rp.attribute_source(arg)[1]
                if isinstance(key, int):
                    walk.positional.add(key)
                elif isinstance(key, str):
                    walk.keywords.add(key)
                else:
                    raise ValueError("InputNode() can only be indexed using int for "
                                     "positional args or str for kwargs.")
                if walk.direct:
                    raise ValueError("All tasks must either use InputNode() directly, or "
                                     "they must index to specific args or kwargs.")
                walk.direct = False
                producer = root
            elif isinstance(arg, InputNode):
                if walk.direct is False:
                    raise ValueError("All tasks must either use InputNode() directly, or "
                                     "they must index to specific args or kwargs.")
                walk.direct = True
            walk.consumers.setdefault(id(producer), []).append(node)
    return walk


def _unused_attributes(output: Any, root: Any) -> None:
    from ray.dag import InputAttributeNode

    declared = {rp.attribute_source(a)[1] for a in rp.input_attributes(root)}
    used: set[Any] = set()
    seen: set[int] = set()
    stack = [output]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, InputAttributeNode):
            used.add(rp.attribute_source(node)[1])
        stack.extend(rp.upstream(node))
    unused = declared - used
    if not unused:
        return

    def order(keys: set[Any]) -> list[str]:  # Ray joins a set: small ints come out ascending
        return [str(k) for k in sorted(keys, key=lambda k: (isinstance(k, str),
                                                            k if isinstance(k, int) else 0,
                                                            str(k)))]

    phrase = "is unused" if len(unused) == 1 else "are unused"
    raise ValueError(
        "Compiled Graph expects input to be accessed using all of attributes "
        f"{', '.join(order(declared))}, but {', '.join(order(unused))} {phrase}. Ensure all "
        "input attributes are used and contribute to the computation of the Compiled Graph "
        "output.")


def _leaves(tasks: list[Any], walk: _Walk) -> None:
    from ray.dag import ClassMethodNode

    leaves = [t for t in tasks if isinstance(t, ClassMethodNode) and not walk.consumers[id(t)]
              and not getattr(t, "is_cgraph_output_node", False)]
    if leaves:
        raise ValueError(
            "Compiled DAG doesn't support leaf nodes, i.e., nodes that don't have downstream "
            f"nodes and are not output nodes. There are {len(leaves)} leaf nodes in the DAG. "
            f"Please add the outputs of {[rp.method_name(t) for t in leaves]} to the the "
            "MultiOutputNode.")


def _unreachable(tasks: list[Any], walk: _Walk, root: Any, output: Any) -> None:
    from ray.dag import ClassNode, DAGNode, InputAttributeNode, MultiOutputNode

    reached: set[int] = set()
    frontier = [root]
    while frontier:
        node = frontier.pop(0)
        if id(node) not in reached:
            reached.add(id(node))
            frontier.extend(walk.consumers.get(id(node), []))
    for node in tasks:
        if node is root or isinstance(node, (InputAttributeNode, ClassNode)) or (
                node is output and isinstance(node, MultiOutputNode)):
            continue
        if id(node) not in reached and not any(isinstance(a, DAGNode)
                                               for a in rp.bound_args(node)):
            raise ValueError(
                "Compiled DAGs require each task to take a ray.dag.InputNode or at least one "
                f"other DAGNode as an input. Invalid task node:\n{node}\nPlease bind the task "
                "to proper DAG nodes.")


def _handles(actors: Any) -> set[str]:
    from ray.actor import ActorHandle

    return {rp.handle_id(a) if isinstance(a, ActorHandle) else str(id(a)) for a in actors}


def _communicator_members(tasks: list[Any], walk: _Walk, default_communicator: Any) -> None:
    """Ray's checks of a passed-in ``Communicator``: it must hold every actor of a P2P edge
    it carries, and exactly the actors of a collective."""
    from ray.dag import CollectiveOutputNode
    from ray.experimental.channel.communicator import Communicator

    default = default_communicator if isinstance(default_communicator, Communicator) else None
    for node in tasks:
        if isinstance(node, CollectiveOutputNode):
            if rp.output_of(node) is not None:  # one bucket of a bucketed allreduce
                continue
            coll = rp.collective_of(node)
            comm = coll.hint.communicator or default
            if comm is not None and _handles(comm.get_actor_handles()) != _handles(coll.actors):
                raise ValueError(
                    "The passed-in communicator must have the same set of actors as the "
                    "collective operation. The passed-in communicator has actors "
                    f"{comm.get_actor_handles()} while the collective operation has actors "
                    f"{set(coll.actors)}.")
            continue
        if not _is_call(node) or not accelerator_hint(node):
            continue
        hint = rp.type_hint(node)
        comm = (hint.communicator if hint is not None else None) or default
        if comm is None:
            continue
        actors = [rp.parent_actor(node)] + [rp.parent_actor(r) for r in walk.consumers[id(node)]
                                            if _is_call(r)]
        if not _handles(actors) <= _handles(comm.get_actor_handles()):
            raise ValueError(
                "The passed-in communicator must include all of the actors used in the P2P "
                f"operation. The passed-in communicator has actors {comm.get_actor_handles()} "
                f"while the P2P operation has actors {set(actors)}.")


def _same_actor(a: Any, b: Any) -> bool:
    """Two handles of one live actor are the same actor (ClassNodes: the same node)."""
    from ray.actor import ActorHandle

    if isinstance(a, ActorHandle) and isinstance(b, ActorHandle):
        return rp.handle_id(a) == rp.handle_id(b)
    return a is b


def _driver_reads(tasks: list[Any], output: Any) -> None:
    """Ray's ``_track_communicator_usage``: an accelerator edge the driver reads (the graph's
    output) would put the driver in the communicator group."""
    from ray.dag import MultiOutputNode

    read = rp.bound_args(output) if isinstance(output, MultiOutputNode) else [output]
    if any(_is_call(n) and accelerator_hint(n) for n in read):
        raise ValueError("Driver cannot participate in the communicator group.")


def _cpu_communicator(comm: Any) -> bool:
    from ray.experimental.channel.cpu_communicator import CPUCommunicator

    return isinstance(comm, CPUCommunicator)


def _communicator_actors(tasks: list[Any], walk: _Walk, default_communicator: Any) -> list[Any]:
    """The live actors Ray's ``_init_communicators`` asks for an accelerator, in its order:
    a passed-in communicator's actors (a CPU communicator needs none), then the actors of
    collectives and of P2P edges without a communicator of their own."""
    from ray.actor import ActorHandle
    from ray.dag import CollectiveOutputNode
    from ray.experimental.channel.communicator import Communicator

    default = default_communicator if isinstance(default_communicator, Communicator) else None
    passed: list[Any] = []
    created: list[Any] = []
    for node in tasks:
        if isinstance(node, CollectiveOutputNode):
            if rp.output_of(node) is not None:
                continue
            coll = rp.collective_of(node)
            comm = coll.hint.communicator or default
            actors = list(coll.actors)
        elif _is_call(node) and accelerator_hint(node):
            hint = rp.type_hint(node)
            comm = (hint.communicator if hint is not None else None) or default
            actors = [rp.parent_actor(node)] + [rp.parent_actor(r)
                                                for r in walk.consumers[id(node)] if _is_call(r)]
        else:
            continue
        if comm is None:
            created.extend(actors)
        elif not _cpu_communicator(comm):
            passed.extend(comm.get_actor_handles())
    out: list[Any] = []
    seen: set[str] = set()
    for actor in passed + created:
        if isinstance(actor, ActorHandle) and rp.handle_id(actor) not in seen:
            seen.add(rp.handle_id(actor))
            out.append(actor)
    return out


def _auto_communicators(resolved: list[tuple[Any, Any, list[Any]]],
                        default_communicator: Any) -> list[Any]:
    """Ray's ``_track_communicator_usage`` for ``auto`` edges it resolved to the
    accelerator; returns their actors for the accelerator check."""
    from ray.experimental.channel.communicator import Communicator

    actors: list[Any] = []
    for node, hint, readers in resolved:
        if not hint.requires_accelerator():
            continue
        group = [rp.parent_actor(node), *readers]
        if default_communicator is None:
            raise ValueError(
                f"with_tensor_transport(transport='auto') is used for DAGNode {node}, This "
                "requires specifying a default communicator or 'create' for "
                "_default_communicator when calling experimental_compile().")
        if isinstance(default_communicator, Communicator):
            if not _handles(group) <= _handles(default_communicator.get_actor_handles()):
                raise ValueError(
                    "The passed-in communicator must include all of the actors used in the "
                    "P2P operation. The passed-in communicator has actors "
                    f"{default_communicator.get_actor_handles()} while the P2P operation "
                    f"has actors {set(group)}.")
            continue
        actors.extend(group)
    return actors


def _accelerators(tasks: list[Any], walk: _Walk, default_communicator: Any,
                  more: list[Any]) -> None:
    """Ray's ``_init_communicator``: every actor of an accelerator communicator must hold an
    accelerator (asked of the actors in one round, as Ray asks them)."""
    from cgc.frontend.live_actors import observe

    actors = _communicator_actors(tasks, walk, default_communicator)
    seen = {rp.handle_id(a) for a in actors}
    for actor in more:
        if rp.handle_id(actor) not in seen:
            seen.add(rp.handle_id(actor))
            actors.append(actor)
    held = observe(actors, [rp.handle_class(a)[1] for a in actors], [""] * len(actors))
    for actor, placement in zip(actors, held, strict=True):
        if not placement.has_gpu:
            raise ValueError(
                f"Actor {actor} returns a tensor with type hint "
                'TorchTensor(transport="accelerator") or '
                "TorchTensor(transport=accelerator_group_handle) "
                "but actor does not have an accelerator assigned by Ray.")


def _all_readers_local(tasks: list[Any], walk: _Walk) -> None:
    """Ray's accelerator channel: an edge whose readers all run on the writer's own actor
    gets no accelerator channel, and Ray asserts so. Readers on the writer's actor beside
    others are local readers (Ray hands them the value in-process): accepted."""
    for node in tasks:
        if not _is_call(node) or not accelerator_hint(node):
            continue
        actor = rp.parent_actor(node)
        readers = [r for r in walk.consumers[id(node)] if _is_call(r)]
        if readers and all(_same_actor(rp.parent_actor(r), actor) for r in readers):
            raise AssertionError(
                "All readers are from the same actor. The TorchTensorType type hint is not "
                "needed. No accelerator channel will be created.")


@dataclass(frozen=True)
class RayDag:
    """What Ray's checks learned of a DAG: ``inputs`` (its input signature), ``tasks``
    (its nodes in Ray's task order; ``output`` is the node compiled) and ``auto`` (Ray's
    resolution of its ``auto`` hints, applied to the nodes after compile)."""

    inputs: RayInputs
    tasks: tuple[Any, ...]
    output: Any
    auto: tuple[tuple[Any, Any, list[Any]], ...] = ()  # resolved auto hints (auto_hints)


def check_ray_dag(dag: Any, default_communicator: Any = "create") -> RayDag:
    """Ray's checks of the DAG ``dag.experimental_compile()`` was called on (after the
    compiled-twice check and ``check_compile_args``), in Ray's order;
    ``default_communicator`` is ``experimental_compile``'s ``_default_communicator``.

    Returns Ray's input signature for ``execute()`` and the DAG in Ray's task order.

    Example: ``check_ray_dag(dag).inputs.check((1,), {})``.

    Raises:
        ValueError, NotImplementedError, AssertionError: what Ray 2.60 raises, with
            its message.
    """
    root = _find_root(dag)
    tasks = _tasks(root)
    walk = _preprocess(tasks, root, default_communicator)
    _driver_reads(tasks, dag)
    _unused_attributes(dag, root)
    _leaves(tasks, walk)
    _unreachable(tasks, walk, root, dag)
    _communicator_members(tasks, walk, default_communicator)
    auto = resolve_auto_hints(tuple(tasks), dag)
    _accelerators(tasks, walk, default_communicator,
                  _auto_communicators(auto, default_communicator))
    _all_readers_local(tasks, walk)
    if walk.direct:
        inputs = RayInputs(1, (), True)
    else:
        positional = max(walk.positional) + 1 if walk.positional else 0
        inputs = RayInputs(positional, tuple(sorted(walk.keywords)), False)
    from ray.dag import ClassNode

    return RayDag(inputs, tuple(t for t in tasks if not isinstance(t, ClassNode)), dag,
                  tuple(auto))
