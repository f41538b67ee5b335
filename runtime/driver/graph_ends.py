"""``DriverEndpoints``: the driver's ends of a running graph, as one object.

The driver writes one value per input channel per execution and reads one value per
output channel per execution. Each output reader keeps its own position (the execution
whose value it delivers next), so reading the outputs of one execution in any order, or
stopping early (fail-fast on an error), never shifts which execution a later value
belongs to.

Example::

    ends = DriverEndpoints(plan_proto)
    ends.add_input(writer, picker)          # set-up, per input channel
    ends.add_output(reader)                 # set-up, per unique output channel
    ends.write_inputs((1,), {}, timeout=5)  # one execution
    value = ends.read(0, timeout=5)         # output reader 0's next value
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.channels.ends import close_quietly, detach_quietly, poison_quietly
from cgc.runtime.channels.errors import ChannelError, ErrorValue
from cgc.runtime.errors import InputSerializationError
from cgc.runtime.messages import input_value

__all__ = ["DriverEndpoints", "input_picker", "input_label", "PartialSubmitError",
           "AbandonedSubmitError"]


class PartialSubmitError(Exception):
    """Some, not all, input channels of one execution were written (the graph is broken).

    ``cause`` is the exception that stopped the submission.
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class AbandonedSubmitError(Exception):
    """A later input could not be serialized after earlier ones were written: the rest of
    the execution's input channels got an error value instead, so the execution fails as a
    whole and the graph stays consistent. ``error`` is the typed error for the caller."""

    def __init__(self, error: InputSerializationError) -> None:
        super().__init__(str(error))
        self.error = error


def input_label(node: pb.Node) -> str:
    """How messages name the argument an input channel carries.

    Example: ``input_label(pb.Node(kind=pb.INPUT_ATTR, key_kind=pb.INDEX, index=1)) ==
    "positional argument 1"``.
    """
    if node.kind == pb.INPUT:
        return "the input"
    if node.key_kind == pb.FIELD:
        return f"keyword argument {node.field!r}"
    return f"positional argument {node.index}"


def _unserializable(label: str, value: Any, exc: BaseException) -> InputSerializationError:
    what = f"{type(value).__module__}.{type(value).__qualname__}"
    return InputSerializationError(
        f"execute(): {label} (a {what}) cannot be sent to the actors: "
        f"{type(exc).__name__}: {exc} (inputs travel pickled; pass data, not functions, "
        "generators, locks or open files)", label)


def input_picker(node: pb.Node) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """The function that takes one input channel's value out of ``execute()``'s arguments.

    Example: for an INPUT_ATTR node with index 1, ``input_picker(n)((10, 20), {}) == 20``.
    """
    if node.kind == pb.INPUT:
        return input_value
    index, field = node.index, (node.field if node.key_kind == pb.FIELD else None)
    if field is None:
        return lambda args, kwargs: args[index]
    return lambda args, kwargs: kwargs[field]


