"""``start_graph``: from a ``Plan`` to a running ``CompiledGraph``.

Steps (each Ray round is batched over all actors, never one blocking call per task):

0. check the plan, resolve the config (plan values, ``start()`` overrides, runtime defaults),
   start/join Ray (restarting the local Ray cgc started, when it is too small for this plan
   and no graph is running), check placement (waiting up to ``PLACEMENT_WAIT_S`` for
   resources a torn-down graph still holds), create or bind the actors;
1. probe round: each actor builds its loop (methods, constants) and reports its node;
2. writers round: each actor creates the rings it writes (the driver creates the input
   rings meanwhile);
   Communicators are bound to a transport from where their members landed (NCCL between
   GPUs, CUDA IPC on a shared GPU, pinned host staging, the CPU communicator; see
   ``cgc.runtime.comm.binding``); rank 0 of each NCCL one makes its unique id here;
3. start round: each actor attaches its readers, joins its communicators in plan order
   (the NCCL ones with rank 0's id), warms every device p2p pair, sends one PING
   through every edge it writes and takes one from every edge it reads, then starts its
   loop thread; the driver writes PINGs on the input channels and reads them from the
   output channels (every edge is warmed once);
4. the monitor starts watching one ``wait_loop`` call per actor.

Any failure tears down what was made and raises ``SetupError`` (or ``PlacementError``).
A plan whose shared-memory rings do not fit in a node's /dev/shm is refused with
``ShmSpaceError`` (a ``SetupError``) in step 0 when the cluster is one node, else between
rounds 1 and 2: before any ring exists (``cgc.runtime.driver.shm_space``).

Example: ``graph = start_graph(plan, None)`` (what ``Plan.start()`` calls).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import RunConfig
from cgc.runtime.channels.errors import ChannelClosedError, ChannelTimeoutError
from cgc.runtime.driver.graph import CompiledGraph
from cgc.runtime.driver.graph_ends import input_label, input_picker
from cgc.runtime.driver.option_needs import check_option_needs
from cgc.runtime.embedded import plan_modules, register
from cgc.runtime.errors import CgcError, SetupError
from cgc.runtime.messages import PING, Ping
from cgc.runtime.ray_internals import call_in_actor, check_version

__all__ = ["start_graph", "bind_transports"]

log = logging.getLogger("cgc.runtime")
progress = logging.getLogger("cgc.runtime.progress")  # as in cluster.py: what start() does

# How long start() waits for busy resources (actors of a graph being torn down) to come
# free before the placement check fails.
PLACEMENT_WAIT_S = 30.0


def bind_transports(proto: pb.Plan, probes: dict[str, dict], node: dict[str, str],
                    choice: str, fake_hosts: bool) -> dict[int, Any]:
    """How each communicator of the plan is bound, from where its members landed:
    communicator id -> ``cgc.runtime.comm.binding.Binding`` (transport and reason).

    Members report no GPU when the cluster has none or ``communicator="cpu"`` (then every
    communicator runs on the CPU communicator; "nccl" fails, naming the members).

    Raises:
        SetupError: ``choice == "nccl"`` and members cannot run NCCL (named).
    """
    from cgc.runtime.comm.binding import bind_communicators

    members = {c.id: [(node[m], probes[m].get("gpu")) for m in c.members]
               for c in proto.lowered.communicators}
    return bind_communicators(members, choice, fake_hosts)


def _tcp_channels(low: pb.Lowered, node: dict[str, str], mode: str) -> set[int]:
    """Host channels to bind to TCP: endpoints on different nodes, or every one ("tcp", or
    a machine where the shared-memory ring is not proven correct)."""
    from cgc.runtime.channels import ring_supported

    if not ring_supported():
        if mode == "shm":
            raise SetupError("host_transport='shm': the shared-memory ring runs on x86_64 "
                             "only (its ordering argument rests on x86's); use 'auto' or 'tcp'")
        mode = "tcp"
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


def _one_node() -> bool:
    """Whether the Ray cluster has a single live node (every actor lands on the driver's)."""
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive")) == 1


def _check_rings_fit_early(proto: pb.Plan, cfg: RunConfig, driver_node: str) -> None:
    """Refuse, before any actor is made, a plan whose shared-memory rings cannot fit in
    this node's /dev/shm when all of them will be here (a one-node cluster). Where actors
    may land on other nodes, ``_check_rings_fit`` decides after the probe round.

    Raises:
        ShmSpaceError: they do not fit (see ``cgc.runtime.driver.shm_space``).
    """
    from cgc.runtime.channels import ring_supported, shm
    from cgc.runtime.driver.shm_space import check_shm_space, fits, ring_segment_bytes

    if cfg.host_transport == "tcp" or not ring_supported():
        return  # no rings at all
    rings = {ch.id: ring_segment_bytes(ch, cfg.slot_bytes) for ch in proto.lowered.channels
             if ch.kind == pb.CHAN_HOST}
    free = shm.shm_free_bytes()
    # Why the cluster is asked only now: a plan that fits even with every ring here (the
    # usual case) costs no Ray call.
    if fits(sum(rings.values()), free) or not _one_node():
        return
    check_shm_space(proto, rings, free, _where(driver_node, "the driver's node"),
                    cfg.slot_bytes)


def _where(node_id: str, who: str) -> str:
    from cgc.runtime.channels.shm import segment_dir

    return f"{who} (node {node_id[:12]}, {segment_dir()})"


def _check_rings_fit(proto: pb.Plan, cfg: RunConfig, tcp: set[int], node: dict[str, str],
                     probes: dict[str, dict], driver_node: str) -> None:
    """Refuse, before any ring is created, a plan whose shared-memory rings do not fit in
    the free space of the /dev/shm of the node they land on (this node's as this process
    reads it; another node's as its actors reported it in the probe round).

    Raises:
        ShmSpaceError: the rings of some node do not fit (see ``cgc.runtime.driver.shm_space``).
    """
    from cgc.runtime.channels import shm
    from cgc.runtime.driver.shm_space import check_shm_space, rings_on_node

    low = proto.lowered
    shm_cids = {ch.id for ch in low.channels if ch.kind == pb.CHAN_HOST and ch.id not in tcp}
    for node_id in sorted({node[ch.writer] for ch in low.channels if ch.id in shm_cids}):
        rings = rings_on_node(low, shm_cids, node, node_id, cfg.slot_bytes)
        if node_id == driver_node:
            free, who = shm.shm_free_bytes(), "the driver's node"
        else:
            here = sorted(n for n in probes if node[n] == node_id)
            free = min(int(probes[n].get("shm_free", 0)) for n in here)
            who = f"the node of actors {', '.join(here[:3])}"
        check_shm_space(proto, rings, free, _where(node_id, who), cfg.slot_bytes)


def _gather(refs: dict[Any, str], deadline: float, what: str) -> dict[str, Any]:
    """``ray.get`` a round of calls; name the actors that failed or did not answer."""
    import ray

    left = max(0.0, deadline - time.monotonic())
    ready, not_ready = ray.wait(list(refs), num_returns=len(refs), timeout=left)
    out: dict[str, Any] = {}
    errors = []
    kinds: set[type] = set()
    for r in ready:
        try:
            out[refs[r]] = ray.get(r)
        except Exception as exc:  # noqa: BLE001 - report per actor
            cause = getattr(exc, "cause", None) or exc
            kinds.add(type(cause))
            errors.append(f"actor {refs[r]}: {type(cause).__name__}: {cause}")
    errors += [f"actor {refs[r]}: no answer within the set-up timeout" for r in not_ready]
    if errors:
        # One kind of SetupError from every failing actor (a weight-sync mismatch, say)
        # keeps its type, so callers can catch it.
        kind = kinds.pop() if len(kinds) == 1 and not not_ready else SetupError
        kind = kind if issubclass(kind, SetupError) else SetupError
        raise kind(f"{what} failed:\n  " + "\n  ".join(sorted(errors)))
    return out


def start_graph(plan: Any, address: str | None, **overrides: Any) -> CompiledGraph:
    """Start ``plan`` on Ray (see module docstring); return the running graph.

    ``overrides`` are ``RunConfig`` fields (``None`` = the plan's value).

    Raises:
        ConfigError: a bad override. VerifyError: the plan is malformed or can deadlock.
        PlacementError, SetupError.
    """
    from cgc.plan_schema.verify import verify_plan
    from cgc.runtime.driver.cluster import check_placement, ensure_ray, gpu_notice, ray_session
    from cgc.runtime.driver.plan_actors import make_actors
    from cgc.runtime.driver.session import track_session

    t0 = time.perf_counter()
    proto = plan.proto
    # The same structure check and deadlock verifier as `cgc check`: a plan file is an
    # input from a stranger until proven otherwise.
    verify_plan(proto)
    cfg = RunConfig.from_plan(proto.config, **overrides)
    # What the options need installed: refused here, before Ray or any actor starts.
    check_option_needs(cfg.torch_profile, cfg.nvtx, cfg.dashboard, address)
    # Results may be instances of classes from the model file: make it importable here.
    register(plan_modules(proto))
    t_ray = time.perf_counter()
    info = ensure_ray(proto, address, cfg.communicator, dashboard=cfg.dashboard)
    ray_s = time.perf_counter() - t_ray  # starting (or joining) Ray: not cgc's own set-up
    progress.info("Ray is up (%.1f s); creating %d actor(s)", ray_s, len(proto.graph.actors))
    check_version()  # another Ray release than cgc's use of its internals was written for: warn once
    notice = gpu_notice(proto, info, cfg.communicator)
    if notice:
        log.warning(notice)
    # A graph torn down just before may still hold its resources for a moment.
    check_placement(proto, info.drop_gpus, wait_s=min(PLACEMENT_WAIT_S, cfg.setup_timeout))
    from cgc.runtime.channels import sweep_dead_segments
    from cgc.runtime.endpoints import new_graph_prefix, new_graph_secret

    # Segments that crashed or killed processes left behind go before anything new is made.
    sweep_dead_segments()
    # A plan whose rings cannot fit in /dev/shm is refused before any actor exists.
    _check_rings_fit_early(proto, cfg, info.driver_node)
    gid = uuid.uuid4().hex[:10]
    graph = CompiledGraph(plan, gid, new_graph_prefix(), cfg, ray_session=ray_session())
    # ray.shutdown() of this session tears the graph down first (as Ray does its own).
    track_session()
    secret = new_graph_secret()
    deadline = time.monotonic() + cfg.setup_timeout
    try:
        graph.bind_actors(*make_actors(plan, info.drop_gpus, gid))
        _setup_rounds(graph, proto, cfg, info, secret, deadline)
    except BaseException as exc:
        graph.teardown()
        if isinstance(exc, CgcError) or not isinstance(exc, Exception):
            raise  # a KeyboardInterrupt (Ctrl-C during start) stays one, the graph torn down
        raise SetupError(f"starting plan {proto.name!r} failed: {type(exc).__name__}: "
                         f"{exc}") from exc
    graph.started(time.perf_counter() - t0, ray_s)
    progress.info("graph %r started (%.1f s)", proto.name, graph.setup_seconds)
    return graph


def _wake_ahead(graph: CompiledGraph, proto: pb.Plan, cfg: RunConfig) -> int:
    """Create the graph's doorbells when wake-ahead applies; return the window (0: off).

    The depths are the plan's (``Program.wake_depth``, pass ``wake``); only the window is
    decided here, from the run configuration and this machine's cores. Applies when the
    window is >= 1, some actor is two or more hops from the driver, and the kernel has
    ``futex_waitv`` (else readers could not wait on a bell).
    """
    from cgc.runtime.channels.bell import Bells
    from cgc.runtime.channels.futex import HAVE_WAITV
    from cgc.runtime.driver.wake import wake_window

    window = wake_window(cfg.wake_ahead)
    deepest = max((p.wake_depth for p in proto.lowered.programs), default=0)
    if window < 1 or deepest < 2 or not HAVE_WAITV:
        return 0
    graph.use_bells(Bells.create(graph.prefix + "bell", deepest),
                    list(range(2, min(1 + window, deepest) + 1)))
    return window


def _setup_rounds(graph: CompiledGraph, proto: pb.Plan, cfg: RunConfig, info: Any,
                  secret: bytes, deadline: float) -> None:
    from cgc.runtime.actor import entry as ex
    from cgc.runtime.actor.loop_state import LoopOptions
    from cgc.runtime.channels import janitor
    from cgc.runtime.comm.binding import fake_hosts_enabled
    from cgc.runtime.driver.monitor import Monitor
    from cgc.runtime.endpoints import open_host_reader, open_host_writer

    handles = graph.actors
    low = proto.lowered
    fake_hosts = fake_hosts_enabled()
    window = _wake_ahead(graph, proto, cfg)
    opts = LoopOptions(prefix=graph.prefix, secret=secret, spin_us=cfg.spin_us,
                       slot_bytes=cfg.slot_bytes, trace=bool(cfg.trace),
                       torch_profile=cfg.torch_profile, nvtx=cfg.nvtx,
                       ray_events=cfg.ray_events, fake_hosts=fake_hosts,
                       probe_gpu=info.has_gpus and cfg.communicator != "cpu",
                       wake_ahead=window,
                       max_frame_bytes=cfg.max_frame_bytes, cuda_graphs=cfg.cuda_graphs)
    plan_bytes = proto.SerializeToString()
    # Round 1: probe (also waits for actor creation; constructor errors surface here).
    probes = _gather({call_in_actor(h, ex.setup_probe, graph.gid, plan_bytes, n, opts): n
                      for n, h in handles.items()}, deadline, "starting the actors")
    progress.info("%d actor(s) up; connecting their channels", len(probes))
    node = {n: p["node"] for n, p in probes.items()}
    node[DRIVER] = info.driver_node
    # Before any segment exists: should this driver die (even by SIGKILL), its janitor
    # removes the graph's segments once these actors are gone too.
    janitor.watch(graph.prefix, sorted(p["pid"] for n, p in probes.items()
                                       if p["node"] == info.driver_node))
    graph.record_nodes(node)
    tcp = _tcp_channels(low, node, cfg.host_transport)
    # Before round 2 creates any ring: every node's rings must fit in its /dev/shm.
    _check_rings_fit(proto, cfg, tcp, node, probes, info.driver_node)
    bindings = {
        ch.id: ("tcp" if ch.id in tcp else "shm") for ch in low.channels if ch.kind == pb.CHAN_HOST
    }
    binds = bind_transports(proto, probes, node, cfg.communicator, fake_hosts)
    transports = {cid: b.transport for cid, b in binds.items()}
    for ch in low.channels:
        if ch.kind == pb.CHAN_NCCL:
            bindings[ch.id] = transports[ch.communicator]
    graph.record_bindings(bindings, dict(binds))
    # Round 2: writers create their rings (or TCP listeners); the driver its input ones.
    import ray

    my_ip = ray.util.get_node_ip_address()
    refs = {call_in_actor(h, ex.setup_writers, graph.gid, tcp, probes[n]["ip"], transports): n
            for n, h in handles.items()}
    by_id = {c.id: c for c in low.channels}
    ends = graph.endpoints
    addrs: dict[int, tuple[str, int]] = {}
    for cid in dict.fromkeys(low.input_channels):
        ch = by_id[cid]
        w = open_host_writer(ch, graph.prefix, tcp=cid in tcp, ip=my_ip, secret=secret,
                             spin_us=cfg.spin_us, default_slot_bytes=cfg.slot_bytes,
                             max_frame_bytes=cfg.max_frame_bytes)
        if cid in tcp:
            addrs[cid] = (my_ip, w.port)
        src = proto.graph.nodes[ch.source.node]
        ends.add_input(w, input_picker(src), input_label(src))
    nccl_ids: dict[int, bytes] = {}
    for got in _gather(refs, deadline, "creating channels").values():
        addrs.update(got["addrs"])
        nccl_ids.update(got["nccl_ids"])
    # Round 3: attach/connect, warm every edge, start the loops.
    left = max(1.0, deadline - time.monotonic())
    refs = {call_in_actor(h, ex.setup_start, graph.gid, left, addrs, nccl_ids): n
            for n, h in handles.items()}
    try:
        for cid in ends.out_channels:  # connect before accepting: see ActorLoop.open_readers
            ends.add_output(open_host_reader(
                by_id[cid], graph.prefix, DRIVER, addrs[cid] if cid in tcp else None,
                secret=secret, spin_us=cfg.spin_us, timeout=left,
                max_frame_bytes=cfg.max_frame_bytes))
        for cid, w in zip(dict.fromkeys(low.input_channels), ends.writers, strict=True):
            if cid in tcp:
                w.accept(left)
        ends.write_warmup(PING, left)
    except (ChannelClosedError, ChannelTimeoutError):
        pass  # an actor's set-up failed and poisoned its channels: _gather says why
    _gather(refs, deadline, "warming up the channels")
    warm = ends.read_warmup(max(0.1, deadline - time.monotonic()))
    if any(type(v) is not Ping for v in warm):
        raise SetupError(f"warm-up: the driver read {warm!r} instead of the warm-up markers")
    waiters = {call_in_actor(h, ex.wait_loop, graph.gid, system_group=True): n
               for n, h in handles.items()}
    graph.watch(Monitor(graph, waiters))
    graph.monitor.start()
