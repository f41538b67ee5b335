"""The two ends of a weight sync inside an actor: the start-time digest check and the
bucketed, in-place copy (docs/weight_sync.md).

``sync_methods`` gives, for every ``cgc.sync.send``/``cgc.sync.recv`` call of this actor,
the function its COMPUTE op runs. Building them checks the actor's live module against the
plan's parameter list (its digest first, then the first difference, named): that happens
in set-up round 1, before any channel exists. The send packs the learner's parameters into
one fresh byte buffer per bucket; the receive copies each bucket's bytes into the rollout's
existing parameter storage, so every parameter keeps its address (captured CUDA graphs that
read it stay valid).

Example: ``fns = sync_methods(plan, "r0", rollout_obj)`` -> ``{5: recv}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.weight_sync import param_digest
from cgc.runtime.errors import WeightSyncMismatchError

__all__ = ["sync_methods", "live_params"]


def _fmt(shape: Any, dtype: str) -> str:
    return f"shape {tuple(int(d) for d in shape)} {dtype}"


def live_params(module: Any) -> list[tuple[str, tuple[int, ...], str, Any]]:
    """``(name, shape, dtype, tensor)`` of a module's ``named_parameters()``, in order.

    Example: ``live_params(torch.nn.Linear(2, 1))[1][:3] == ("bias", (1,), "float32")``.

    Raises:
        AttributeError: ``module`` has no ``named_parameters``.
    """
    return [(n, tuple(p.shape), str(p.dtype).removeprefix("torch."), p)
            for n, p in module.named_parameters()]


def _difference(plan_params: list[tuple[str, tuple[int, ...], str]],
                live: list[tuple[str, tuple[int, ...], str, Any]]) -> str:
    """The first difference between the plan's list and the live one, in words."""
    have = {n: (s, d) for n, s, d, _ in live}
    want = {n for n, _, _ in plan_params}
    for name, shape, dtype in plan_params:
        if name not in have:
            return (f"parameter {name!r} is missing (the plan expects {_fmt(shape, dtype)}; "
                    f"the module has {', '.join(sorted(have)) or 'no parameters'})")
        if have[name] != (shape, dtype):
            return (f"parameter {name!r}: the plan expects {_fmt(shape, dtype)}, "
                    f"found {_fmt(*have[name])}")
    extra = [n for n, _, _, _ in live if n not in want]
    if extra:
        return (f"parameter {extra[0]!r} is not in the plan (renamed or added; the plan "
                f"expects {', '.join(n for n, _, _ in plan_params)})")
    return ("the parameters are in another order than the plan's: "
            f"{', '.join(n for n, _, _, _ in live)}")


def _checked(plan: pb.Plan, s: pb.WeightSync, t: pb.TransferPlan, actor: str, obj: Any,
             attr: str) -> list[Any]:
    """The live parameter tensors of ``obj.<attr>``, in plan order, after the digest check."""
    where = f"weight sync {s.name!r}: actor {actor} ({type(obj).__qualname__}.{attr})"
    module = getattr(obj, attr, None)
    try:
        live = live_params(module)
    except Exception as exc:  # noqa: BLE001 - anything without parameters
        raise WeightSyncMismatchError(
            f"{where}: no torch module there ({type(module).__name__}: {exc})") from None
    if param_digest([(n, sh, d) for n, sh, d, _ in live]) != t.digest:
        want = [(p.name, tuple(p.shape), p.dtype) for p in s.params]
        raise WeightSyncMismatchError(
            f"{where}: its parameters do not match the plan's (digest "
            f"{t.digest.hex()[:16]}...): {_difference(want, live)}; nothing was sent")
    for n, _, _, p in live:
        if not p.is_contiguous():
            raise WeightSyncMismatchError(f"{where}: parameter {n!r} is not contiguous; "
                                          "an in-place sync needs contiguous storage")
    return [p for _, _, _, p in live]


def _sender(s: pb.WeightSync, t: pb.TransferPlan, params: list[Any]) -> Callable[..., Any]:
    """The source's op: one new uint8 buffer per bucket, the parameters' bytes packed in."""
    import torch

    plan = [(b.nbytes, [(m.offset, m.nbytes, params[m.param]) for m in b.members])
            for b in t.buckets]
    device = params[0].device if params else torch.device("cpu")
    single = len(plan) == 1

    def send(_after: Any) -> Any:
        out = []
        with torch.no_grad():
            for nbytes, members in plan:
                buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
                for off, n, p in members:
                    buf[off:off + n].copy_(p.detach().reshape(-1).view(torch.uint8))
                out.append(buf)
        return out[0] if single else tuple(out)
    return send


def _receiver(s: pb.WeightSync, t: pb.TransferPlan, params: list[Any]) -> Callable[..., Any]:
    """A target's op: copy each bucket's bytes into the parameters' own storage."""
    import torch

    # Byte views of the parameters' storage, made once: writing them keeps every address.
    plan = [(b.nbytes, [(m.offset, m.nbytes, params[m.param].detach().view(-1)
                         .view(torch.uint8)) for m in b.members]) for b in t.buckets]
    total = t.total_bytes

    def recv(*buckets: Any) -> int:
        if len(buckets) != len(plan):
            raise ValueError(f"weight sync {s.name!r}: {len(buckets)} buckets, the plan "
                             f"has {len(plan)}")
        with torch.no_grad():
            for i, (buf, (nbytes, members)) in enumerate(zip(buckets, plan, strict=True)):
                if buf.dtype != torch.uint8 or buf.numel() != nbytes:
                    raise ValueError(f"weight sync {s.name!r}: bucket {i} arrived as "
                                     f"{buf.numel()} {buf.dtype} values, the plan has "
                                     f"{nbytes} bytes")
                for off, n, dst in members:
                    dst.copy_(buf[off:off + n])
        return total
    return recv


def sync_methods(plan: pb.Plan, actor: str, obj: Any) -> dict[int, Callable[..., Any]]:
    """Node id -> the function of each weight-sync end this actor holds, after checking
    its live module against the plan (module docstring).

    Example: ``sync_methods(pb.Plan(), "a", object())`` is ``{}``.

    Raises:
        WeightSyncMismatchError: the live module differs from the plan's list (named).
    """
    out: dict[int, Callable[..., Any]] = {}
    for s, t in zip(plan.graph.weight_syncs, plan.lowered.transfers, strict=True):
        if s.source == actor:
            out[s.send_node] = _sender(s, t, _checked(plan, s, t, actor, obj, s.source_attr))
        for target, rid in zip(s.targets, s.recv_nodes, strict=True):
            if target == actor:
                out[rid] = _receiver(s, t, _checked(plan, s, t, actor, obj, s.target_attr))
    return out

