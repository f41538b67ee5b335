"""A rollout for the GPU weight-sync test: it replays a CUDA graph captured over its policy
parameters, and compares the replay with an eager call after every sync."""

from __future__ import annotations

from typing import Any

import rl_policy
import torch

import cgc


@cgc.actor(num_gpus=0.3)
class GraphedRollout(rl_policy.Rollout):
    def __init__(self, cfg: dict[str, Any], rank: int) -> None:
        super().__init__(cfg, rank, "cuda")
        gen = torch.Generator().manual_seed(100 + rank)
        self.probe = torch.randn(16, cfg["obs"], generator=gen).cuda()

    @cgc.method(cuda_graph=True)
    def probe_logits(self, synced_bytes: int) -> torch.Tensor:
        """Captured once, replayed after every later sync: it reads the parameters at the
        addresses it saw at capture."""
        with torch.no_grad():
            return self.policy.logits(self.probe)

    def check(self, graphed: torch.Tensor) -> dict[str, Any]:
        """How far the replay is from an eager call now, and how far the eager result moved
        since the last sync (a replay reading stale weights is off by that much)."""
        with torch.no_grad():
            eager = self.policy.logits(self.probe)
        last, self.last_eager = getattr(self, "last_eager", None), eager
        return {"replay_off": float((graphed - eager).abs().max()),
                "moved": float("inf") if last is None else float((eager - last).abs().max()),
                "ptrs": [p.data_ptr() for p in self.policy.parameters()],
                "reward": self.last_reward}


@cgc.actor(num_gpus=0.3)
class Learner(rl_policy.Learner):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg, "cuda")
