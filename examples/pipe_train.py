"""Pipeline-parallel training of an MLP in plain torch: the stages of `train_1f1b.py` and
`ray_train_1f1b.py`, and their single-process reference.

A stage holds a few ``Linear`` + GELU layers and its own optimizer. Per training step
(one graph execution) every microbatch goes forward through the stages (activations as
tensor edges) and backward (gradients as tensor edges); then each stage takes one
optimizer step. The last stage computes the MSE loss against the targets.

Why gradients are kept per microbatch and summed in microbatch order at ``step``: the
schedule (1F1B, or anything else the compiler picks) may run a stage's backward passes in
any order its dependencies allow, and floating-point sums depend on order; this way the
result is the same for every schedule and equals the reference bit for bit.

    cfg = SIZES["tiny"]
    stages = [TrainStage(cfg, s, 2) for s in range(2)]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(d_in=16, d=32, d_out=8, layers_per_stage=2, batch=8, microbatches=4,
                 lr=1e-2, seed=0),
    # One H200 shared by two stages: ~0.2 ms of fp32 matmuls per stage and microbatch.
    "gpu": dict(d_in=2048, d=2048, d_out=2048, layers_per_stage=4, batch=256,
                microbatches=8, lr=1e-4, seed=0),
}


def pick_device(device: str = "auto") -> torch.device:
    """``"auto"``: this process's GPU when it has one, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def _weight(seed: int, tag: int, shape: Sequence[int], std: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + tag)
    return torch.randn(*shape, generator=gen) * std


class TrainStage:
    """Stage ``stage`` of ``n_stages``: its layers, optimizer and saved activations."""

    def __init__(self, cfg: dict[str, Any], stage: int, n_stages: int,
                 device: str = "auto") -> None:
        self.cfg, self.stage, self.n_stages = dict(cfg), stage, n_stages
        self.device = pick_device(device)
        self.is_first, self.is_last = stage == 0, stage == n_stages - 1
        d, per, seed = cfg["d"], cfg["layers_per_stage"], cfg["seed"]
        dims = [cfg["d_in"] if self.is_first else d] + [d] * per
        if self.is_last:
            dims.append(cfg["d_out"])
        self.params: list[torch.Tensor] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            tag = 1000 * (stage + 1) + 2 * i
            w = _weight(seed, tag, (a, b), a ** -0.5).to(self.device).requires_grad_()
            bias = torch.zeros(b, device=self.device, requires_grad=True)
            self.params += [w, bias]
        self.opt = torch.optim.Adam(self.params, lr=cfg["lr"])
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.grads: dict[int, tuple[torch.Tensor, ...]] = {}
        self.losses: dict[int, float] = {}

    def _net(self, x: torch.Tensor) -> torch.Tensor:
        n = len(self.params) // 2
        for i in range(n):
            x = x @ self.params[2 * i] + self.params[2 * i + 1]
            if not (self.is_last and i == n - 1):  # no activation after the output layer
                x = F.gelu(x)
        return x

    def _input(self, x: torch.Tensor, mb: int) -> torch.Tensor:
        x = x[mb] if self.is_first else x  # the first stage is given the whole batch
        x = x.to(self.device, non_blocking=True).detach()
        return x if self.is_first else x.requires_grad_()

    def forward(self, x: torch.Tensor, mb: int) -> torch.Tensor:
        """Microbatch ``mb``'s activations out of this stage (kept for its backward)."""
        x = self._input(x, mb)
        y = self._net(x)
        self.saved[mb] = (x, y)
        return y.detach()

    def forward_backward(self, x: torch.Tensor, targets: torch.Tensor, mb: int) -> Any:
        """Last stage: forward, the loss of microbatch ``mb`` and its backward at once;
        returns the gradient of the loss with respect to this stage's input."""
        x = self._input(x, mb)
        loss = F.mse_loss(self._net(x), targets[mb].to(self.device)) / self.cfg["microbatches"]
        wrt = self.params if self.is_first else [x, *self.params]
        got = torch.autograd.grad(loss, wrt)
        self.losses[mb] = float(loss.detach())
        return self._keep(mb, got)

    def backward(self, grad: torch.Tensor, mb: int) -> Any:
        """Backward of microbatch ``mb`` given the gradient of its output; returns the
        gradient of its input (the first stage: None)."""
        x, y = self.saved.pop(mb)
        wrt = self.params if self.is_first else [x, *self.params]
        got = torch.autograd.grad(y, wrt, grad_outputs=grad.to(self.device))
        return self._keep(mb, got)

    def _keep(self, mb: int, got: Sequence[torch.Tensor]) -> Any:
        if self.is_first:
            self.grads[mb] = tuple(got)
            return None
        self.grads[mb] = tuple(got[1:])
        return got[0]

    def step(self, *_done: Any) -> float:
        """One optimizer step with the gradients summed in microbatch order; returns the
        step's loss (last stage) or the gradient norm (the others)."""
        mbs = sorted(self.grads)
        for i, p in enumerate(self.params):
            total = self.grads[mbs[0]][i].clone()
            for mb in mbs[1:]:
                total += self.grads[mb][i]
            p.grad = total
        norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in self.params)))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.grads.clear()
        if self.is_last:
            loss = sum(self.losses[mb] for mb in sorted(self.losses))
            self.losses.clear()
            return loss
        return norm


