"""Starting or joining Ray, and checking that the plan's actors can be placed.

Sizing decision (documented in the issue): actors keep Ray's own defaults (an actor that
names no ``num_cpus`` reserves 1 CPU to be placed). When cgc starts the local Ray itself
(no address, Ray not initialized) it declares ``max(os.cpu_count(), sum of the actors' CPU
needs)`` logical CPUs and the custom resources the plan asks for, so an 8-actor plan runs
on a 2-core machine. Logical CPUs are only a placement count: cgc's loops sleep when idle.
On a machine without GPUs it also declares as many logical GPUs as the actors ask for,
so a GPU plan keeps its placement and runs with every communicator on the CPU one. With
real GPUs, ``communicator="cpu"`` drops the actors' ``num_gpus``, so a plan for more GPUs
than the cluster has still runs. When joining a cluster (``"auto"`` or a URL) or reusing
an initialized Ray, nothing is resized: the plan is checked against the nodes, unplaceable
actors are named, and on a cluster without GPUs ``num_gpus`` is dropped.

Example::

    info = ensure_ray(plan.proto, None)   # starts a local Ray sized for the plan
    check_placement(plan.proto, drop_gpus=info.drop_gpus)
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.errors import PlacementError, SetupError

__all__ = ["RayInfo", "ensure_ray", "actor_demand", "plan_totals", "check_placement",
           "gpu_notice", "ray_session", "local_ray_sizing",
           "forget_local_ray"]

log = logging.getLogger("cgc.runtime")
# What start() is doing, step by step (``cgc run`` prints it; silent for the API by default).
progress = logging.getLogger("cgc.runtime.progress")


@dataclass
class RayInfo:
    """What start-up learned about the cluster."""

    started_here: bool
    has_gpus: bool    # real GPUs (not the logical ones declared for a GPU-less machine)
    drop_gpus: bool   # num_gpus requests are ignored (a joined cluster without GPUs)
    driver_node: str
    logical_gpus: bool = False  # the local Ray declared GPUs this machine does not have


def local_gpu_count() -> int:
    """GPUs this process could see, without importing CUDA: NVIDIA device files, limited
    by ``CUDA_VISIBLE_DEVICES`` when set.

    Example:
        >>> local_gpu_count() >= 0
        True
    """
    import glob

    found = len(glob.glob("/dev/nvidia[0-9]*"))
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        return found
    ids = [v for v in vis.split(",") if v.strip() and v.strip() != "-1"]
    return min(found, len(ids))


def actor_demand(actor: pb.Actor, drop_gpus: bool) -> dict[str, float]:
    """Resources the actor needs to be placed (Ray's default: 1 CPU when none is named)."""
    if actor.external.name or actor.external.actor_id:
        return {}
    opts = actor.options
    need: dict[str, float] = {"CPU": opts.num_cpus if opts.HasField("num_cpus") else 1.0}
    if opts.HasField("num_gpus") and opts.num_gpus and not drop_gpus:
        need["GPU"] = opts.num_gpus
    if opts.HasField("memory") and opts.memory:
        need["memory"] = opts.memory
    for r in opts.resources:
        need[r.name] = need.get(r.name, 0.0) + r.amount
    return {k: v for k, v in need.items() if v > 0}


# Seconds a Ctrl-C waits for ray.init() to return before the `cgc` program abandons it
# (the environment's CGC_RAY_INIT_ABANDON_S, where set, instead: tests set 0).
RAY_INIT_ABANDON_S = 2.0


def _ray_init_abandon_s() -> float:
    """RAY_INIT_ABANDON_S, or CGC_RAY_INIT_ABANDON_S from the environment when it is a number."""
    try:
        return max(0.0, float(os.environ.get("CGC_RAY_INIT_ABANDON_S", RAY_INIT_ABANDON_S)))
    except ValueError:
        return RAY_INIT_ABANDON_S


def ensure_ray(plan: pb.Plan, address: str | None, communicator: str = "auto",
               dashboard: bool = False) -> RayInfo:
    """Make sure this process is connected to Ray; start a sized local one if needed.

    ``dashboard`` starts Ray's dashboard with a local Ray started here (a joined cluster
    or an already initialized Ray keeps whatever it has).

    Example: ``ensure_ray(plan.proto, None, dashboard=True)`` (what ``cgc run
    --dashboard`` does) prints nothing and returns ``RayInfo(started_here=True, ...)``.

    Raises:
        SetupError: Ray cannot be started or the address cannot be reached.
    """
    import ray

    started = logical = False
    if ray.is_initialized() and address is None and _OWN.get("ray"):
        _restart_if_too_small(plan)
    if not ray.is_initialized():
        # Why: under `uv run`, Ray would otherwise rewrite worker commands to use uv.
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        kwargs: dict = {"include_dashboard": dashboard, "log_to_driver": True,
                        "configure_logging": False}
        if address is None:
            # "local": a new cluster of our own. Plain ray.init() would join whatever
            # cluster /tmp/ray/ray_current_cluster or RAY_ADDRESS names - on a shared
            # machine possibly another user's.
            kwargs["address"] = "local"
            sizing = local_ray_sizing(plan)
            kwargs.update(sizing)
            logical = "num_gpus" in sizing
        else:
            kwargs["address"] = address
        from cgc.runtime.driver.interrupts import deferred_interrupts

        if address is None:
            progress.info("starting a local Ray with %s CPUs (Ray takes a few seconds)",
                          kwargs["num_cpus"])
        else:
            progress.info("joining the Ray cluster at %s", address)
        # Why held: a SIGINT while Ray starts can crash Ray's IO thread (SIGSEGV); one that
        # arrives meanwhile is raised as soon as ray.init() has returned. In the `cgc`
        # program, a ray.init() still running RAY_INIT_ABANDON_S after it is abandoned: its
        # processes (our children) are killed and the program exits with 130 at once.
        with deferred_interrupts(abandon_after_s=_ray_init_abandon_s()):
            try:
                ray.init(**kwargs)
            except Exception as exc:  # noqa: BLE001 - surfaced as one clear line
                target = f"the Ray cluster at {address!r}" if address else "a local Ray"
                raise SetupError(f"cannot start or join {target}: {exc}") from exc
            started = address is None
            _OWN["ray"] = started
    if not started and _LOGICAL.get("gpus"):
        logical = True  # the local Ray an earlier start() of this process declared
    declared = ray.cluster_resources().get("GPU", 0) > 0
    if logical:
        _LOGICAL["gpus"] = True
    has_gpus = declared and not logical
    # communicator="cpu" on a cluster with real GPUs runs the plan as if it had none, so a
    # plan for more GPUs than the machine has still runs (e.g. a 2-GPU plan on one GPU).
    drop = not declared or (has_gpus and communicator == "cpu")
    return RayInfo(started, has_gpus, drop, ray.get_runtime_context().get_node_id(), logical)


def local_ray_sizing(plan: pb.Plan, gpus_here: int | None = None) -> dict[str, Any]:
    """``ray.init`` sizes for the local Ray cgc starts for ``plan`` (module doc): logical
    CPUs, the custom resources, and logical GPUs when this machine has none (``gpus_here``
    defaults to ``local_gpu_count()``).

    Example: ``local_ray_sizing(plan)["num_cpus"] >= 2`` for a two-actor plan.

    Raises:
        SetupError: an amount that is not a finite number >= 0 (the structure check refuses
            such plans; this guards plans that were never checked).
    """
    total = plan_totals(plan)
    for k, v in total.items():
        if not math.isfinite(v) or v < 0:
            raise SetupError(f"plan {plan.name!r} asks for {v} of resource {k!r}")
    out: dict[str, Any] = {
        "num_cpus": max(os.cpu_count() or 1, math.ceil(total.get("CPU", 0.0) - 1e-3))}
    custom = {k: v for k, v in total.items() if k not in ("CPU", "GPU", "memory")}
    if custom:
        out["resources"] = custom
    gpus = total.get("GPU", 0.0)
    if gpus and not (local_gpu_count() if gpus_here is None else gpus_here):
        out["num_gpus"] = math.ceil(gpus - 1e-3)
    return out


def ray_session() -> str:
    """Which Ray connection this process has now ("" when none): the driver's node and job.

    Why: a graph's actor handles belong to the connection it started in. After
    ``ray.shutdown()`` (and perhaps a new ``ray.init()``), tearing the graph down must not
    touch them: a call would start a new Ray, or reach into another cluster.

    Example: ``ray_session() == graph.ray_session`` while the graph's Ray is still up.
    """
    import ray

    if not ray.is_initialized():
        return ""
    try:
        ctx = ray.get_runtime_context()
        return f"{ctx.get_node_id()}:{ctx.get_job_id()}"
    except Exception:  # noqa: BLE001 - shutting down right now
        return ""


_LOGICAL: dict[str, bool] = {}  # whether this process's local Ray has logical GPUs only
_OWN: dict[str, bool] = {}  # "ray": this process's Ray is the local one cgc started


def forget_local_ray() -> None:
    """Forget that cgc started this process's Ray (its session ended: a later ``ray.init()``
    is the user's, which cgc must never restart).

    Example: ``forget_local_ray()`` in the ``ray.shutdown()`` hook.
    """
    _OWN.clear()
    _LOGICAL.clear()


def plan_totals(plan: pb.Plan) -> dict[str, float]:
    """What all actors the plan creates need together (GPUs kept), by resource.

    Example: two default actors -> ``{"CPU": 2.0}``.
    """
    total: dict[str, float] = {}
    for a in plan.graph.actors:
        for k, v in actor_demand(a, False).items():
            total[k] = total.get(k, 0.0) + v
    return total


def _restart_if_too_small(plan: pb.Plan) -> None:
    """The local Ray cgc started for an earlier plan was sized for that plan: when this
    one needs more than it declared and no graph of this process is running, shut it down
    so that ``ensure_ray`` starts one sized for this plan (a running graph's actors would
    die with it: then the placement check names what is missing)."""
    import ray

    from cgc.runtime.driver.graph import live_graphs

    have = ray.cluster_resources()
    need = plan_totals(plan)
    fixed = {"memory"} | ({"GPU"} if local_gpu_count() else set())  # not ours to declare
    short = {k: v for k, v in need.items() if k not in fixed and have.get(k, 0.0) < v}
    # Live actors the plan binds to live in this Ray: restarting it would kill them.
    external = any(a.external.name or a.external.actor_id for a in plan.graph.actors)
    if not short or live_graphs() or external:
        return
    log.info("cgc: restarting the local Ray for plan %r (it needs %s; the local Ray, "
             "started for an earlier plan, has %s)", plan.name, _fmt(short),
             _fmt({k: have.get(k, 0.0) for k in short}))
    ray.shutdown()
    forget_local_ray()


def gpu_notice(plan: pb.Plan, info: RayInfo, communicator: str = "auto") -> str | None:
    """The one-line notice when GPU requests are dropped or GPU edges run on the CPU
    communicator for want of GPUs (None when neither happens)."""
    gpu_actors = [a.name for a in plan.graph.actors
                  if a.options.HasField("num_gpus") and a.options.num_gpus]
    nccl = any(c.kind == pb.CHAN_NCCL for c in plan.lowered.channels) or bool(
        plan.lowered.communicators)
    on_cpu = nccl and (communicator == "cpu" or not info.has_gpus)
    dropped = gpu_actors and info.drop_gpus
    if not on_cpu and not dropped:
        return None
    why = ("communicator='cpu'" if communicator == "cpu" and info.has_gpus
           else "no GPUs in the cluster" if not info.logical_gpus
           else "no GPUs on this machine (the local Ray declares logical ones)")
    parts = []
    if on_cpu:
        parts.append("NCCL channels and collectives run on the CPU communicator")
    if dropped:
        parts.append(f"num_gpus of {', '.join(gpu_actors)} ignored")
    return f"cgc: {why}: " + "; ".join(parts)


def _fmt(need: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(need.items())) + "}"


def check_placement(plan: pb.Plan, drop_gpus: bool, wait_s: float = 0.0) -> None:
    """Check every actor the plan creates fits the cluster; name the ones that do not.

    When the actors fit the nodes but not what is free now, it waits up to ``wait_s``
    seconds for resources to come free: Ray releases a torn-down graph's actors a moment
    after ``teardown()`` returns.

    Example: joining a CPU-only cluster with a ``num_gpus=1`` actor (and
    ``communicator="nccl"``) raises ``PlacementError: actor w0 needs {CPU: 1, GPU: 1} ...``.

    Raises:
        PlacementError: one line per actor that cannot be placed, with what the nodes have
            (and, for resources not free, how long it waited).
    """
    import time

    deadline = time.monotonic() + wait_s
    while True:
        problems, only_busy = _placement_problems(plan, drop_gpus)
        if not problems:
            return
        if not only_busy or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    waited = f" (waited {wait_s:g} s for resources to come free)" if only_busy and wait_s else ""
    raise PlacementError(
        f"plan {plan.name!r}: {len(problems)} actor(s) cannot be placed{waited}:\n  "
        + "\n  ".join(problems)
        + "\n(free resources on the cluster, or change the actors' options and recompile)"
    )


def _placement_problems(plan: pb.Plan, drop_gpus: bool) -> tuple[list[str], bool]:
    """(one line per actor that cannot be placed, whether every one would fit once the
    cluster's resources are free)."""
    import ray

    only_busy = True
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    totals = [dict(n.get("Resources", {})) for n in nodes]
    free = dict(ray.available_resources())
    problems: list[str] = []
    for actor in plan.graph.actors:
        need = actor_demand(actor, drop_gpus)
        if not need:
            continue
        if not any(all(t.get(k, 0.0) >= v for k, v in need.items()) for t in totals):
            biggest = max(totals, key=lambda t: t.get("CPU", 0.0), default={})
            have = {k: biggest.get(k, 0.0) for k in need}
            problems.append(
                f"actor {actor.name} needs {_fmt(need)} but no node has that "
                f"(largest node offers {_fmt(have)})"
            )
            only_busy = False
            continue
        short = {k: free.get(k, 0.0) for k, v in need.items() if free.get(k, 0.0) < v}
        if short:
            problems.append(
                f"actor {actor.name} needs {_fmt(need)} but the cluster has only "
                f"{_fmt(short)} free now"
            )
            continue
        for k, v in need.items():
            free[k] = free.get(k, 0.0) - v
    return problems, only_busy
