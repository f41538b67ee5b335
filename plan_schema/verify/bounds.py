"""The plan's bounds (``Limits``) and the checks of its values, actor options and tensor
specs, for the structure check (``cgc.plan_schema.verify.structure``) and for ``cgc inspect``.

``check_bounds`` is layer 1: the lengths of the plan's lists (each a ``len``, so a plan
that asks for too much is refused at the cost of reading it), ``ExecConfig`` numbers,
actor options (finite, non-negative resources Ray accepts, a JSON ``runtime_env``) and
constructor arguments, and the example inputs. Per-node and per-channel bounds are checked
as the later layers read each node and channel (``limit``, ``Rings``, ``check_spec``,
``Values``), so each field is read once. ``check_limits`` runs every bound alone, without
the structural checks: what a reader that never runs a plan enforces.

A value passes when it has a kind, an int of at most ``Limits.bigint_digits`` digits, a
known dtype whose shape its data fills exactly, dict keys that can be keys, and stays
within ``value_items``/``value_depth``; a value that passes decodes
(``cgc.plan_schema.values.decode_value``). A pickled value is only counted (what it holds
is the trust decision's business).

``REPEATED_BOUNDS`` names, for every repeated field of ``plan.proto``, the ``Limits``
attribute that bounds it; ``tests/plan_schema/verify/test_bounds.py`` keeps it complete.

Example: ``check_bounds(plan, LIMITS)`` returns None for a plan ``lower`` wrote.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, NoReturn

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import LIMITS, Limits, ring_slot_bytes
from cgc.plan_schema.values import DTYPE_BYTES, TORCH_DTYPE_BYTES, numpy_itemsize
from cgc.plan_schema.verify.errors import PlanLimitError, PlanStructureError

__all__ = ["check_bounds", "check_limits", "check_value", "check_spec", "limit", "Values",
           "Rings", "REPEATED_BOUNDS"]

# Every repeated field of the plan -> the Limits attribute that bounds its length.
REPEATED_BOUNDS = {
    "cgc.plan.Plan.example_args": "positional",
    "cgc.plan.Plan.example_kwargs": "keyword_fields",
    "cgc.plan.Graph.actors": "actors",
    "cgc.plan.Graph.nodes": "nodes",
    "cgc.plan.Graph.collectives": "collectives",
    "cgc.plan.Graph.keyword_fields": "keyword_fields",
    "cgc.plan.Graph.modules": "modules",
    "cgc.plan.Actor.ctor_args": "arguments",
    "cgc.plan.Actor.ctor_kwargs": "arguments",
    "cgc.plan.ActorOptions.resources": "resources",
    "cgc.plan.ActorPlacement.resources": "resources",
    "cgc.plan.ActorPlacement.gpu_ids": "resources",
    "cgc.plan.Node.args": "arguments",
    "cgc.plan.Node.kwargs": "arguments",
    "cgc.plan.Node.hints": "num_returns",
    "cgc.plan.Collective.nodes": "communicator_size",
    "cgc.plan.TensorSpec.shape": "tensor_dims",
    "cgc.plan.TensorValue.shape": "tensor_dims",
    "cgc.plan.ValueList.items": "value_items",
    "cgc.plan.ValueMap.entries": "value_items",
    "cgc.plan.Lowered.channels": "channels",
    "cgc.plan.Lowered.communicators": "communicators",
    "cgc.plan.Lowered.programs": "actors",
    "cgc.plan.Lowered.edges": "edges",
    "cgc.plan.Lowered.input_channels": "channels",
    "cgc.plan.Lowered.output_channels": "outputs",
    "cgc.plan.ScheduleInfo.costs": "costs",
    "cgc.plan.Channel.readers": "actors",
    "cgc.plan.Communicator.members": "communicator_size",
    "cgc.plan.Program.prologue": "ops",
    "cgc.plan.Program.ops": "ops",
    "cgc.plan.Program.captured_ops": "ops",
    "cgc.plan.Op.extract": "nodes",
    "cgc.plan.Graph.weight_syncs": "actors",
    "cgc.plan.WeightSync.targets": "actors",
    "cgc.plan.WeightSync.recv_nodes": "actors",
    "cgc.plan.WeightSync.params": "weight_params",
    "cgc.plan.WeightParam.shape": "tensor_dims",
    "cgc.plan.Lowered.transfers": "actors",
    "cgc.plan.TransferPlan.buckets": "num_returns",
    "cgc.plan.WeightBucket.members": "weight_params",
}

# Resource names Ray reserves for its own options (num_cpus, num_gpus, memory, ...).
_RESERVED_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
_SCALARS = frozenset({"null", "bool_value", "int_value", "float_value", "str_value",
                      "bytes_value"})


def _fail(msg: str) -> NoReturn:
    raise PlanStructureError(f"invalid plan: {msg}")


def limit(field: str, value: float, limits: Limits, name: str) -> None:
    """Refuse ``value`` of ``field`` above ``Limits.<name>``.

    Raises:
        PlanLimitError: naming the field, the value and the limit.
    """
    bound = getattr(limits, name)
    if value > bound:
        raise PlanLimitError(field, value, bound, name)  # type: ignore[arg-type]


# ---------------------------------------------------------------- counts


def _check_counts(plan: pb.Plan, limits: Limits) -> None:
    """Lengths of the plan's lists, before anything walks them (per-node bounds are
    checked as the graph check reads each node)."""
    g, low = plan.graph, plan.lowered
    for field, items, name in (
        ("the number of actors", g.actors, "actors"),
        ("the number of programs", low.programs, "actors"),
        ("the number of nodes", g.nodes, "nodes"),
        ("the number of collectives", g.collectives, "collectives"),
        ("the number of keyword inputs (Graph.keyword_fields)", g.keyword_fields,
         "keyword_fields"),
        ("the number of embedded modules", g.modules, "modules"),
        ("the number of channels", low.channels, "channels"),
        ("the number of input channels", low.input_channels, "channels"),
        ("the number of output channels", low.output_channels, "outputs"),
        ("the number of communicators", low.communicators, "communicators"),
        ("the number of edges", low.edges, "edges"),
        ("ScheduleInfo.costs", low.schedule.costs, "costs"),
        ("the number of example positional inputs", plan.example_args, "positional"),
        ("the number of example keyword inputs", plan.example_kwargs, "keyword_fields"),
    ):
        limit(field, len(items), limits, name)
    limit("Graph.num_positional", g.num_positional, limits, "positional")
    ops = 0
    for p in low.programs:  # (an op's extract list is sorted node ids: at most Limits.nodes)
        ops += len(p.prologue) + len(p.ops)
        limit("the number of ops in all programs", ops, limits, "ops")
    for c in g.collectives:
        limit(f"collective {c.id} members", len(c.nodes), limits, "communicator_size")
    for comm in low.communicators:
        limit(f"communicator {comm.id} members", len(comm.members), limits,
              "communicator_size")
    _check_sync_counts(plan, limits)


def _check_sync_counts(plan: pb.Plan, limits: Limits) -> None:
    """Lengths of the weight syncs' lists (format 1.7)."""
    g, low = plan.graph, plan.lowered
    limit("the number of weight syncs", len(g.weight_syncs), limits, "actors")
    limit("the number of transfer plans", len(low.transfers), limits, "actors")
    for s in g.weight_syncs:
        limit(f"weight sync {s.id} targets", len(s.targets), limits, "actors")
        limit(f"weight sync {s.id} receive nodes", len(s.recv_nodes), limits, "actors")
        limit(f"weight sync {s.id} parameters", len(s.params), limits, "weight_params")
        for p in s.params:
            limit(f"weight sync {s.id} parameter dimensions", len(p.shape), limits,
                  "tensor_dims")
    for t in low.transfers:
        limit(f"transfer plan {t.sync} buckets", len(t.buckets), limits, "num_returns")
        for b in t.buckets:
            limit(f"transfer plan {t.sync} bucket members", len(b.members), limits,
                  "weight_params")


