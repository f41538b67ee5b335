"""Naming of traced nodes and actors, and the uniform CompileError messages about them."""

from __future__ import annotations

import inspect
from typing import Any

from cgc.errors import CompileError
from cgc.frontend.collectives import CollectiveNode
from cgc.frontend.locations import LocRenderer, RawLoc
from cgc.frontend.nodes import CallNode, InputAttributeNode, InputNode

__all__ = ["Names", "attr_name"]


def attr_name(key: int | str) -> str:
    """``input[0]`` for a positional input, ``input.k`` (or ``input['a b']``) for a keyword."""
    if isinstance(key, int):
        return f"input[{key}]"
    return f"input.{key}" if key.isidentifier() else f"input[{key!r}]"


def _def_loc(cls: type | None, method: str) -> RawLoc | None:
    """Where ``cls.method`` is defined: the fallback when a node's bind site is unknown."""
    func: Any = getattr(cls, method, None) if cls is not None else None
    try:
        func = inspect.unwrap(func)
        code = func.__code__
    except (AttributeError, TypeError, ValueError):
        return None
    return RawLoc(code.co_filename, code.co_firstlineno, code.co_name)


class Names:
    """Final names of actors and nodes, and error messages that use them."""

    def __init__(self, renderer: LocRenderer) -> None:
        self.renderer = renderer
        self.actor: dict[int, str] = {}
        self.node: dict[int, str] = {}
        self.bind_index: dict[int, int] = {}

    def of(self, node: Any) -> str:
        name = self.node.get(id(node))
        if name is not None:
            return name
        if isinstance(node, InputNode):
            return "input"
        if isinstance(node, InputAttributeNode):
            return attr_name(node.key)
        if isinstance(node, (CallNode, CollectiveNode)):
            actor = self.actor.get(id(node.actor), node.actor._describe())
            return f"{actor}.{node.method}#{self.bind_index.get(id(node), node.bind_index)}"
        return "output"

    def _loc(self, node: Any, given: RawLoc | None) -> RawLoc:
        loc = given if given is not None and given.file else getattr(node, "_loc", None)
        if (loc is None or not loc.file) and isinstance(node, CallNode):
            loc = _def_loc(node.actor.cls, node.method) or loc
        return loc if loc is not None else RawLoc("", 0, "")

    def fail(self, node: Any, problem: str, fix: str, loc: RawLoc | None = None) -> CompileError:
        """A CompileError about ``node``: ``file:line: name (Class.method): problem; fix``."""
        where = self.renderer.text(self._loc(node, loc))
        name = self.of(node)
        actor = method = ""
        if isinstance(node, (CallNode, CollectiveNode)):
            actor = self.actor.get(id(node.actor), "")
            method = node.method
            what = f"{name} ({node.actor._describe()}.{node.method})"
        elif isinstance(node, (InputNode, InputAttributeNode)):
            what = f"{name} (graph input)"
        else:
            what = "output"
        return CompileError(
            f"{where}: {what}: {problem}; {fix}", node=name, actor=actor, method=method, loc=where
        )

    def fail_actor(self, actor: Any, problem: str, fix: str) -> CompileError:
        """A CompileError about an actor: ``file:line: actor w0 (Worker.__init__): ...``."""
        where = self.renderer.text(
            actor._loc if actor._loc.file else (_def_loc(actor.cls, "__init__") or actor._loc)
        )
        name = self.actor.get(id(actor), actor._describe())
        return CompileError(
            f"{where}: actor {name} ({actor._describe()}.__init__): {problem}; {fix}",
            node=name,
            actor=name,
            method="__init__",
            loc=where,
        )