class DriverEndpoints:
    """Input writers with their pickers, output readers with their positions.

    Attributes:
        out_index: OUTPUT argument ``i`` -> index of the reader holding it (two OUTPUT args
            may be one channel; the driver reads each channel once per execution).
        positions: per reader, the execution index of the value it delivers next.
    """

    def __init__(self, plan: pb.Plan) -> None:
        low = plan.lowered
        self.out_channels: list[int] = list(dict.fromkeys(low.output_channels))
        self.out_index: list[int] = [self.out_channels.index(c) for c in low.output_channels]
        self.writers: list[Any] = []
        self._inputs: list[tuple[Callable[..., None], Callable[..., Any], str]] = []
        self.readers: list[Any] = []
        # per reader: (node name, actor, method) of the call whose value it carries, so an
        # error made by the channel itself (decode, lost) can name them.
        by_id = {ch.id: ch for ch in low.channels}
        nodes = plan.graph.nodes
        self.producers: list[tuple[str, str, str]] = []
        for c in self.out_channels:
            ch = by_id.get(c)
            n = nodes[ch.source.node] if ch is not None and ch.source.node < len(nodes) else None
            self.producers.append((n.name, n.actor, n.method) if n is not None else
                                  (f"channel c{c}", "", ""))
        self.positions: list[int] = []
        self._base: list[int] = []  # per reader: its channel position of execution 0

    # ---------------------------------------------------------------- set-up
    def add_input(self, writer: Any, picker: Callable[..., Any], label: str = "an input") -> None:
        """Register the writer of the next input channel (plan order); ``label`` names the
        argument it carries in messages (``input_label``)."""
        self.writers.append(writer)
        self._inputs.append((writer.write, picker, label))

    def add_output(self, reader: Any) -> None:
        """Register the reader of the next unique output channel (plan order)."""
        self.readers.append(reader)
        self.positions.append(0)

    # ---------------------------------------------------------------- hot path
    def write_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                     timeout: float | None) -> None:
        """Write one execution's inputs.

        Raises:
            InputSerializationError: the first input cannot be serialized (nothing was
                written; names the argument).
            ChannelTimeoutError, ChannelClosedError: nothing was written (the first
                channel failed).
            AbandonedSubmitError: a later input cannot be serialized; the remaining input
                channels got an error value, so the execution fails as a whole.
            PartialSubmitError: a later channel failed after earlier ones were written.
        """
        inputs = self._inputs
        if len(inputs) == 1:  # the common case: nothing can be half-written
            write, pick, label = inputs[0]
            value = pick(args, kwargs)
            try:
                write(value, timeout)
            except ChannelError:
                raise
            except Exception as exc:  # noqa: BLE001 - pickling runs the value's code
                raise _unserializable(label, value, exc) from exc
            return
        first = True
        try:
            for k, (write, pick, label) in enumerate(inputs):
                value = pick(args, kwargs)
                try:
                    write(value, timeout)
                except ChannelError:
                    raise
                except Exception as exc:  # noqa: BLE001 - pickling runs the value's code
                    err = _unserializable(label, value, exc)
                    if first:
                        raise err from exc
                    self._write_error(k, err, timeout)
                    raise AbandonedSubmitError(err) from exc
                first = False
        except (InputSerializationError, AbandonedSubmitError):
            raise
        except Exception as exc:
            if first:
                raise
            raise PartialSubmitError(exc) from exc

    def _write_error(self, start: int, err: InputSerializationError,
                     timeout: float | None) -> None:
        """Input channels ``start`` on get an error value for this execution (a task with
        an error value as input forwards it, so every output of the execution gets it)."""
        ev = ErrorValue.from_exception(err, actor="@driver", method="execute")
        try:
            for write, _pick, _label in self._inputs[start:]:
                write(ev, timeout)
        except Exception as exc:
            raise PartialSubmitError(exc) from exc

    def read(self, k: int, timeout: float | None) -> Any:
        """The value of execution ``positions[k]`` from output reader ``k``.

        The channel is asked for exactly that execution's position, so a read that failed
        half-way (a decode error, an interrupt after the value was consumed) gives that
        execution an error value and never shifts a later execution's value.

        Raises:
            ChannelTimeoutError: nothing within ``timeout`` (the position is unchanged).
            ChannelClosedError: the channel was closed or poisoned.
            ChannelSequenceError: the channel lost track of its values (a broken graph).
        """
        value = self.readers[k].read_at(self._base[k] + self.positions[k], timeout)
        self.positions[k] += 1
        return value

    def slowest(self) -> int:
        """Index of the reader furthest behind (the oldest execution not fully read)."""
        pos = self.positions
        return min(range(len(pos)), key=pos.__getitem__)

    # ---------------------------------------------------------------- set-up helpers
    def write_warmup(self, ping: Any, timeout: float) -> None:
        """Write the warm-up marker on every input (not an execution: positions stay)."""
        for w in self.writers:
            w.write(ping, timeout)

    def read_warmup(self, timeout: float) -> list[Any]:
        """Read the warm-up marker from every output (not an execution: positions stay)."""
        got = [r.read(timeout) for r in self.readers]
        self._base = [r.position for r in self.readers]
        return got

    # ---------------------------------------------------------------- teardown
    def poison(self) -> None:
        """Poison every driver endpoint (wakes threads blocked in them); best effort."""
        poison_quietly([*self.writers, *self.readers])

    def close_inputs(self) -> None:
        """Close the input writers (unlinks their segments)."""
        close_quietly(self.writers)
        self.writers, self._inputs = [], []

    def close_outputs(self) -> None:
        """Detach the output readers (TCP readers close)."""
        detach_quietly(self.readers)
        self.readers = []
