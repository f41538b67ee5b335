"""Policy-gradient RL in plain torch: the rollout and learner actors of `rl_loop.py` and
`ray_rl_loop.py`, and their single-process reference.

The environment is a contextual bandit with a hidden linear teacher: an observation is a
random vector, the reward of action ``a`` is the teacher's score of ``a`` for it. Each
rollout actor samples ``samples`` actions from the current policy; the learner takes one
REINFORCE step (mean-reward baseline) on all of them and returns the new weights as one
flat tensor, which every rollout actor loads before its next iteration: the weight sync.
Sampling draws from generators seeded by (seed, rollout, iteration), so runs repeat
exactly, in any process.

    cfg = SIZES["tiny"]
    rollouts = [Rollout(cfg, r) for r in range(cfg["rollouts"])]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(obs=8, actions=4, hidden=32, samples=64, rollouts=2, lr=5e-2, seed=0),
    # One H200 shared by three actors; a 5 MB weight sync per rollout per iteration.
    "gpu": dict(obs=256, actions=64, hidden=4096, samples=8192, rollouts=2, lr=1e-3, seed=0),
}


def pick_device(device: str = "auto") -> torch.device:
    """``"auto"``: this process's GPU when it has one, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def _init(cfg: dict[str, Any], tag: int, shape: Sequence[int], std: float,
          device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(cfg["seed"] * 1_000_003 + tag)
    return (torch.randn(*shape, generator=gen) * std).to(device)


class Policy(torch.nn.Module):
    """obs -> tanh hidden layer -> action logits; parameters ``w1, b1, w2, b2`` (a module, so
    a weight sync can name it: ``cgc.weight_sync(..., attr="policy")``)."""

    def __init__(self, cfg: dict[str, Any], device: torch.device | str | None = None,
                 trainable: bool = True) -> None:
        super().__init__()
        o, h, a = cfg["obs"], cfg["hidden"], cfg["actions"]
        device = torch.device(device) if device is not None else torch.get_default_device()
        if device.type == "meta":  # the shapes only (cgc.WeightSpec.from_module)
            init = [torch.empty(o, h), torch.empty(h), torch.empty(h, a), torch.empty(a)]
        else:
            init = [_init(cfg, 1, (o, h), o ** -0.5, device), torch.zeros(h, device=device),
                    _init(cfg, 2, (h, a), 0.1 * h ** -0.5, device),
                    torch.zeros(a, device=device)]
        self.w1, self.b1, self.w2, self.b2 = (torch.nn.Parameter(t, requires_grad=trainable)
                                              for t in init)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [self.w1, self.b1, self.w2, self.b2]

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(obs @ self.w1 + self.b1) @ self.w2 + self.b2

    def flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def load(self, flat: torch.Tensor) -> None:
        at = 0
        for p in self.params:
            n = p.numel()
            p.data.copy_(flat[at:at + n].view_as(p))
            at += n
        if at != flat.numel():
            raise ValueError(f"weights of {flat.numel()} values for a policy of {at}")


class Rollout:
    """Rollout actor ``rank``: samples with the latest weights it loaded."""

    def __init__(self, cfg: dict[str, Any], rank: int, device: str = "auto") -> None:
        self.cfg, self.rank = dict(cfg), rank
        self.device = pick_device(device)
        self.policy = Policy(cfg, self.device, trainable=False)
        self.teacher = _init(cfg, 3, (cfg["obs"], cfg["actions"]), 1.0, self.device)
        self.last_reward = float("nan")

    def sample(self, iteration: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(observations, actions, rewards)`` of iteration ``iteration``."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self.cfg["seed"] * 7919 + self.rank * 1_000_003 + iteration)
        obs = torch.randn(self.cfg["samples"], self.cfg["obs"], generator=gen,
                          device=self.device)
        with torch.no_grad():
            probs = F.softmax(self.policy.logits(obs), dim=-1)
        actions = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        rewards = (obs @ self.teacher).gather(1, actions[:, None]).squeeze(1)
        self.last_reward = float(rewards.mean())
        return obs, actions, rewards

    def load(self, weights: torch.Tensor) -> float:
        """Take the learner's new weights; returns the mean reward this actor sampled in
        the iteration that produced them."""
        self.policy.load(weights.to(self.device))
        return self.last_reward

    def report(self, synced_bytes: int) -> float:
        """After a weight sync (``cgc.weight_sync`` wrote ``self.policy`` in place): the
        mean reward this actor sampled in the iteration that produced the new weights."""
        return self.last_reward


class Learner:
    """The learner: one REINFORCE step per iteration on every rollout's samples."""

    def __init__(self, cfg: dict[str, Any], device: str = "auto") -> None:
        self.cfg = dict(cfg)
        self.device = pick_device(device)
        self.policy = Policy(cfg, self.device)
        self.opt = torch.optim.Adam(self.policy.params, lr=cfg["lr"])

    def update(self, *trajectories: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """One policy-gradient step on the rollouts' samples (in rollout order); returns
        the new weights, flat."""
        self.train(*trajectories)
        return self.policy.flat()

    def train(self, *trajectories: tuple[torch.Tensor, ...]) -> float:
        """One policy-gradient step on the rollouts' samples (in rollout order); returns
        the loss. The new weights stay in ``self.policy`` (for a weight sync)."""
        obs, actions, rewards = (torch.cat([t[i].to(self.device) for t in trajectories])
                                 for i in range(3))
        logp = F.log_softmax(self.policy.logits(obs), dim=-1)
        chosen = logp.gather(1, actions[:, None]).squeeze(1)
        loss = -(chosen * (rewards - rewards.mean())).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return float(loss.detach())


def reference(cfg: dict[str, Any], iterations: int, device: str = "auto") -> list[list[float]]:
    """The same loop in this process; one row per iteration: each rollout's mean reward."""
    rollouts = [Rollout(cfg, r, device) for r in range(cfg["rollouts"])]
    learner = Learner(cfg, device)
    rows = []
    for it in range(iterations):
        weights = learner.update(*[r.sample(it) for r in rollouts])
        rows.append([r.load(weights) for r in rollouts])
    return rows