# ---------------------------------------------------------------- numbers and options


def _check_numbers(plan: pb.Plan, limits: Limits) -> None:
    cfg = plan.config
    limit("ExecConfig.capacity", cfg.capacity, limits, "capacity")
    limit("ExecConfig.spin_us", cfg.spin_us, limits, "spin_us")
    limit("ExecConfig.max_buffered_results", cfg.max_buffered_results, limits, "buffered_results")
    limit("ExecConfig.default_slot_bytes", cfg.default_slot_bytes, limits, "slot_bytes")


class Rings:
    """Per-channel ring bounds, added up as the channel check reads each channel."""

    def __init__(self, plan: pb.Plan, limits: Limits) -> None:
        self.limits = limits
        self.default = plan.config.default_slot_bytes
        self.total = 0

    def add(self, cid: int, host: bool, slots: int, slot_bytes: int, readers: int) -> None:
        """One channel's slots, slot bytes and readers."""
        lim = self.limits
        limit(f"Channel c{cid} slots", slots, lim, "slots")
        limit(f"Channel c{cid} slot_bytes", slot_bytes, lim, "slot_bytes")
        limit(f"Channel c{cid} readers", readers, lim, "actors")
        if host:
            # what the runtime reserves for the ring (0: the config's size, and the floor)
            self.total += slots * ring_slot_bytes(slot_bytes, self.default)

    def done(self) -> None:
        """After the last channel: the shared memory of all rings."""
        limit("the shared memory of all rings (slots x slot_bytes)", self.total, self.limits,
              "ring_bytes")


