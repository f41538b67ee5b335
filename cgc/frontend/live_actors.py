"""What live actors hold, read from the actors themselves when a graph is compiled.

A live handle (``Cls.remote()``, or ``Cls.options(num_gpus=0.5).remote()``) carries no
options the adapter could read: Ray keeps them with the actor. So, as Ray Compiled Graph
does when it compiles, cgc asks each live actor, in one batched round of calls, what Ray
gave it: its assigned resources (``get_assigned_resources()``), its node and its GPU ids
(``get_accelerator_ids()["GPU"]``, what Ray's own transport choice reads). The answer is
stored in the plan (``ExternalActor.placement``), and the compiler takes a live actor
holding a GPU for a GPU actor, as it takes a created actor with ``num_gpus > 0``.

Example::

    held = observe([handle_a, handle_b], ["Stage", "Stage"], ["prog.py:12", "prog.py:13"])
    held[0].gpu_ids        # ('0',)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cgc.errors import CompileError
from cgc.frontend import ray_private as rp
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import DEFAULTS

__all__ = ["LivePlacement", "observe", "placement_proto", "OBSERVE_TIMEOUT_S"]

# How long compiling waits for live actors to answer (they may still be constructing):
# the runtime's set-up timeout, which bounds the same wait at start.
OBSERVE_TIMEOUT_S = float(DEFAULTS["setup_timeout_s"])


@dataclass(frozen=True)
class LivePlacement:
    """What one live actor holds: Ray's assigned resources, its node, its GPU ids."""

    resources: tuple[tuple[str, float], ...]  # sorted by name
    node_id: str
    gpu_ids: tuple[str, ...]

    @property
    def has_gpu(self) -> bool:
        """Ray's rule (``TypeHintResolver._use_gpu``): an actor with GPU ids uses a GPU.

        >>> LivePlacement((("GPU", 0.5),), "n", ("0",)).has_gpu
        True
        """
        return bool(self.gpu_ids)

    def describe(self) -> str:
        """One line for messages: ``{CPU: 1, GPU: 0.5} on GPU 0``.

        >>> LivePlacement((("CPU", 1.0),), "n", ()).describe()
        '{CPU: 1} (no GPU)'
        """
        held = "{" + ", ".join(f"{k}: {v:g}" for k, v in self.resources) + "}"
        gpus = f"on GPU {','.join(self.gpu_ids)}" if self.gpu_ids else "(no GPU)"
        return f"{held} {gpus}"


def _probe() -> Any:
    """The function each live actor runs. Made inside a function so that Ray pickles it
    by value (as it does its own compile-time probes): the actor imports nothing of cgc."""

    def held(actor_self: Any) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "resources": dict(ctx.get_assigned_resources()),
            "node": ctx.get_node_id(),
            "gpus": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
        }

    return held


def _placement(got: dict[str, Any]) -> LivePlacement:
    res = tuple(sorted((str(k), float(v)) for k, v in got["resources"].items() if v))
    return LivePlacement(res, str(got["node"]), tuple(got["gpus"]))


def observe(
    handles: list[Any], classes: list[str], sites: list[str],
    timeout_s: float = OBSERVE_TIMEOUT_S,
) -> list[LivePlacement]:
    """Ask every live actor what it holds, in one batched round; results in input order.

    ``classes`` and ``sites`` (the class name and the first ``.bind()`` line of each, ""
    when unknown) name an actor that cannot answer.

    Example::

        observe([h], ["Stage"], ["prog.py:12"])[0].resources   # (("CPU", 1.0), ("GPU", 0.5))

    Raises:
        CompileError: a live actor is dead (its constructor raised, or it was killed), or
            did not answer within ``timeout_s`` (still waiting for resources, or busy in a
            long call); the message names its class, id and first use.
    """
    if not handles:
        return []
    import ray

    probe = _probe()
    refs = [rp.call_in_actor(h, probe) for h in handles]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    out: list[LivePlacement] = []
    problems: list[str] = []
    for h, ref, cls, site in zip(handles, refs, classes, sites, strict=True):
        who = f"{site + ': ' if site else ''}live actor {cls} (id {rp.handle_id(h)[:12]})"
        if ref not in done:
            problems.append(
                f"{who} did not say what it holds within {timeout_s:g} s (still waiting "
                "for resources, constructing, or busy in a long call)"
            )
            continue
        try:
            out.append(_placement(ray.get(ref)))
        except Exception as exc:  # noqa: BLE001 - the actor's own failure: name it
            cause = getattr(exc, "cause", None) or exc
            problems.append(f"{who} cannot be used: {type(cause).__name__}: {cause}")
    if problems:
        # An unanswered probe is left to finish: it only reads the actor's runtime context.
        raise CompileError(
            "cgc reads what each live actor holds (its resources and GPUs) when the graph "
            "is compiled, as Ray Compiled Graph does:\n  " + "\n  ".join(problems)
        )
    return out


def placement_proto(p: LivePlacement) -> pb.ActorPlacement:
    """The plan's form of a live actor's placement.

    >>> placement_proto(LivePlacement((("GPU", 0.5),), "ab", ("0",))).gpu_ids
    ['0']

    Raises:
        Nothing.
    """
    out = pb.ActorPlacement(observed=True, node_id=p.node_id, gpu_ids=list(p.gpu_ids))
    for name, amount in p.resources:
        out.resources.add(name=name, amount=amount)
    return out
