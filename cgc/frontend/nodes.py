"""The builder's graph nodes: inputs, method calls, multi-return refs and the output list.

Nodes are lazy descriptions; nothing runs. Each node remembers where the user created it
(``loc``), which nodes consume it (``_downstream``, so tracing can find results that reach
no output) and its transport hints. ``trace()`` turns a graph of these into ``pb.Graph``.

=====================  ==================================================================
class                  what it stands for
=====================  ==================================================================
``InputNode``          the whole input of one execution (``with InputNode() as inp:``)
``InputAttributeNode`` ``inp[0]`` (positional argument) or ``inp["k"]`` / ``inp.k`` (keyword)
``CallNode``           ``actor.method.bind(*args, **kwargs)``; ``num_returns`` outputs
``OutputRef``          output ``i`` of a multi-return call (``node[i]``, or unpacking)
``CollectiveNode``     one member's part of a collective (see ``collectives.py``)
``MultiOutputNode``    the graph's outputs, when there are several
=====================  ==================================================================
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cgc.errors import CompileError
from cgc.frontend.locations import RawLoc, capture_loc

if TYPE_CHECKING:
    from cgc.frontend.actors import LazyActor

__all__ = [
    "DAGNode",
    "InputNode",
    "InputAttributeNode",
    "CallNode",
    "OutputRef",
    "MultiOutputNode",
    "HintSpec",
]

# Creation order of nodes; only used to sort things the user made in one program run.
_SEQ = itertools.count()


@dataclass
class HintSpec:
    """A transport hint as the user gave it (validated when traced)."""

    transport: Any = "auto"
    device: Any = "default"
    static_shape: bool = False
    direct_return: bool = False
    shape: tuple[int, ...] | None = None  # declared tensor shape (cgc's extension)
    dtype: str = ""                       # declared dtype name, e.g. "float32"
    loc: RawLoc = field(default_factory=lambda: RawLoc("", 0, ""))
    requested: str = ""  # another system's name for it (Ray RDT's "nixl"), kept for inspect


class DAGNode:
    """Base of all nodes that can be passed to ``.bind(...)``."""

    def __init__(self, loc: RawLoc | None = None) -> None:
        self._loc = loc if loc is not None else capture_loc()
        self._seq = next(_SEQ)
        self._downstream: list[DAGNode] = []
        # output index (None: every output of the node) -> hint
        self._hints: dict[int | None, HintSpec] = {}

    def _link_upstream(self, values: Any) -> None:
        """Register this node as a consumer of every node found in ``values`` (any depth)."""
        for node in iter_nodes(values):
            node._downstream.append(self)

    def with_tensor_transport(
        self,
        transport: Any = "auto",
        device: Any = "default",
        _static_shape: bool = False,
        _direct_return: bool = False,
        *,
        static_shape: bool | None = None,
        direct_return: bool | None = None,
        shape: Any = None,
        dtype: Any = None,
    ) -> DAGNode:
        """Hint how this node's result travels to its consumers; returns the node.

        Same signature as Ray's ``DAGNode.with_tensor_transport``; ``static_shape`` and
        ``direct_return`` are accepted without the underscore too. cgc also takes the
        tensor's ``shape`` and ``dtype`` (a ``torch.dtype`` or its name): with
        ``static_shape`` the value is one tensor of exactly that shape and dtype every
        execution, so a GPU reader allocates it once and posts its receive before the
        sender's header arrives; a value that breaks the declaration arrives as an error.

        Example::

            y = w.fwd.bind(inp).with_tensor_transport("nccl", _static_shape=True,
                                                      shape=(8, 1024), dtype="float16")

        Raises:
            CompileError: (when traced) the hint cannot hold, e.g. NCCL to ``device="cpu"``.
        """
        hint = HintSpec(
            transport=transport,
            device=device,
            static_shape=bool(_static_shape if static_shape is None else static_shape),
            direct_return=bool(_direct_return if direct_return is None else direct_return),
            shape=None if shape is None else tuple(shape),
            dtype="" if dtype is None else str(dtype).removeprefix("torch."),
            loc=capture_loc(),
        )
        self._set_hint(hint)
        return self

    def _set_hint(self, hint: HintSpec) -> None:
        self._hints = {None: hint}

    def _describe(self) -> str:
        return type(self).__name__


class InputNode(DAGNode):
    """The input of one execution; index it for positional or keyword arguments.

    Example::

        with InputNode() as inp:
            out = w.fwd.bind(inp[0], scale=inp.scale)

    ``inp["k"]`` and ``inp.k`` are the same node: the keyword argument ``k``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._attrs: dict[tuple[str, Any], InputAttributeNode] = {}

    def __enter__(self) -> InputNode:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getitem__(self, key: int | str) -> InputAttributeNode:
        return self._attr(key, capture_loc())

    def __getattr__(self, name: str) -> InputAttributeNode:
        if name.startswith("_"):
            raise AttributeError(name)  # keep copy/pickle/introspection protocols intact
        return self._attr(name, capture_loc())

    def _attr(self, key: Any, loc: RawLoc) -> InputAttributeNode:
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise CompileError(
                f"{loc.short()}: inp[{key!r}]: an input is indexed by an int (positional "
                "argument) or a str (keyword argument); use inp[0] or inp['name']",
                loc=loc.short(),
            )
        if isinstance(key, int) and key < 0:
            raise CompileError(
                f"{loc.short()}: inp[{key}]: negative input index; positional inputs are "
                "numbered from 0 (inp[0] is the first argument of execute())",
                loc=loc.short(),
            )
        ident = ("index", key) if isinstance(key, int) else ("field", key)
        node = self._attrs.get(ident)
        if node is None:
            node = InputAttributeNode(self, key, loc)
            self._attrs[ident] = node
        return node

    def _describe(self) -> str:
        return "inp"


