"""Actors for the weight-sync tests: the RL example's rollout and learner, with a module
changed after construction (as a stale or edited model would be), and a probe of the
rollout's parameter addresses."""

from __future__ import annotations

from typing import Any

import rl_policy
import torch

import cgc


def _change(policy: torch.nn.Module, change: str) -> None:
    """Make the module unlike the plan's list in one named way."""
    if change == "rename":
        policy.register_parameter("w1_renamed", policy.w1)
        del policy.w1
    elif change == "missing":
        del policy.b2
    elif change == "reshape":
        policy.w1 = torch.nn.Parameter(torch.zeros(policy.w1.shape[0], policy.w1.shape[1] + 1))
    elif change == "dtype":
        policy.b1 = torch.nn.Parameter(policy.b1.detach().double())
    elif change:
        raise ValueError(change)


@cgc.actor(num_cpus=0.5)
class Rollout(rl_policy.Rollout):
    """The example's rollout; ``change`` breaks its policy module (see ``_change``)."""

    def __init__(self, cfg: dict[str, Any], rank: int, change: str = "") -> None:
        super().__init__(cfg, rank, "cpu")
        _change(self.policy, change)

    def addresses(self, synced_bytes: int) -> list[int]:
        """``data_ptr()`` of every policy parameter, after this execution's sync."""
        return [p.data_ptr() for p in self.policy.parameters()]


@cgc.actor(num_cpus=0.5)
class Learner(rl_policy.Learner):
    """The example's learner; ``change`` breaks its policy module."""

    def __init__(self, cfg: dict[str, Any], change: str = "") -> None:
        super().__init__(cfg, "cpu")
        _change(self.policy, change)
