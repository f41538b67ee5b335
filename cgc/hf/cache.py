"""The static KV cache a stage's decoder layers write to."""

from __future__ import annotations

from typing import Any

import torch


class StaticKV:
    """``StaticCache``'s layout per layer, ``(batch, kv_heads, max_seq, head_dim)``, written
    at the step's positions (a device tensor, so a captured step replays for any position).
    The library's attention calls only ``update``.

    Example: ``StaticKV({0: (k, v)}).update(key, value, 0)`` returns the whole ``(k, v)``.
    """

    def __init__(self, layers: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.layers = layers
        self.positions: torch.Tensor | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key``/``value`` at ``self.positions`` of layer ``layer_idx``; the cache.

        Raises:
            KeyError: a layer this cache does not hold.
        """
        k, v = self.layers[layer_idx]
        k.index_copy_(2, self.positions, key)
        v.index_copy_(2, self.positions, value)
        return k, v
