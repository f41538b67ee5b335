"""``TracedRef``: what a ``.remote()`` call returns while a step is traced.

It stands where Ray's ``ObjectRef`` stands in the user's step: it may be passed to other
``.remote()`` calls (top-level arguments, as Ray resolves them) and returned. It has no
value at trace time, so every use of it as a Python value raises ``RefUsedAsValueError``
naming the line; once its trace is over, any use raises ``EscapedRefError``.

Example::

    h = stage0.fwd.remote(x)        # a TracedRef while cgc traces the step
    if h: ...                       # RefUsedAsValueError: prog.py:13: ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from ray.experimental.compiled_dag_ref import CompiledDAGRef

from cgc.errors import EscapedRefError, GetInStepError, RefUsedAsValueError
from cgc.frontend.locations import RawLoc, capture_loc

if TYPE_CHECKING:
    from cgc.frontend.nodes import DAGNode

__all__ = ["TracedRef", "ArgRef", "StepState"]

_RULE = ("inside a traced step a ref has no value: the step's Python runs once, at trace "
         "time, and only the .remote() calls become the graph")


class StepState:
    """What the refs of one trace share: whether the trace is over, and the step's name."""

    def __init__(self, step_name: str) -> None:
        self.step_name = step_name
        self.closed = False


class TracedRef(CompiledDAGRef):
    """An ObjectRef look-alike for one result of a traced ``.remote()`` call (or one
    argument of the step). A ``CompiledDAGRef`` only so that ``ray.get`` hands it to its
    own ``get``, which refuses (Ray's fields are never set or read)."""

    __slots__ = ("_node", "_state", "_loc", "_what")

    def __init__(self, node: DAGNode | None, state: StepState, loc: RawLoc, what: str) -> None:
        self._node: Any = node  # None only for an ArgRef whose input is not made yet
        self._state = state
        self._loc = loc
        self._what = what  # "w0.fwd" or "argument x" for messages

    def _origin(self) -> str:
        return f"the ref of {self._what} (made at {self._loc.short()})"

    def _value_use(self, use: str) -> NoReturn:
        loc = capture_loc()
        if self._state.closed:
            self._escaped(loc, use)
        raise RefUsedAsValueError(
            f"{loc.short()}: {self._origin()} is used as a Python value ({use}); {_RULE}. "
            "Pass it to another .remote() call or return it; do the computation inside "
            "an actor method",
            loc=loc.short(),
        )

    def _escaped(self, loc: RawLoc, use: str) -> NoReturn:
        raise EscapedRefError(
            f"{loc.short()}: {self._origin()} is used after the trace of "
            f"{self._state.step_name}() ended ({use}); a ref lives only inside its step: "
            "return it from the step instead of keeping it",
            loc=loc.short(),
        )

    def _node_for(self, state: StepState, use: str) -> Any:
        """The graph node this ref stands for, when used by a call of trace ``state``."""
        if self._state is not state or self._state.closed:
            self._escaped(capture_loc(), use)
        return self._node

    def __repr__(self) -> str:
        return f"TracedRef({self._what} at {self._loc.short()})"

    __str__ = __repr__

    def get(self, timeout: float | None = None) -> Any:
        """Refused: inside the step a ref has no value, after it the ref is gone.

        Raises:
            GetInStepError: while the step is traced.
            EscapedRefError: after its trace.
        """
        loc = capture_loc()
        if self._state.closed:
            self._escaped(loc, "ray.get")
        raise GetInStepError(
            f"{loc.short()}: ray.get() on {self._origin()} inside the traced step; {_RULE}",
            loc=loc.short())

    def __del__(self) -> None:
        pass

    def __reduce__(self) -> Any:
        return self.__reduce_ex__(2)

    # A ref is not a value: every protocol that would read one raises.
    def __bool__(self) -> bool:
        self._value_use("bool(ref), e.g. `if ref:`")

    def __len__(self) -> int:
        self._value_use("len(ref)")

    def __iter__(self) -> Any:
        self._value_use("iterating over it or unpacking it; a method with several results "
                        "needs num_returns=k")

    def __getitem__(self, key: Any) -> Any:
        self._value_use(f"indexing it: ref[{key!r}]")

    def __setitem__(self, key: Any, value: Any) -> None:
        self._value_use(f"item assignment: ref[{key!r}] = ...")

    def __contains__(self, item: Any) -> bool:
        self._value_use("`in` on it")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # copy/pickle/introspection protocols
        self._value_use(f"attribute access: ref.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._value_use("calling it")

    def __int__(self) -> int:
        self._value_use("int(ref)")

    def __float__(self) -> float:
        self._value_use("float(ref)")

    def __index__(self) -> int:
        self._value_use("as an index or a size")

    def __complex__(self) -> complex:
        self._value_use("complex(ref)")

    def __await__(self) -> Any:
        self._value_use("await ref: awaiting is ray.get")

    def __reduce_ex__(self, protocol: Any) -> Any:
        loc = capture_loc()
        raise EscapedRefError(
            f"{loc.short()}: {self._origin()} is being pickled (ray.put, a Ray call's "
            "nested argument, or saving it); a traced ref lives only inside its step",
            loc=loc.short(),
        )

    def __copy__(self) -> TracedRef:
        return self

    def __deepcopy__(self, memo: Any) -> TracedRef:
        return self


class ArgRef(TracedRef):
    """An argument of the traced step: its graph input is made when a call first uses it
    (or the step returns it), so an argument the graph never reads is no input."""

    __slots__ = ("_inp", "_key")

    def __init__(self, inp: Any, key: int | str | None, state: StepState, loc: RawLoc,
                 what: str) -> None:
        super().__init__(None, state, loc, what)
        self._inp = inp
        self._key = key

    def _node_for(self, state: StepState, use: str) -> Any:
        super()._node_for(state, use)
        if self._node is None:
            # key None: the step's only argument is the whole input, as Ray's ``inp`` is
            # ``execute(x)``'s x (the plan a DAG written with ``inp`` gives)
            self._node = self._inp if self._key is None else self._inp._attr(self._key,
                                                                             self._loc)
        return self._node


def _operator(symbol: str) -> Any:
    def op(self: TracedRef, *other: Any) -> Any:
        self._value_use(f"the operator {symbol}")

    return op


for _name, _sym in {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
    "pow": "**", "matmul": "@", "and": "&", "or": "|", "xor": "^", "lshift": "<<",
    "rshift": ">>", "divmod": "divmod()",
}.items():
    setattr(TracedRef, f"__{_name}__", _operator(_sym))
    setattr(TracedRef, f"__r{_name}__", _operator(_sym))
    setattr(TracedRef, f"__i{_name}__", _operator(_sym + "="))
for _name, _sym in {"neg": "unary -", "pos": "unary +", "abs": "abs()", "invert": "~",
                    "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "round": "round()",
                    "trunc": "math.trunc()", "floor": "math.floor()",
                    "ceil": "math.ceil()"}.items():
    setattr(TracedRef, f"__{_name}__", _operator(_sym))
del _name, _sym
