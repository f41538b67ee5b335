"""Which Ray ``Communicator`` objects the drop-in can stand in for, and the refusal of the rest.

A Ray program may hand a ``Communicator`` object to ``with_tensor_transport(transport=comm)``,
to a collective (``allreduce.bind(..., transport=comm)``) or to ``experimental_compile(
_default_communicator=comm)``. A plan cannot hold a Python object that lives in actors, so
cgc binds its own communicator among the same actors. That is faithful only where cgc's
communicator does what the user's object would do, which holds for Ray's own classes:

=========================================  =============================================
communicator class (exact type)            drop-in
=========================================  =============================================
``ray...cpu_communicator.CPUCommunicator``  cgc's CPU communicator / host memory (same
                                            results)
``ray...nccl_group._NcclGroup`` (any class  cgc's NCCL (same results)
defined in Ray's own package)
any other class (a user's ``Communicator``  refused at compile time with
subclass, or a subclass of the above)       ``CustomCommunicatorError`` naming the class
                                            and the node, after Ray's own checks of it
=========================================  =============================================

A user's class can do anything in its ``send``/``recv``/``allreduce`` (Ray's own test adds 1
to every allreduce result), so binding cgc's communicator in its place would silently compute
something else; the drop-in refuses instead.

Example::

    refuse_custom_communicators(check_ray_dag(dag, comm).tasks, comm)   # raises for a
                                                                       # user's class
"""

from __future__ import annotations

from typing import Any

from cgc.errors import CompileError
from cgc.frontend import ray_private as rp

__all__ = ["CustomCommunicatorError", "stands_in_for", "refuse_custom_communicators"]


class CustomCommunicatorError(CompileError, ValueError):
    """A Ray ``Communicator`` object of a class cgc cannot stand in for (a user's own
    subclass) carries an edge or collective of the DAG. The message names the class and
    the node. Also a ``ValueError``, the type Ray's own communicator checks raise.

    Example::

        try:
            dag.experimental_compile()     # allreduce.bind(xs, transport=MyComm(...))
        except CustomCommunicatorError as exc:
            print(exc)                     # names MyComm and the collective's node
    """


def stands_in_for(comm: Any) -> bool:
    """Whether cgc's own communicator gives the same results as ``comm`` (Ray's own
    classes, exactly: a subclass may change what they compute).

    Example:
        >>> stands_in_for(object())
        False

    Raises nothing (reads only the type's module).
    """
    # Ray's own classes are those defined in Ray's package: its CPUCommunicator and its NCCL
    # group. Read off the type's module, so the drop-in imports none of Ray's private names.
    return type(comm).__module__.partition(".")[0] == "ray"


def _needs_communicator(node: Any) -> bool:
    """A task with an accelerator hint, or a collective's operation node."""
    from ray.dag import ClassMethodNode, CollectiveOutputNode

    if isinstance(node, CollectiveOutputNode):
        return rp.output_of(node) is None
    if not isinstance(node, ClassMethodNode) or rp.output_of(node) is not None:
        return False
    hint = rp.type_hint(node)
    return hint is not None and (hint.communicator is not None or (
        not hint.auto and hint.transport == "accelerator"))


def _own_communicator(node: Any) -> Any:
    """The communicator object the node names itself (None: the default's business)."""
    from ray.dag import CollectiveOutputNode

    if isinstance(node, CollectiveOutputNode):
        return rp.collective_of(node).hint.communicator
    hint = rp.type_hint(node)
    return hint.communicator if hint is not None else None


def _describe(node: Any) -> str:
    """The node as a user knows it: ``Class.method`` (or the collective) and its bind line."""
    from ray.actor import ActorHandle
    from ray.dag import CollectiveOutputNode

    from cgc.frontend.ray_sites import NODE_SITES

    if isinstance(node, CollectiveOutputNode):
        name = f"the collective {rp.method_name(node)}"
    else:
        actor = rp.parent_actor(node)
        cls = rp.handle_class(actor)[1] if isinstance(actor, ActorHandle) else "actor"
        name = f"{cls}.{rp.method_name(node)}"
    try:
        loc = NODE_SITES.get(node)
    except TypeError:
        loc = None
    return f"{name} (bound at {loc.short()})" if loc is not None and loc.line else name


def refuse_custom_communicators(tasks: tuple[Any, ...] | list[Any], default_communicator: Any,
                                auto_accelerator: list[Any] | None = None) -> None:
    """Refuse a DAG whose edge or collective would run on a ``Communicator`` object cgc
    cannot stand in for: ``tasks`` are the DAG's nodes (Ray's checks passed),
    ``default_communicator`` is ``experimental_compile``'s, ``auto_accelerator`` the nodes
    whose ``auto`` hint Ray resolved to the accelerator (they use the default).

    Example: ``refuse_custom_communicators(ray_dag.tasks, "create")`` returns None.

    Raises:
        CustomCommunicatorError: naming the communicator's class and the first node using it.
    """
    from ray.experimental.channel.communicator import Communicator

    default = default_communicator if isinstance(default_communicator, Communicator) else None
    auto_ids = {id(n) for n in auto_accelerator or []}
    for node in tasks:
        if not (_needs_communicator(node) or id(node) in auto_ids):
            continue
        comm = _own_communicator(node) or default
        if comm is None or stands_in_for(comm):
            continue
        cls = type(comm)
        source = ("passed as _default_communicator" if comm is default
                  and _own_communicator(node) is None else "passed as its transport")
        raise CustomCommunicatorError(
            f"DAG node {_describe(node)} uses a communicator of class {cls.__module__}.{cls.__qualname__} "
            f"({source}). cgc.ray_compat cannot run a user's Communicator: its plan binds "
            "cgc's own communicators, which stand in only for Ray's CPUCommunicator and "
            "_NcclGroup. Use transport='nccl' (or a CPUCommunicator) there, or run "
            "this DAG on Ray itself (cgc.ray_compat.uninstall()).")