def check_spec(spec: pb.TensorSpec, what: str, limits: Limits) -> None:
    """A declared tensor: a known dtype with a shape of sizes >= 0 of bounded bytes.

    Raises:
        PlanStructureError, PlanLimitError: naming ``what``.
    """
    if not spec.dtype and not spec.shape:
        return
    shape = list(spec.shape)
    limit(f"the dimensions of {what}", len(shape), limits, "tensor_dims")
    size = DTYPE_BYTES.get(spec.dtype)
    if size is None:
        _fail(f"{what} has the unknown tensor dtype {spec.dtype!r} (known: "
              f"{', '.join(sorted(DTYPE_BYTES))})")
    if any(d < 0 for d in shape):
        _fail(f"{what} has a negative size in its shape {shape}")
    limit(f"the bytes of {what}", math.prod(max(d, 1) for d in shape) * size, limits,
          "tensor_bytes")


def _amount(value: float, what: str, bound: float, name: str) -> None:
    """A Ray resource amount: finite, >= 0, at most ``bound``, and if fractional, at least
    0.0001 (Ray's resolution)."""
    if math.isnan(value) or value < 0:
        _fail(f"{what} is {value}; a resource amount is a number >= 0")
    if value > bound:
        raise PlanLimitError(what, value, bound, name)  # type: ignore[arg-type]
    if 0 < value < 1e-4:
        _fail(f"{what} is {value}; Ray resolves resource amounts to 0.0001")


def _check_actor(a: pb.Actor, limits: Limits, values: Values) -> None:
    """An actor's options (what Ray accepts) and constructor arguments."""
    o, what = a.options, f"actor {a.name}"
    args, kwargs = a.ctor_args, a.ctor_kwargs
    limit(f"the constructor arguments of {what}", len(args) + len(kwargs), limits,
          "arguments")
    resources = o.resources
    limit(f"the custom resources of {what}", len(resources), limits, "resources")
    for name in ("num_cpus", "num_gpus"):
        if o.HasField(name):
            _amount(getattr(o, name), f"ActorOptions.{name} of {what}", limits.resource_amount,
                    "resource_amount")
    if o.HasField("memory"):
        _amount(o.memory, f"ActorOptions.memory of {what}", limits.memory_bytes,
                "memory_bytes")
    seen: set[str] = set()
    for r in resources:
        if not r.name or r.name in _RESERVED_RESOURCES or r.name in seen:
            _fail(f"{what} asks for a custom resource named {r.name!r} (empty, twice, or one "
                  f"of Ray's own: {', '.join(sorted(_RESERVED_RESOURCES))})")
        seen.add(r.name)
        _amount(r.amount, f"resource {r.name!r} of {what}", limits.resource_amount,
                "resource_amount")
    placed = a.external.placement  # what a live actor held at compile time
    limit(f"the observed resources of {what}", len(placed.resources), limits, "resources")
    limit(f"the observed GPU ids of {what}", len(placed.gpu_ids), limits, "resources")
    for r in placed.resources:
        _amount(r.amount, f"observed resource {r.name!r} of {what}", limits.resource_amount,
                "resource_amount")
    if o.HasField("max_concurrency"):
        if o.max_concurrency < 1:
            _fail(f"ActorOptions.max_concurrency of {what} is 0; an actor runs at least one "
                  "call at a time")
        limit(f"ActorOptions.max_concurrency of {what}", o.max_concurrency, limits,
              "max_concurrency")
    if o.runtime_env_json:
        try:
            env = json.loads(o.runtime_env_json)
        except (ValueError, RecursionError):
            env = None
        if not isinstance(env, dict):
            _fail(f"ActorOptions.runtime_env_json of {what} is not a JSON object")
    for i, v in enumerate(args):
        values.walk(v, f"{what} ctor_args[{i}]", 0, False)
    for nv in kwargs:
        values.walk(nv.value, f"{what} ctor_kwargs[{nv.name!r}]", 0, False)


