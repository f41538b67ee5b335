"""``start_graph``: from a ``Plan`` to a running ``CompiledGraph``.

Steps (each Ray round is batched over all actors, never one blocking call per task):

0. check the plan, resolve the config (plan values, ``start()`` overrides, runtime defaults),
   start/join Ray, check placement, create or bind the actors;
1. probe round: each actor builds its loop (methods, constants) and reports its node;
2. writers round: each actor creates the rings it writes (the driver creates the input
   rings meanwhile);
3. start round: each actor attaches its readers, joins its communicators, sends one PING
   through every edge it writes and takes one from every edge it reads, then starts its
   loop thread; the driver writes PINGs on the input channels and reads them from the
   output channels (every edge is warmed once);
4. the monitor starts watching one ``wait_loop`` call per actor.

Any failure tears down what was made and raises ``SetupError`` (or ``PlacementError``).

Example: ``graph = start_graph(plan, None)`` (what ``Plan.start()`` calls).
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from typing import Any

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.channels.errors import ChannelClosedError, ChannelTimeoutError
from cgc.runtime.driver import CompiledGraph
from cgc.runtime.embedded import plan_modules, register
from cgc.runtime.endpoints import DEFAULT_SLOTS
from cgc.runtime.errors import CgcError, SetupError
from cgc.runtime.wire import PING, Ping, input_value

__all__ = ["start_graph", "resolve_config", "DEFAULTS"]

log = logging.getLogger("cgc.runtime")

# Used when the plan's config leaves a field at 0 (hand-built or old plans).
DEFAULTS = {"capacity": 4, "submit_timeout": 30.0, "get_timeout": None,
            "teardown_timeout": 10.0, "setup_timeout": 120.0, "max_buffered_results": 1000}


def _limit(v: float | None) -> float | None:
    """0, negative or infinite means "no limit" (None)."""
    if v is None or v <= 0 or math.isinf(v):
        return None
    return float(v)


def resolve_config(proto: pb.Plan, **over: Any) -> dict[str, Any]:
    """Effective run settings: ``start()`` overrides > ``plan.config`` > ``DEFAULTS``.

    Example: ``resolve_config(plan, get_timeout=5)["get_timeout"] == 5.0``.
    """
    c = proto.config

    def pick(name: str, field: float) -> float | None:
        if over.get(name) is not None:
            return _limit(over[name])
        return _limit(field) if field else DEFAULTS[name]

    return {
        "capacity": int(over.get("capacity") or c.capacity or DEFAULTS["capacity"]),
        "submit_timeout": pick("submit_timeout", c.submit_timeout_s),
        "get_timeout": pick("get_timeout", c.get_timeout_s),
        "teardown_timeout": pick("teardown_timeout", c.teardown_timeout_s) or 3600.0,
        "setup_timeout": pick("setup_timeout", c.setup_timeout_s) or 3600.0,
        "spin_us": float(over["spin_us"] if over.get("spin_us") is not None else c.spin_us),
        "slot_bytes": int(c.default_slot_bytes),
        "max_buffered_results": int(c.max_buffered_results
                                    or DEFAULTS["max_buffered_results"]),
        "host_transport": over.get("host_transport") or "auto",
    }


def _input_picker(node: pb.Node) -> Any:
    if node.kind == pb.INPUT:
        return input_value
    index, field = node.index, (node.field if node.key_kind == pb.FIELD else None)
    if field is None:
        return lambda args, kwargs: args[index]
    return lambda args, kwargs: kwargs[field]


def _tcp_channels(low: pb.Lowered, node: dict[str, str], mode: str) -> set[int]:
    """Host channels to bind to TCP: endpoints on different nodes, or every one ("tcp")."""
    if mode not in ("auto", "shm", "tcp"):
        raise SetupError(f"host_transport must be 'auto', 'shm' or 'tcp', not {mode!r}")
    out = set()
    for ch in low.channels:
        if ch.kind != pb.CHAN_HOST:
            continue
        nodes = {node[ch.writer]} | {node[r] for r in ch.readers}
        if mode == "tcp" or len(nodes) > 1:
            out.add(ch.id)
    if out and mode == "shm":
        raise SetupError("host_transport='shm' but some channels cross nodes")
    return out


def _gather(refs: dict[Any, str], deadline: float, what: str) -> dict[str, Any]:
    """``ray.get`` a round of calls; name the actors that failed or did not answer."""
    import ray

    left = max(0.0, deadline - time.monotonic())
    ready, not_ready = ray.wait(list(refs), num_returns=len(refs), timeout=left)
    out: dict[str, Any] = {}
    errors = []
    for r in ready:
        try:
            out[refs[r]] = ray.get(r)
        except Exception as exc:  # noqa: BLE001 - report per actor
            cause = getattr(exc, "cause", None) or exc
            errors.append(f"actor {refs[r]}: {type(cause).__name__}: {cause}")
    errors += [f"actor {refs[r]}: no answer within the set-up timeout" for r in not_ready]
    if errors:
        raise SetupError(f"{what} failed:\n  " + "\n  ".join(sorted(errors)))
    return out


def start_graph(plan: Any, address: str | None, *, communicator: str = "auto",
                **overrides: Any) -> CompiledGraph:
    """Start ``plan`` on Ray (see module docstring); return the running graph.

    Raises:
        PlanFormatError, PlacementError, SetupError.
    """
    from cgc.runtime.actors import make_actors
    from cgc.runtime.cluster import check_placement, ensure_ray, gpu_notice
    from cgc.runtime.plan import check_runnable

    t0 = time.perf_counter()
    proto = plan.proto
    check_runnable(proto)
    # Results may be instances of classes from the model file: make it importable here.
    register(plan_modules(proto))
    if communicator not in ("auto", "cpu", "nccl"):
        raise SetupError(f"communicator must be 'auto', 'cpu' or 'nccl', not {communicator!r}")
    cfg = resolve_config(proto, **overrides)
    info = ensure_ray(proto, address, communicator)
    notice = gpu_notice(proto, info)
    if notice:
        log.warning(notice)
    check_placement(proto, info.drop_gpus)
    # Why the clamp: with no more executions in flight than the driver's channels hold,
    # no actor ever blocks writing a result the driver has not read yet, so execute()'s
    # input writes always drain (the capacity pass computes it this way too).
    driver_chans = list(proto.lowered.input_channels) + list(proto.lowered.output_channels)
    room = min((proto.lowered.channels[c - 1].slots or DEFAULT_SLOTS for c in driver_chans),
               default=cfg["capacity"])
    if cfg["capacity"] > room:
        if overrides.get("capacity"):
            log.warning("cgc: capacity %d exceeds the %d slots of the driver's channels; "
                        "using %d", cfg["capacity"], room, room)
        cfg["capacity"] = room
    gid = uuid.uuid4().hex[:10]
    graph = CompiledGraph(plan, gid, f"cgc-{os.getpid()}-{gid}", cfg)
    deadline = time.monotonic() + cfg["setup_timeout"]
    try:
        graph.actors, graph.created = make_actors(plan, info.drop_gpus)
        _setup_rounds(graph, proto, cfg, info, deadline)
    except BaseException as exc:
        graph.teardown()
        if isinstance(exc, CgcError):
            raise
        raise SetupError(f"starting plan {proto.name!r} failed: {type(exc).__name__}: "
                         f"{exc}") from exc
    graph._register()
    graph.setup_seconds = time.perf_counter() - t0
    return graph


def _setup_rounds(graph: CompiledGraph, proto: pb.Plan, cfg: dict, info: Any,
                  deadline: float) -> None:
    from cgc.runtime import actor_calls as ex
    from cgc.runtime.endpoints import open_host_reader, open_host_writer
    from cgc.runtime.monitor import Monitor

    handles = graph.actors
    low = proto.lowered
    opts = {"prefix": graph.prefix, "spin_us": cfg["spin_us"], "slot_bytes": cfg["slot_bytes"],
            "force_cpu": info.drop_gpus}
    plan_bytes = proto.SerializeToString()
    # Round 1: probe (also waits for actor creation; constructor errors surface here).
    probes = _gather({h.__ray_call__.remote(ex.setup_probe, graph.gid, plan_bytes, n, opts): n
                      for n, h in handles.items()}, deadline, "starting the actors")
    node = {n: p["node"] for n, p in probes.items()}
    node[DRIVER] = info.driver_node
    tcp = _tcp_channels(low, node, cfg["host_transport"])
    graph.channel_bindings = {
        ch.id: ("tcp" if ch.id in tcp else "shm") for ch in low.channels if ch.kind == pb.CHAN_HOST
    }
    # Round 2: writers create their rings (or TCP listeners); the driver its input ones.
    import ray

    my_ip = ray.util.get_node_ip_address()
    refs = {h.__ray_call__.remote(ex.setup_writers, graph.gid, tcp, probes[n]["ip"]): n
            for n, h in handles.items()}
    by_id = {c.id: c for c in low.channels}
    addrs: dict[int, tuple[str, int]] = {}
    for cid in dict.fromkeys(low.input_channels):
        ch = by_id[cid]
        w = open_host_writer(ch, graph.prefix, tcp=cid in tcp, spin_us=cfg["spin_us"],
                             default_slot_bytes=cfg["slot_bytes"])
        if cid in tcp:
            addrs[cid] = (my_ip, w.port)
        graph._in_writers.append(w)
        graph._inputs.append((w.write, _input_picker(proto.graph.nodes[ch.source.node])))
    for got in _gather(refs, deadline, "creating channels").values():
        addrs.update(got)
    # Round 3: attach/connect, warm every edge, start the loops.
    left = max(1.0, deadline - time.monotonic())
    refs = {h.__ray_call__.remote(ex.setup_start, graph.gid, left, addrs): n
            for n, h in handles.items()}
    uniq = list(dict.fromkeys(low.output_channels))
    try:
        for cid in uniq:  # connect before accepting: see ActorLoop.open_readers_and_comms
            graph._out_readers.append(open_host_reader(
                by_id[cid], graph.prefix, DRIVER, addrs[cid] if cid in tcp else None,
                spin_us=cfg["spin_us"], timeout=left))
        for cid, w in zip(dict.fromkeys(low.input_channels), graph._in_writers, strict=True):
            if cid in tcp:
                w.accept(left)
        for w in graph._in_writers:
            w.write(PING, left)
    except (ChannelClosedError, ChannelTimeoutError):
        pass  # an actor's set-up failed and poisoned its channels: _gather says why
    graph._out_pos = [uniq.index(c) for c in low.output_channels]
    _gather(refs, deadline, "warming up the channels")
    for r in graph._out_readers:
        v = r.read(max(0.1, deadline - time.monotonic()))
        if type(v) is not Ping:
            raise SetupError(f"warm-up: the driver read {v!r} instead of the warm-up marker")
    waiters = {h.__ray_call__.options(concurrency_group="_ray_system").remote(
        ex.wait_loop, graph.gid): n for n, h in handles.items()}
    graph.monitor = Monitor(graph, waiters)
    graph.monitor.start()

