"""Ray Compiled Graph GPU programs written as Ray users write them — live actors from
``ray.remote(num_gpus=...)(Cls)`` and ``Cls.remote()``, Ray's tensor hints, Ray's
collectives — each run through ``cgc.ray_compat`` and against the same compute done in one
process.

Used by ``tests/ray_compat`` (a Ray with logical GPUs on a CPU machine: the communicators
bind to the CPU communicator) and ``tests/gpu`` (one real GPU: actors at ``num_gpus=0.5``
share it, CUDA IPC, or NCCL in the fake-hosts test mode). The caller has Ray initialized
with enough GPUs and ``cgc.ray_compat`` installed. Each ``run_*`` function makes its live
actors, compiles with ``dag.experimental_compile()``, runs a few executions, tears the
graph down, checks the live actors outlived it, kills them, and returns a ``Report``.

Weights and inputs are small integers, so every sum is exact in float32 on any device:
"equal to the single-process run" means equal, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from ray.dag import InputNode, MultiOutputNode
from ray.experimental.channel.torch_tensor_type import TorchTensorType
from ray.experimental.collective import allreduce, reducescatter
from ray.experimental.util.types import ReduceOp

WIDTH = 16
INPUTS = ([1, -2, 3, 0] * 4, [2] * WIDTH, list(range(-8, 8)))


def device() -> str:
    """Where an actor computes: the GPU Ray gave it, else the CPU (Ray's logical GPUs)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


class Stage:
    """One pipeline stage, ``relu(x @ W)``, with fixed-seed integer weights."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randint(-2, 3, (WIDTH, WIDTH), generator=g).float()

    def fwd(self, x: Any) -> torch.Tensor:
        t = torch.as_tensor(x, dtype=torch.float32)
        t = t.to(device()) if not isinstance(x, torch.Tensor) else t
        return torch.relu(t @ self.w.to(t.device))

    def out(self, t: torch.Tensor) -> tuple[list[float], str]:
        """The stage's result for the driver, and where the input tensor arrived."""
        return self.fwd(t).cpu().tolist(), t.device.type

    def fwd_checked(self, x: Any) -> torch.Tensor:
        """``fwd``, raising for an input whose first element is 99."""
        if x[0] == 99:
            raise ValueError("input 99 refused")
        return self.fwd(x)

    def fwd_or_int(self, x: Any) -> Any:
        """``fwd``, or the int 1 for an input whose first element is 99."""
        return 1 if x[0] == 99 else self.fwd(x)

    def value(self, t: torch.Tensor) -> list[float]:
        """The stage's result alone (where the input arrived depends on what the actor
        sees: Ray hides no GPU from an actor that asked for none)."""
        return self.fwd(t).cpu().tolist()

    def ping(self) -> str:
        return "alive"


class Rank:
    """A data-parallel rank: integer "gradients" that depend on its rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def grad(self, x: Any) -> torch.Tensor:
        t = torch.as_tensor(x, dtype=torch.float32).to(device())
        return t * (self.rank + 1)

    def grad2(self, x: Any) -> torch.Tensor:
        return self.grad(x)[:4] * 10 + self.rank

    def show(self, t: torch.Tensor) -> tuple[list[float], str]:
        return t.cpu().tolist(), t.device.type

    def ping(self) -> str:
        return "alive"


@dataclass
class Report:
    """What one program did through cgc, and what one process computes for it."""

    outputs: list[Any] = field(default_factory=list)   # per execution, as ray.get gave it
    reference: list[Any] = field(default_factory=list)  # the same, computed in one process
    bindings: list[str] = field(default_factory=list)   # communicator transports (sorted)
    channels: list[str] = field(default_factory=list)   # "writer->readers:kind", plan order
    overlap: bool = False                                # the plan's schedule overlaps
    comm_stream_ops: int = 0                             # ops the plan puts on the comm stream
    alive_after: bool = False                            # every live actor outlived teardown
    held: dict[str, list[str]] = field(default_factory=dict)  # actor -> GPU ids in the plan

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _tolist(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.cpu().tolist()
    if isinstance(v, (list, tuple)):
        return [_tolist(x) for x in v]
    return v


def _run(dag: Any, handles: list[Any], inputs: Any, compile_kw: dict[str, Any] | None = None
         ) -> Report:
    """Compile ``dag`` through the drop-in, run ``inputs``, tear down; fill the report."""
    from cgc.plan_schema import plan_pb2 as pb

    try:
        compiled = dag.experimental_compile(**(compile_kw or {}))
    except BaseException:
        # the live actors hold the logical GPUs: the next program's actors would wait for them
        for h in handles:
            ray.kill(h)
        raise
    rep = Report()
    try:
        for x in inputs:
            rep.outputs.append(_tolist(ray.get(compiled.execute(x), timeout=120)))
        proto = compiled.plan.proto
        rep.bindings = sorted({b.transport for b in compiled.graph.comm_bindings.values()})
        kind = {pb.CHAN_HOST: "host", pb.CHAN_NCCL: "nccl"}
        rep.channels = [f"{c.writer}->{','.join(c.readers)}:{kind[c.kind]}"
                        for c in proto.lowered.channels]
        rep.overlap = proto.lowered.schedule.overlap
        rep.comm_stream_ops = sum(op.stream == pb.COMM_STREAM for p in proto.lowered.programs
                                  for op in p.ops)
        rep.held = {a.name: list(a.external.placement.gpu_ids) for a in proto.graph.actors}
    finally:
        compiled.teardown()
    try:
        rep.alive_after = ray.get([h.ping.remote() for h in handles], timeout=60) == [
            "alive"] * len(handles)
    finally:
        for h in handles:
            ray.kill(h)
    return rep


def run_nccl_pipeline(num_gpus: float) -> Report:
    """The issue's program: two live stages, one ``with_tensor_transport("nccl")`` edge."""
    S = ray.remote(num_gpus=num_gpus)(Stage)
    a, b = S.remote(0), S.remote(1)
    with InputNode() as inp:
        dag = b.out.bind(a.fwd.bind(inp).with_tensor_transport("nccl"))
    rep = _run(dag, [a, b], INPUTS)
    ra, rb = Stage(0), Stage(1)
    rep.reference = [[rb.out(ra.fwd(x))[0], device()] for x in INPUTS]
    return rep


def run_collectives(num_gpus: float) -> Report:
    """``ray.experimental.collective``: an allreduce (SUM), a bucketed allreduce (AVG over
    two tensor lists) and a reducescatter (MAX) among two live ranks."""
    R = ray.remote(num_gpus=num_gpus)(Rank)
    ws = [R.remote(r) for r in range(2)]
    with InputNode() as inp:
        g1 = [w.grad.bind(inp) for w in ws]
        g2 = [w.grad2.bind(inp) for w in ws]
        summed = allreduce.bind(g1, op=ReduceOp.SUM)
        (a0, b0), (a1, b1) = allreduce.bind([g1, g2], op=ReduceOp.AVG)
        scattered = reducescatter.bind(g1, op=ReduceOp.MAX)
        outs = [w.show.bind(v) for w, v in zip(ws, summed, strict=True)]
        outs += [w.show.bind(v) for w, v in zip(ws, (a0, b0, a1, b1)[::2], strict=True)]
        outs += [w.show.bind(v) for w, v in zip(ws, (a0, b0, a1, b1)[1::2], strict=True)]
        outs += [w.show.bind(v) for w, v in zip(ws, scattered, strict=True)]
        dag = MultiOutputNode(outs)
    rep = _run(dag, ws, INPUTS)
    local = [Rank(r) for r in range(2)]
    for x in INPUTS:
        p1 = [w.grad(x).cpu() for w in local]
        p2 = [w.grad2(x).cpu() for w in local]
        full_max = torch.maximum(*p1)
        half = WIDTH // 2
        want = [(p1[0] + p1[1]).tolist()] * 2 + [((p1[0] + p1[1]) / 2).tolist()] * 2
        want += [((p2[0] + p2[1]) / 2).tolist()] * 2
        want += [full_max[:half].tolist(), full_max[half:].tolist()]
        rep.reference.append([[w, device()] for w in want])
    return rep


def run_device_hints(num_gpus: float) -> Report:
    """``device=`` on tensor hints between two GPU actors: "cpu" delivers on the CPU,
    "gpu"/"cuda" on the reader's GPU, "default" where the sender had it."""
    S = ray.remote(num_gpus=num_gpus)(Stage)
    a, b = S.remote(0), S.remote(1)
    with InputNode() as inp:
        t = a.fwd.bind(inp)
        # "shm", not auto: Ray resolves auto between actors on two (logical) GPUs to the
        # accelerator and then refuses device="cpu"; on one GPU to host memory.
        to_cpu = a.fwd.bind(inp).with_tensor_transport("shm", device="cpu")
        to_gpu = a.fwd.bind(inp).with_tensor_transport("shm", device="gpu")
        to_cuda = a.fwd.bind(inp).with_tensor_transport(device="cuda")
        kept = t.with_tensor_transport("nccl", device="default")
        dag = MultiOutputNode([b.out.bind(x) for x in (to_cpu, to_gpu, to_cuda, kept)])
    rep = _run(dag, [a, b], INPUTS)
    ra, rb = Stage(0), Stage(1)
    gpu = device()
    rep.reference = [[[rb.out(ra.fwd(x))[0], d] for d in ("cpu", gpu, gpu, gpu)]
                     for x in INPUTS]
    return rep


def run_auto_transport(num_gpus: float) -> Report:
    """``with_tensor_transport()`` (Ray's "auto"): between two GPU actors a device edge
    (NCCL, or CUDA IPC on a shared GPU), to a CPU-only actor and to the driver host memory."""
    S = ray.remote(num_gpus=num_gpus)(Stage)
    a, b = S.remote(0), S.remote(1)
    c = ray.remote(num_cpus=0)(Stage).remote(2)
    with InputNode() as inp:
        t = a.fwd.bind(inp).with_tensor_transport()
        to_driver = b.fwd.bind(inp).with_tensor_transport()
        dag = MultiOutputNode([b.out.bind(t), c.value.bind(t), to_driver])
    rep = _run(dag, [a, b, c], INPUTS)
    ra, rb, rc = Stage(0), Stage(1), Stage(2)
    rep.reference = [[[rb.out(ra.fwd(x))[0], device()], rc.value(ra.fwd(x)),
                      rb.fwd(x).tolist()] for x in INPUTS]
    return rep


def run_auto_resolved(num_gpus: float) -> Report:
    """Ray's ``auto`` hints after compile: each node's ``type_hint`` is the resolved
    ``TorchTensorType``; ``outputs``: [class name, transport] of the edge between the two
    GPU actors and of the edge to the driver (Ray: "accelerator" between different GPUs,
    "auto" on one shared GPU and towards the driver)."""
    S = ray.remote(num_gpus=num_gpus)(Stage)
    a, b = S.remote(0), S.remote(1)
    with InputNode() as inp:
        t = a.fwd.bind(inp).with_tensor_transport(transport="auto")
        to_driver = b.fwd.bind(inp).with_tensor_transport(transport="auto")
        dag = MultiOutputNode([b.value.bind(t), to_driver])
    compiled = dag.experimental_compile()
    rep = Report()
    try:
        rep.outputs = [[type(n.type_hint).__name__, n.type_hint.transport]
                       for n in (t, to_driver)]
        ray.get(compiled.execute(INPUTS[0]), timeout=120)
    finally:
        compiled.teardown()
    for h in (a, b):
        ray.kill(h)
    rep.alive_after = True
    between = "accelerator" if num_gpus == 1 else "auto"
    rep.reference = [["TorchTensorType", between], ["TorchTensorType", "auto"]]
    return rep


def run_auto_needs_communicator(num_gpus: float) -> Report:
    """An ``auto`` edge Ray resolves to the accelerator (two actors on different GPUs) with
    ``_default_communicator=None``: Ray's ValueError, in its words."""
    S = ray.remote(num_gpus=num_gpus)(Stage)
    a, b = S.remote(0), S.remote(1)
    with InputNode() as inp:
        dag = b.value.bind(a.fwd.bind(inp).with_tensor_transport(transport="auto"))
    rep = Report()
    try:
        dag.experimental_compile(_default_communicator=None).teardown()
        rep.outputs = ["compiled"]
    except ValueError as exc:
        rep.outputs = [str(exc).startswith("with_tensor_transport(transport='auto') is used "
                                           "for DAGNode "),
                       str(exc).endswith(", This requires specifying a default communicator "
                                         "or 'create' for _default_communicator when calling "
                                         "experimental_compile().")]
    for h in (a, b):
        ray.kill(h)
    rep.alive_after = True
    rep.reference = [True, True] if num_gpus == 1 else ["compiled"]
    return rep


def run_overlap(num_gpus: float, overlap: bool) -> Report:
    """A three-stage NCCL pipeline compiled with ``_overlap_gpu_communication``."""
    S = ray.remote(num_gpus=num_gpus)(Stage)
    st = [S.remote(i) for i in range(3)]
    with InputNode() as inp:
        h = st[0].fwd.bind(inp).with_tensor_transport("nccl")
        h = st[1].fwd.bind(h).with_tensor_transport("nccl")
        dag = MultiOutputNode([st[2].out.bind(h), st[1].fwd.bind(inp)])
    rep = _run(dag, st, INPUTS, {"_overlap_gpu_communication": overlap})
    loc = [Stage(i) for i in range(3)]
    rep.reference = [[[loc[2].out(loc[1].fwd(loc[0].fwd(x)))[0], device()],
                      loc[1].fwd(x).tolist()] for x in INPUTS]
    return rep


def run_tensor_type_hint(num_gpus: float) -> Report:
    """A ``TorchTensorType`` hint set as Ray 2.60 takes one (``node.type_hint = ...``):
    accelerator transport, static shape, direct return."""
    S = ray.remote(num_gpus=num_gpus)(Stage)
    a, b = S.remote(0), S.remote(1)
    with InputNode() as inp:
        t = a.fwd.bind(inp)
        t.type_hint = TorchTensorType(transport="accelerator", _static_shape=True,
                                      _direct_return=True)
        dag = b.out.bind(t)
    rep = _run(dag, [a, b], INPUTS)
    ra, rb = Stage(0), Stage(1)
    rep.reference = [[rb.out(ra.fwd(x))[0], device()] for x in INPUTS]
    return rep


def run_direct_return_broken(num_gpus: float) -> Report:
    """A ``_direct_return`` NCCL edge given an int: Ray 2.60's ValueError (its words), then
    the graph is torn down (``RayChannelError``)."""
    from ray.exceptions import RayChannelError

    S = ray.remote(num_gpus=num_gpus)(Stage)
    a, b = S.remote(0), S.remote(1)
    with InputNode() as inp:
        dag = b.value.bind(a.fwd_or_int.bind(inp).with_tensor_transport(
            "nccl", _direct_return=True))
    compiled = dag.experimental_compile()
    rep = Report()
    try:
        for x in (INPUTS[0], [99] * WIDTH, INPUTS[1]):
            try:
                ray.get(compiled.execute(x), timeout=120)
                rep.outputs.append("ok")
            except RayChannelError:
                rep.outputs.append("RayChannelError")
            except ValueError as exc:
                rep.outputs.append(f"ValueError: {exc}")
    finally:
        compiled.teardown()
    for h in (a, b):
        ray.kill(h)
    rep.alive_after = True
    rep.reference = ["ok", "ValueError: Task annotated with _direct_return=True must return "
                     "a CUDA torch.Tensor, instead found value `1`. DAG will shut down.",
                     "RayChannelError"]
    return rep


def run_nccl_error(num_gpus: float, flags: dict[str, bool]) -> Report:
    """An app error in the writer of an NCCL edge: Ray 2.60 raises the task error, then,
    with ``_static_shape`` or ``_direct_return`` (the error cannot cross the edge), the
    graph is torn down and the next ``execute`` raises ``RayChannelError``; without them
    the graph goes on. ``outputs``: what each of three executions gave."""
    from ray.exceptions import RayChannelError, RayTaskError

    S = ray.remote(num_gpus=num_gpus)(Stage)
    a, b = S.remote(0), S.remote(1)
    with InputNode() as inp:
        dag = b.value.bind(a.fwd_checked.bind(inp).with_tensor_transport("nccl", **flags))
    compiled = dag.experimental_compile()
    rep = Report()
    try:
        for x in (INPUTS[0], [99] * WIDTH, INPUTS[1]):
            try:
                ray.get(compiled.execute(x), timeout=120)
                rep.outputs.append("ok")
            except RayTaskError as exc:
                rep.outputs.append(f"RayTaskError({type(exc.cause).__name__})")
            except RayChannelError:
                rep.outputs.append("RayChannelError")
    finally:
        compiled.teardown()
    try:
        rep.alive_after = ray.get([h.ping.remote() for h in (a, b)], timeout=60) == [
            "alive"] * 2
    finally:
        for h in (a, b):
            ray.kill(h)
    broken = bool(flags)
    rep.reference = ["ok", "RayTaskError(ValueError)", "RayChannelError" if broken else "ok"]
    return rep


PROGRAMS = {
    "nccl_pipeline_half": lambda: run_nccl_pipeline(0.5),
    "nccl_pipeline_one": lambda: run_nccl_pipeline(1),
    "collectives": lambda: run_collectives(0.5),
    "device_hints": lambda: run_device_hints(0.5),
    "auto_transport": lambda: run_auto_transport(0.5),
    "overlap_on": lambda: run_overlap(0.5, True),
    "overlap_off": lambda: run_overlap(0.5, False),
    "tensor_type_hint": lambda: run_tensor_type_hint(0.5),
    "nccl_error_direct_return": lambda: run_nccl_error(0.5, {"_direct_return": True}),
    "nccl_error_static_shape": lambda: run_nccl_error(0.5, {"_static_shape": True}),
    "nccl_error_plain": lambda: run_nccl_error(0.5, {}),
    "direct_return_broken": lambda: run_direct_return_broken(0.5),
    "auto_resolved_one": lambda: run_auto_resolved(1),
    "auto_resolved_half": lambda: run_auto_resolved(0.5),
    "auto_needs_communicator_one": lambda: run_auto_needs_communicator(1),
    "auto_needs_communicator_half": lambda: run_auto_needs_communicator(0.5),
}


class Placement:
    """Ray's device-placement tests' actor: dicts of tensors made on a device, and where
    the tensors of what it reads arrived."""

    def send_dict(self, devices: dict[str, str]) -> dict[str, torch.Tensor]:
        return {k: torch.ones(4, device=d) for k, d in devices.items()}

    def dict_devices(self, tensors: dict[str, torch.Tensor]) -> dict[str, str]:
        return {k: str(v.device) for k, v in tensors.items()}

    def sees_cuda(self) -> bool:
        return torch.cuda.is_available()


def run_device_placement(num_gpus: float) -> dict[str, Any]:
    """Ray 2.60's rules for ``device=`` (its test_torch_tensor_transport.py), through the
    drop-in; the actors are killed after. Returns {case: the reader's devices, or the
    error's type name and text}: a dict holding a CPU tensor sent with ``device="gpu"``
    (worker to worker, and from the driver's input) arrives on ``cuda:0``;
    ``device="cuda"`` towards an actor Ray gave no GPU compiles, and fails when run where
    that actor sees no CUDA (as Ray's reader fails; one that sees it gets cuda:0)."""
    P = ray.remote(num_gpus=num_gpus)(Placement)
    cpu_only = ray.remote(num_gpus=0)(Placement)
    a, b, c = P.remote(), P.remote(), cpu_only.remote()
    out: dict[str, Any] = {"cpu_worker_sees_cuda": ray.get(c.sees_cuda.remote())}
    cases = {}
    with InputNode() as inp:
        cases["worker_to_gpu_worker"] = b.dict_devices.bind(
            a.send_dict.bind(inp).with_tensor_transport(device="gpu"))
    with InputNode() as inp:
        cases["driver_to_gpu_worker"] = b.dict_devices.bind(
            inp.with_tensor_transport(device="cuda"))
    with InputNode() as inp:
        cases["worker_to_cpu_worker"] = c.dict_devices.bind(
            a.send_dict.bind(inp).with_tensor_transport(device="cuda"))
    args = {"worker_to_gpu_worker": {"cpu_tensor": "cpu", "gpu_tensor": "cuda"},
            "driver_to_gpu_worker": {"cpu_tensor": torch.ones(2)},
            "worker_to_cpu_worker": {"cpu_tensor": "cpu"}}
    try:
        for name, dag in cases.items():
            compiled = dag.experimental_compile()
            try:
                out[name] = ray.get(compiled.execute(args[name]), timeout=120)
            except Exception as exc:  # noqa: BLE001 - the case's outcome
                out[name] = [type(exc).__name__, str(exc)]
            finally:
                compiled.teardown()
    finally:
        for h in (a, b, c):
            ray.kill(h)
    return out
