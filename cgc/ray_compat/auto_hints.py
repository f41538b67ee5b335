"""Ray's ``with_tensor_transport("auto")`` hints made visible after compile, as Ray 2.60
leaves them: each node's ``type_hint`` becomes the ``TorchTensorType`` Ray's own resolver
(``TypeHintResolver``) picks from where the writer and its readers are (``"accelerator"``
between actors on different GPUs, host memory otherwise). cgc chose the edge's transport
itself when it compiled; this only shows a program what Ray would show it.

The resolution is made where Ray makes it (before its communicator checks, which then
cover an ``auto`` edge resolved to the accelerator) and applied to the nodes once cgc has
compiled the graph: cgc compiles the user's ``auto`` hint (CUDA IPC on a shared GPU).

Example::

    compiled = dag.experimental_compile()
    data.type_hint.transport          # "accelerator" or "auto", as under Ray
"""

from __future__ import annotations

from typing import Any

from cgc.frontend import ray_private as rp

__all__ = ["resolve_auto_hints", "apply_auto_hints"]


def _auto_writers(tasks: tuple[Any, ...]) -> list[Any]:
    """Calls on live actors whose hint is Ray's ``AutoTransportType``."""
    from ray.actor import ActorHandle
    from ray.dag import ClassMethodNode

    out = []
    for node in tasks:
        hint = rp.type_hint(node)
        if (isinstance(node, ClassMethodNode) and rp.output_of(node) is None and hint
                is not None and hint.auto and isinstance(rp.parent_actor(node), ActorHandle)):
            out.append(node)
    return out


def _readers(node: Any, output: Any) -> list[Any]:
    """The actors reading ``node`` (None: the driver), as Ray lists a task's readers."""
    from ray.dag import ClassMethodNode

    readers = [rp.parent_actor(d) if isinstance(d, ClassMethodNode) else None
               for d in rp.downstream(node)]
    if node is output:
        readers.append(None)
    return readers


def resolve_auto_hints(tasks: tuple[Any, ...], output: Any) -> list[tuple[Any, Any, list[Any]]]:
    """Ray's resolution of every live actor call's ``auto`` hint among ``tasks`` (the
    actors are asked what they hold, in one round), without changing the nodes: a list of
    (node, resolved ``TorchTensorType``, reader actors; None: the driver).

    Example: ``for node, hint, readers in resolve_auto_hints(ray_dag.tasks, ray_dag.output)``.

    Raises:
        cgc.CompileError: an actor did not say what it holds (``live_actors.observe``).
    """
    from ray.experimental.channel.auto_transport_type import TypeHintResolver

    from cgc.frontend.live_actors import observe

    writers = _auto_writers(tasks)
    if not writers:
        return []
    actors: dict[str, Any] = {}
    for node in writers:
        for actor in [rp.parent_actor(node), *_readers(node, output)]:
            if actor is not None:
                actors.setdefault(rp.handle_id(actor), actor)
    handles = list(actors.values())
    held = observe(handles, [rp.handle_class(h)[1] for h in handles], [""] * len(handles))
    gpu_ids = {h: list(p.gpu_ids) for h, p in zip(handles, held, strict=True)}
    nodes = {rp.handle_id(h): p.node_id for h, p in zip(handles, held, strict=True)}

    def located(actor: Any) -> tuple[Any, str]:
        return (actor, nodes[rp.handle_id(actor)] if actor is not None else "")

    resolver = TypeHintResolver(gpu_ids)
    out = []
    for node in writers:
        readers = _readers(node, output)
        hint = resolver.resolve(node.type_hint, located(rp.parent_actor(node)),
                                [located(r) for r in readers])
        out.append((node, hint, readers))
    return out


def apply_auto_hints(resolved: list[tuple[Any, Any, list[Any]]]) -> None:
    """Set each node's ``type_hint`` to its resolved hint, as Ray leaves it after compile.

    Example: ``apply_auto_hints(ray_dag.auto)``.

    Raises:
        Nothing.
    """
    for node, hint, _ in resolved:
        node.type_hint = hint