def one_f_one_b(n_stages: int, microbatches: int) -> list[tuple[int, str, int]]:
    """The 1F1B schedule as one bind order: ``(stage, "F"|"FB"|"B", microbatch)``.

    Each stage's own calls come in 1F1B order (``n_stages - stage - 1`` forwards to fill
    the pipeline, then one forward and one backward at a time, then the remaining
    backwards; the last stage runs forward and backward at once, "FB"), and every call
    comes after the calls it takes its input from. Actors run their calls in bind order,
    so binding in this order is how a graph asks for 1F1B.

    Example: ``one_f_one_b(2, 2)`` ->
    ``[(0, "F", 0), (0, "F", 1), (1, "FB", 0), (0, "B", 0), (1, "FB", 1), (0, "B", 1)]``.
    """
    last = n_stages - 1
    queues: list[list[tuple[str, int]]] = []
    for s in range(n_stages):
        if s == last:
            queues.append([("FB", m) for m in range(microbatches)])
            continue
        warm = min(last - s, microbatches)
        q = [("F", m) for m in range(warm)]
        for m in range(microbatches - warm):
            q += [("F", warm + m), ("B", m)]
        q += [("B", m) for m in range(microbatches - warm, microbatches)]
        queues.append(q)
    done: set[tuple[int, str, int]] = set()

    def ready(s: int, kind: str, m: int) -> bool:
        if kind in ("F", "FB"):
            return s == 0 or (s - 1, "F", m) in done
        return (s + 1, "FB" if s + 1 == last else "B", m) in done

    order: list[tuple[int, str, int]] = []
    while any(queues):
        for s, q in enumerate(queues):
            if q and ready(s, *q[0]):
                kind, m = q.pop(0)
                done.add((s, kind, m))
                order.append((s, kind, m))
                break
        else:  # cannot happen for a 1F1B order; guards a broken edit
            raise RuntimeError("no stage can take its next call")
    return order


def batch(cfg: dict[str, Any], step: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """Training step ``step``'s inputs and targets, ``(microbatches, batch, ...)`` each: a
    fixed nonlinear teacher, so the loss falls. (Made on the CPU: at the GPU size it takes
    tens of milliseconds, so benchmarks make their batches before timing.)"""
    gen = torch.Generator().manual_seed(10_000 + cfg["seed"] * 7919 + step)
    m, b = cfg["microbatches"], cfg["batch"]
    xs = torch.randn(m, b, cfg["d_in"], generator=gen)
    ys = torch.sin(xs @ _teacher(cfg["seed"], cfg["d_in"], cfg["d_out"]))
    return xs.to(device), ys.to(device)


@functools.lru_cache(maxsize=4)
def _teacher(seed: int, d_in: int, d_out: int) -> torch.Tensor:
    return _weight(seed, 99, (d_in, d_out), d_in ** -0.5)


def local_step(stages: Sequence[TrainStage], cfg: dict[str, Any], step: int,
               data: tuple[torch.Tensor, ...] | None = None) -> list[float]:
    """Training step ``step`` (its ``batch``, or ``data``) with every stage called in turn
    in this process, microbatch by microbatch; returns each stage's ``step()`` result."""
    xs, ys = data if data is not None else batch(cfg, step)
    for mb in range(cfg["microbatches"]):
        a = xs
        for s in stages[:-1]:
            a = s.forward(a, mb)
        g = stages[-1].forward_backward(a, ys, mb)
        for s in reversed(stages[:-1]):
            g = s.backward(g, mb)
    return [s.step() for s in stages]


def reference(cfg: dict[str, Any], n_stages: int, steps: int,
              device: str = "auto") -> list[list[float]]:
    """The same training in this process (``local_step``); one row per step."""
    stages = [TrainStage(cfg, s, n_stages, device) for s in range(n_stages)]
    return [local_step(stages, cfg, k) for k in range(steps)]
