"""Pass ``transports``: choose the transport of every edge and record why.

Rules, in order (``hint`` is the producer's ``TransportHint`` for that output, if any):

1. driver to driver (an input returned as an output): HOST.
2. NCCL hinted on an edge from or to the driver: error (the driver has no communicator).
3. same actor: LOCAL, the value stays in the actor's local table (an NCCL hint is moot).
4. NCCL hinted: NCCL; both actors must have a GPU (``num_gpus > 0``, or a live actor
   that held GPU ids when compiled: ``cgc.ir.graph.has_gpu``), else error.
5. a hint with transport AUTO and device not CPU, between two GPU actors: NCCL (as Ray's
   ``AutoTransportType``; where the two share one GPU the runtime binds CUDA IPC, without
   real GPUs the CPU communicator).
6. otherwise HOST; a device hint (CPU/GPU) on a host edge makes it DEVICE_COPY with
   ``Channel.device`` set; a GPU device hint for a CPU-only reader actor is an error.

No hint at all (the user never called ``with_tensor_transport``) always means HOST, as in
Ray: values that are not tensors cannot travel over NCCL. A hint that came from a Ray
Direct Transport name (a traced step's ``tensor_transport="nixl"``) says so in the edge's
reason: ``ray rdt nixl: auto hint: not both GPU actors``.
"""

from __future__ import annotations

from cgc.errors import CompileError
from cgc.ir import attrs as A
from cgc.ir.graph import gpu_held, where
from cgc.passes.state import LowerState, require
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb

__all__ = ["assign_transports", "pre", "post"]

_NAME = "transports"


def _hint_where(hint: pb.TransportHint | None) -> str:
    if hint is not None and hint.loc.file:
        return f" (hint at {hint.loc.file}:{hint.loc.line})"
    return ""


def _actor(graph: pb.Graph, name: str) -> pb.Actor:
    return next(x for x in graph.actors if x.name == name)


def _held(graph: pb.Graph, name: str) -> str:
    return gpu_held(_actor(graph, name))


def _give_gpu(graph: pb.Graph, name: str) -> str:
    a = _actor(graph, name)
    if a.external.name or a.external.actor_id:
        return "create the actor with a GPU (Cls.options(num_gpus=1).remote())"
    return "give it num_gpus"


def _decide(
    state: LowerState, src: int, dst: int, hint: pb.TransportHint | None
) -> tuple[pb.Transport, str, pb.Device]:
    g = state.g
    graph = g.graph[A.GRAPH]
    gpu = g.graph[A.GPU_ACTORS]
    a, b = g.nodes[src][A.ACTOR], g.nodes[dst][A.ACTOR]
    want = hint.transport if hint is not None else None
    device = hint.device if hint is not None else pb.DEVICE_DEFAULT
    if a == DRIVER and b == DRIVER:
        return pb.HOST, "driver input returned as output", pb.DEVICE_DEFAULT
    if want == pb.NCCL and DRIVER in (a, b):
        side = "from the driver's input" if a == DRIVER else "to the driver (graph output)"
        raise CompileError(
            f"{where(graph, src)}: nccl transport hint on an edge {side}{_hint_where(hint)}; "
            "the driver takes no part in NCCL — drop the hint or send the value to an actor"
        )
    if a == b:
        why = "same actor: nccl hint not needed" if want == pb.NCCL else "same actor"
        return pb.LOCAL, why, pb.DEVICE_DEFAULT
    if want == pb.NCCL:
        for actor in (a, b):
            if actor not in gpu:
                raise CompileError(
                    f"{where(graph, src)} -> {where(graph, dst)}: nccl transport hint, but "
                    f"actor {actor!r} has no GPU ({_held(graph, actor)}){_hint_where(hint)}; "
                    f"{_give_gpu(graph, actor)} or use the host transport"
                )
        return pb.NCCL, "nccl hint", device
    if want == pb.AUTO and a in gpu and b in gpu and device != pb.CPU:
        return pb.NCCL, "auto hint between GPU actors", device
    if (device == pb.GPU and b != DRIVER and b not in gpu
            and state.options.gpu_hint_without_gpu == "refuse"):
        raise CompileError(
            f"{where(graph, src)} -> {where(graph, dst)}: device=gpu hint, but reader "
            f"{b!r} has no GPU ({_held(graph, b)}){_hint_where(hint)}; "
            f"{_give_gpu(graph, b)} or drop device='gpu'"
        )
    if device != pb.DEVICE_DEFAULT:
        return pb.DEVICE_COPY, f"host memory, copied to {pb.Device.Name(device).lower()}", device
    if hint is None:
        return pb.HOST, "default: host memory", device
    if want == pb.AUTO:
        why = "auto hint: " + (
            "the driver takes part" if DRIVER in (a, b) else "not both GPU actors"
        )
        return pb.HOST, why, device
    return pb.HOST, "host hint", device


def assign_transports(state: LowerState) -> None:
    """Set TRANSPORT, REASON and DEVICE on every edge of ``state.g``.

    Example: after it, ``state.g.edges[2, 4, 0][attrs.TRANSPORT] == pb.NCCL``.

    Raises:
        CompileError: a hint that cannot hold (NCCL with the driver or a CPU-only actor,
            a GPU device hint for a CPU-only reader).
    """
    g = state.g
    for src, dst, key in sorted(g.edges(keys=True)):
        data = g.edges[src, dst, key]
        hint = data[A.HINT]
        transport, reason, device = _decide(state, src, dst, hint)
        if hint is not None and hint.requested:
            reason = f"ray rdt {hint.requested}: {reason}"
        data[A.TRANSPORT], data[A.REASON], data[A.DEVICE] = transport, reason, device


def pre(state: LowerState) -> None:
    require(state.g.number_of_nodes() == len(state.plan.graph.nodes), _NAME, "no working graph")


def post(state: LowerState) -> None:
    g = state.g
    for src, dst, _key, data in g.edges(keys=True, data=True):
        t = data.get(A.TRANSPORT)
        require(
            t in (pb.LOCAL, pb.HOST, pb.NCCL, pb.DEVICE_COPY), _NAME, f"edge {src}->{dst} has {t}"
        )
        same = g.nodes[src][A.ACTOR] == g.nodes[dst][A.ACTOR] != DRIVER
        require(same == (t == pb.LOCAL), _NAME, f"edge {src}->{dst}: LOCAL iff same actor")