class InputAttributeNode(DAGNode):
    """One positional (``inp[0]``) or keyword (``inp["k"]``, ``inp.k``) input argument."""

    def __init__(self, input_node: InputNode, key: int | str, loc: RawLoc) -> None:
        super().__init__(loc)
        self.input_node = input_node
        self.key = key
        input_node._downstream.append(self)

    def _describe(self) -> str:
        return f"inp[{self.key!r}]"


class CallNode(DAGNode):
    """``actor.method.bind(*args, **kwargs)``: one call per execution, in bind order."""

    def __init__(
        self,
        actor: LazyActor,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        num_returns: int,
        loc: RawLoc | None = None,
    ) -> None:
        super().__init__(loc)
        self.actor = actor
        self.method = method
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.num_returns = num_returns
        self.bind_index = actor._register_call(self)
        self._link_upstream((self.args, self.kwargs))

    def __getitem__(self, index: int) -> OutputRef:
        n = self.num_returns or 1
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"a call node is indexed by an int output number, not {index!r}")
        if not -n <= index < n:
            raise IndexError(
                f"{self._describe()} returns {n} value(s); output {index} does not exist"
            )
        return OutputRef(self, index % n, capture_loc())

    def __iter__(self):
        n = self.num_returns or 1
        if n <= 1:
            raise TypeError(
                f"{self._describe()} returns one value and cannot be unpacked; declare "
                "@cgc.method(num_returns=k) or bind with .options(num_returns=k)"
            )
        loc = capture_loc()
        return iter([OutputRef(self, i, loc) for i in range(n)])

    def __len__(self) -> int:
        return self.num_returns or 1

    def _describe(self) -> str:
        return f"{self.actor._describe()}.{self.method}#{self.bind_index}"


class OutputRef(DAGNode):
    """Output ``index`` of a multi-return call; hints given here apply to that output only."""

    def __init__(self, call: DAGNode, index: int, loc: RawLoc) -> None:
        super().__init__(loc)
        self.call = call
        self.index = index
        call._downstream.append(self)

    def _set_hint(self, hint: HintSpec) -> None:
        self.call._hints[self.index] = hint

    def _describe(self) -> str:
        return f"{self.call._describe()}[{self.index}]"


class MultiOutputNode(DAGNode):
    """Several outputs: ``execute()`` returns one result per node, in this order.

    Example: ``dag = MultiOutputNode([w0.fwd.bind(inp), w1.fwd.bind(inp)])``.
    """

    def __init__(self, outputs: list[Any] | tuple[Any, ...]) -> None:
        super().__init__()
        if not isinstance(outputs, (list, tuple)):
            raise CompileError(
                f"{self._loc.short()}: MultiOutputNode takes a list of nodes, got a "
                f"{type(outputs).__name__}; write MultiOutputNode([a, b])",
                loc=self._loc.short(),
            )
        self.outputs = list(outputs)
        self._link_upstream(self.outputs)

    def _set_hint(self, hint: HintSpec) -> None:
        raise CompileError(
            f"{hint.loc.short()}: with_tensor_transport on a MultiOutputNode has no "
            "meaning; call it on the nodes you pass to MultiOutputNode",
            loc=hint.loc.short(),
        )


def iter_nodes(value: Any, _seen: set[int] | None = None) -> Iterator[DAGNode]:
    """Yield every DAG node inside ``value`` (itself, or inside lists/tuples/dicts/sets)."""
    if isinstance(value, DAGNode):
        yield value
        return
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        seen = _seen if _seen is not None else set()
        if id(value) in seen:
            return
        seen.add(id(value))
        items = list(value.items()) if isinstance(value, dict) else value
        for item in items:
            yield from iter_nodes(item, seen)
