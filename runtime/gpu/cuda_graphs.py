"""CUDA-graph replay of a captured call (``Program.captured_ops``): capture once, replay per
execution.

``CapturedCall(fn, name)`` stands in for an actor method the plan captures. Each call is
keyed by its arguments' structure: tensors by shape, dtype and device, everything else by
value (an int such as a microbatch index picks a variant; a value that is not a plain
constant makes the call eager). A key seen ``warmup`` times runs eagerly (libraries set
up their handles, workspaces and kernels then); at the next call with that key the
method is captured into a ``torch.cuda.CUDAGraph`` over *static* copies of its tensor
arguments (CUDA tensors: device buffers; CPU tensors: pinned host buffers, so the
captured host-to-device copy reads them at replay), and from then on each call copies
its tensors into those buffers, replays the graph on the current stream and returns
clones of the graph's outputs (the next replay overwrites them).

Never a wrong result: a new shape or value is a new key (eager until it is captured);
a method that cannot be captured (a host synchronisation such as ``.item()`` or
``.cpu()``, a CPU-only operation) runs eagerly from then on and the fallback is counted
and named in ``stats``; more than ``max_graphs`` variants run eagerly too. What capture
cannot see is the method's contract (``cgc.method(cuda_graph=True)``): Python state that
changes between calls is read at capture only.

Example::

    step = CapturedCall(stage.forward, "stage0.forward")
    for _ in range(4):
        y = step(x, 0, pos)        # 2 eager, then capture, then replays
    step.stats.as_dict()           # {"captures": 1, "replays": 2, "eager": 2, ...}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CapturedCall", "CaptureStats", "WARMUP", "MAX_GRAPHS"]

WARMUP = 2  # eager calls per key before it is captured
MAX_GRAPHS = 16  # captured variants per call; beyond, eager

_PLAIN = (int, float, bool, str, bytes, type(None))


@dataclass
class CaptureStats:
    """What one captured call did: graphs made, replays, eager runs and why."""

    captures: int = 0
    replays: int = 0
    eager: int = 0
    fallbacks: dict[str, str] = field(default_factory=dict)  # key text -> why eager

    def as_dict(self) -> dict[str, Any]:
        return {"captures": self.captures, "replays": self.replays, "eager": self.eager,
                "fallbacks": dict(self.fallbacks)}


def _flatten(value: Any, torch: Any, leaves: list[Any]) -> Any:
    """The hashable structure of ``value``; its tensors appended to ``leaves``. None in
    the structure's place means "not capturable" (raised as _Uncapturable)."""
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return ("T", tuple(value.shape), str(value.dtype), value.device.type)
    if isinstance(value, _PLAIN):
        return ("V", type(value).__name__, value)
    if type(value) in (list, tuple):
        return (type(value).__name__, tuple(_flatten(v, torch, leaves) for v in value))
    if type(value) is dict and all(isinstance(k, str) for k in value):
        return ("dict", tuple((k, _flatten(value[k], torch, leaves)) for k in sorted(value)))
    raise _Uncapturable(f"an argument of type {type(value).__name__}")


def _rebuild(spec: Any, tensors: Any) -> Any:
    kind = spec[0]
    if kind == "T":
        return next(tensors)
    if kind == "V":
        return spec[2]
    if kind in ("list", "tuple"):
        items = [_rebuild(s, tensors) for s in spec[1]]
        return items if kind == "list" else tuple(items)
    return {k: _rebuild(s, tensors) for k, s in spec[1]}


class _Uncapturable(Exception):
    pass


class _Graph:
    """One captured variant: its graph, static inputs, static outputs."""

    def __init__(self, graph: Any, static: list[Any], outs: list[Any], out_spec: Any,
                 done: Any) -> None:
        self.graph, self.static, self.outs, self.out_spec = graph, static, outs, out_spec
        self.pinned = any(s.device.type == "cpu" for s in static)
        self.done = done  # event after the last replay (pinned inputs: wait before reuse)

    def replay(self, leaves: list[Any]) -> Any:
        if self.pinned:
            self.done.synchronize()  # the last replay has read the pinned inputs
        for s, t in zip(self.static, leaves, strict=True):
            s.copy_(t, non_blocking=True)
        self.graph.replay()
        outs = [o.clone() for o in self.outs]
        if self.pinned:
            self.done.record()
        return _rebuild(self.out_spec, iter(outs))


class CapturedCall:
    """``fn`` replayed as CUDA graphs, one per argument key (see the module doc)."""

    def __init__(self, fn: Any, name: str, *, warmup: int = WARMUP,
                 max_graphs: int = MAX_GRAPHS) -> None:
        import torch

        self._torch = torch
        self.fn, self.name = fn, name
        self.warmup, self.max_graphs = warmup, max_graphs
        self.stats = CaptureStats()
        self._seen: dict[Any, int] = {}
        self._graphs: dict[Any, _Graph] = {}
        self._eager: set[Any] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        torch = self._torch
        leaves: list[Any] = []
        try:
            key = _flatten((args, kwargs), torch, leaves)
        except _Uncapturable as exc:
            return self._run_eager(None, str(exc), args, kwargs)
        hit = self._graphs.get(key)
        if hit is not None:
            self.stats.replays += 1
            return hit.replay(leaves)
        if key in self._eager:
            return self._run_eager(None, "", args, kwargs)
        seen = self._seen[key] = self._seen.get(key, 0) + 1
        if seen <= self.warmup:
            return self._run_eager(None, "", args, kwargs)
        if len(self._graphs) >= self.max_graphs:
            return self._run_eager(key, f"more than {self.max_graphs} argument variants", args,
                                   kwargs)
        graph = self._capture(key, leaves)
        if graph is None:
            return self._run_eager(None, "", args, kwargs)
        self.stats.replays += 1
        return graph.replay(leaves)

    def _run_eager(self, key: Any, why: str, args: Any, kwargs: Any) -> Any:
        if key is not None:
            self._eager.add(key)
        if why:
            self.stats.fallbacks.setdefault(why, why)
        self.stats.eager += 1
        return self.fn(*args, **kwargs)

    def _static(self, t: Any) -> Any:
        torch = self._torch
        if t.device.type == "cuda":
            return torch.empty_like(t, memory_format=torch.contiguous_format)
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True)

    def _capture(self, key: Any, leaves: list[Any]) -> _Graph | None:
        torch = self._torch
        static = [self._static(t) for t in leaves]
        for s, t in zip(static, leaves, strict=True):
            s.copy_(t)
        (sargs, skwargs) = _rebuild(key, iter(static))
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        try:
            with torch.cuda.graph(graph):
                out = self.fn(*sargs, **skwargs)
            outs: list[Any] = []
            out_spec = _flatten(out, torch, outs)
            if any(o.device.type != "cuda" for o in outs):
                raise _Uncapturable("it returns a CPU tensor (read at capture only)")
        except Exception as exc:  # noqa: BLE001 - any capture failure: eager, reported
            torch.cuda.synchronize()
            self._eager.add(key)
            why = f"cannot be captured: {type(exc).__name__}: {str(exc)[:200]}"
            self.stats.fallbacks[_key_text(key)] = why
            return None
        self.stats.captures += 1
        done = torch.cuda.Event()
        done.record()
        g = self._graphs[key] = _Graph(graph, static, outs, out_spec, done)
        return g

    def reset(self) -> None:
        """Free every graph and its memory pool (teardown)."""
        self._graphs.clear()
        self._seen.clear()


def _key_text(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 120 else text[:117] + "..."