# ---------------------------------------------------------------- values


class _Path:
    """Where a value sits, formatted only when a message needs it (values can be large)."""

    __slots__ = ("parent", "label")

    def __init__(self, parent: _Path | str, label: str = "") -> None:
        self.parent, self.label = parent, label

    def __str__(self) -> str:
        parts = []
        p: _Path | str = self
        while isinstance(p, _Path):
            parts.append(p.label)
            p = p.parent
        return p + "".join(reversed(parts))


def check_value(v: pb.Value, where: str, limits: Limits) -> None:
    """Check one plan value: what ``decode_value`` needs to rebuild it, within ``limits``.

    Example: ``check_value(encode_value([1, "a"])[0], "example_args[0]", LIMITS)``.

    Raises:
        PlanStructureError: empty, malformed (names the place inside the value).
        PlanLimitError: too many items, too deep, too many digits or dimensions.
    """
    Values(limits).walk(v, where, 0, False)


class Values:
    """Checks values one after another (``walk(v, where, 0, False)`` per value)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.items = 0
        self.root = ""

    def walk(self, v: pb.Value, path: _Path | str, depth: int, key: bool) -> None:
        if depth == 0:
            self.items, self.root = 0, str(path)
        kind = v.WhichOneof("kind")
        if kind in _SCALARS or kind == "pickled":
            return
        if kind is None:
            _fail(f"{path} is an empty value (no kind set)")
        if kind == "bigint_value":
            self._bigint(v.bigint_value, path)
        elif kind == "list_value" or kind == "tuple_value":
            if key and kind == "list_value":
                _fail(f"{path} is a list used as a dict key (a list cannot be a key)")
            items = getattr(v, kind).items
            self._grow(len(items), depth)
            for i, x in enumerate(items):
                self.walk(x, _Path(path, f"[{i}]"), depth + 1, key)
        elif kind == "map_value":
            if key:
                _fail(f"{path} is a dict used as a dict key (a dict cannot be a key)")
            entries = v.map_value.entries
            self._grow(len(entries), depth)
            for i, e in enumerate(entries):
                self.walk(e.key, _Path(path, f" key {i}"), depth + 1, True)
                self.walk(e.value, _Path(path, f"[{i}]"), depth + 1, False)
        else:
            self._tensor(v.tensor_value, path, key)

    def _grow(self, n: int, depth: int) -> None:
        lim = self.limits
        if depth + 1 > lim.value_depth:
            raise PlanLimitError(f"the nesting of {self.root}", depth + 1, lim.value_depth,
                                 "value_depth")
        self.items += n
        if self.items > lim.value_items:
            raise PlanLimitError(f"the items of {self.root}", self.items, lim.value_items,
                                 "value_items")

    def _bigint(self, s: str, path: _Path | str) -> None:
        digits = s[1:] if s.startswith("-") else s
        if not digits.isascii() or not digits.isdigit():
            _fail(f"{path} bigint_value {s[:20]!r} is not a decimal integer")
        if len(digits) > self.limits.bigint_digits:
            raise PlanLimitError(f"the digits of {path}", len(digits),
                                 self.limits.bigint_digits, "bigint_digits")

    def _tensor(self, t: pb.TensorValue, path: _Path | str, key: bool) -> None:
        if t.framework in ("numpy", "numpy-scalar"):
            size = numpy_itemsize(t.dtype)
            if size is None:
                _fail(f"{path} has numpy dtype {t.dtype!r}, which a plan cannot hold "
                      "(object arrays never; numbers, bools, bytes, str, datetimes, void)")
            if t.framework == "numpy-scalar" and t.shape:
                _fail(f"{path} is a numpy scalar with the shape {list(t.shape)}")
            if key and t.framework == "numpy":
                _fail(f"{path} is a numpy array used as a dict key (an array cannot be a key)")
        elif t.framework == "torch":
            size = TORCH_DTYPE_BYTES.get(t.dtype)
            if size is None:
                _fail(f"{path} has torch dtype {t.dtype!r}; known: "
                      f"{', '.join(sorted(TORCH_DTYPE_BYTES))}")
        else:
            _fail(f"{path} has the unknown tensor framework {t.framework!r}")
        shape = list(t.shape)
        limit(f"the dimensions of {path}", len(shape), self.limits, "tensor_dims")
        if any(d < 0 for d in shape):
            _fail(f"{path} has a negative size in its shape {shape}")
        # numpy refuses shapes whose sizes (zeros aside) multiply past its index range
        limit(f"the bytes of {path} (its shape {shape})",
               math.prod(max(d, 1) for d in shape) * size, self.limits, "tensor_bytes")
        want = math.prod(shape) * size
        if len(t.data) != want:
            _fail(f"{path}: a {t.dtype} tensor of shape {shape} holds {want:,} bytes, but "
                  f"its data has {len(t.data):,}")


def check_bounds(plan: pb.Plan, limits: Limits) -> None:
    """Layer 1 (module doc): counts, ``ExecConfig`` numbers, rings, actors, example inputs.

    Example: ``check_bounds(plan, LIMITS)`` returns None for a plan ``lower`` wrote.

    Raises:
        PlanLimitError: a field beyond its bound (names the field and the limit).
        PlanStructureError: a malformed value or actor option (names it).
    """
    _check_counts(plan, limits)
    _check_numbers(plan, limits)
    values = Values(limits)
    for a in plan.graph.actors:
        _check_actor(a, limits, values)
    for i, v in enumerate(plan.example_args):
        values.walk(v, f"example_args[{i}]", 0, False)
    for nv in plan.example_kwargs:
        values.walk(nv.value, f"example_kwargs[{nv.name!r}]", 0, False)


def _only_limits(fn: Callable[..., None], *args: Any) -> None:
    """Run a check, keeping its ``PlanLimitError`` and dropping any other complaint."""
    try:
        fn(*args)
    except PlanLimitError:
        raise
    except PlanStructureError:
        pass


def check_limits(plan: pb.Plan, limits: Limits | None = None) -> None:
    """Every ``Limits`` bound of ``plan``, without the rest of the structure check: what a
    reader that never runs the plan (``cgc inspect``) enforces before printing it.

    Example: ``check_limits(plan)`` returns None for a plan ``lower`` wrote.

    Raises:
        PlanLimitError: a field beyond its bound (names the field and the limit).
    """
    limits = limits or LIMITS
    _check_counts(plan, limits)
    _check_numbers(plan, limits)
    rings = Rings(plan, limits)
    for ch in plan.lowered.channels:
        rings.add(ch.id, ch.kind == pb.CHAN_HOST, ch.slots, ch.slot_bytes, len(ch.readers))
        _only_limits(check_spec, ch.spec, f"Channel c{ch.id} spec", limits)
    rings.done()
    values = Values(limits)
    for a in plan.graph.actors:
        _only_limits(_check_actor, a, limits, values)
    for n in plan.graph.nodes:
        what = f"node %{n.id} ({n.name})"
        limit(f"num_returns of {what}", n.num_returns, limits, "num_returns")
        limit(f"the arguments of {what}", len(n.args) + len(n.kwargs), limits, "arguments")
        limit(f"the transport hints of {what}", len(n.hints), limits, "num_returns")
        for h in n.hints:
            _only_limits(check_spec, h.hint.spec, f"a transport hint of {what}", limits)
        for i, arg in enumerate(n.args):
            if arg.WhichOneof("kind") == "constant":
                _only_limits(values.walk, arg.constant, f"{what} args[{i}]", 0, False)
        for kw in n.kwargs:
            if kw.arg.WhichOneof("kind") == "constant":
                _only_limits(values.walk, kw.arg.constant, f"{what} kwargs[{kw.name!r}]", 0,
                             False)
    for c in plan.graph.collectives:
        _only_limits(check_spec, c.hint.spec, f"collective {c.id}'s hint", limits)
    for i, v in enumerate(plan.example_args):
        _only_limits(values.walk, v, f"example_args[{i}]", 0, False)
    for nv in plan.example_kwargs:
        _only_limits(values.walk, nv.value, f"example_kwargs[{nv.name!r}]", 0, False)
