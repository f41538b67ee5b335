"""Tensors by key for one stage: read lazily, one by one, from a ``save_pretrained``
directory (safetensors, one file or sharded; or a ``pytorch_model.bin`` read with
``torch.load(weights_only=True)``), or drawn from a fixed seed per tensor. A checkpoint is a
stranger's input: every shard it names must lie inside its folder."""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from cgc.hf.architectures import UnsupportedModelError
from cgc.hf.spec import ModelSpec

_INDEXES = (("model.safetensors.index.json", "model.safetensors"),
            ("pytorch_model.bin.index.json", "pytorch_model.bin"))
# Fused expert tensors and the per-expert keys ``save_pretrained`` writes for them, joined
# as ``from_pretrained``'s conversion does (stacked over experts, then concatenated).
_EXPERTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
_FUSED = re.compile(r"^(.*\.experts\.)(gate_up_proj|down_proj)$")


def _random(name: str, shape: Sequence[int], seed: int, device: torch.device) -> torch.Tensor:
    """A tensor from a generator keyed by ``seed`` and ``name``, sized to keep activations."""
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    if len(shape) == 1:
        if "norm" in name:
            return 1.0 + 0.1 * torch.randn(*shape, generator=gen, device=device)
        return 0.02 * torch.randn(*shape, generator=gen, device=device)
    std = 1.0 if "embed_tokens" in name else shape[-1] ** -0.5  # tokens stay distinct
    return torch.randn(*shape, generator=gen, device=device) * std


def _inside(folder: str, name: Any) -> str:
    """``folder/name``, refused unless it is a file inside ``folder``."""
    if not isinstance(name, str) or not name:
        raise UnsupportedModelError(f"{folder}: the weight map names {name!r} as a shard")
    path = os.path.realpath(os.path.join(folder, name))
    if os.path.commonpath([path, folder]) != folder:
        raise UnsupportedModelError(f"{folder}: the weight map names the shard {name!r}, "
                                    f"outside the checkpoint's folder")
    return path


class Weights:
    """Tensors by key for ``spec`` on ``device``.

    ``read`` lists every checkpoint key handed out, in order (what a stage loaded).
    ``tied``: the model's ``tie_word_embeddings``; a tied head is the embedding's tensor.

    Example: ``Weights(spec, torch.device("cpu"), False).get("lm_head.weight", (512, 64))``.

    Raises:
        UnsupportedModelError: the directory holds no weights cgc.hf reads, or its weight
            map names a shard outside the folder.
    """

    def __init__(self, spec: ModelSpec, device: torch.device, tied: bool) -> None:
        self.path, self.seed, self.device = spec.checkpoint, spec.seed, device
        self.arch, self.tied = spec.arch, tied
        self.read: list[str] = []
        self._files: dict[str, Any] = {}
        self._where: dict[str, str] = {}
        if self.path is None:
            return
        for index, single in _INDEXES:
            if os.path.exists(os.path.join(self.path, index)):
                with open(os.path.join(self.path, index)) as f:
                    weight_map = json.load(f).get("weight_map")
                if not isinstance(weight_map, dict):
                    raise UnsupportedModelError(f"{self.path}/{index}: no weight_map object")
                self._where = {str(k): _inside(self.path, v) for k, v in weight_map.items()}
                return
            if os.path.exists(os.path.join(self.path, single)):
                path = os.path.join(self.path, single)
                self._where = {k: path for k in self._open(path).keys()}
                return
        raise UnsupportedModelError(
            f"{self.path}: no weights cgc.hf reads (looked for "
            f"{', '.join(n for pair in _INDEXES for n in pair)})")

    def _open(self, path: str) -> Any:
        """The open file at ``path`` (safetensors lazily; a .bin whole, tensors only)."""
        if path not in self._files:
            if path.endswith(".safetensors"):
                from safetensors import safe_open

                self._files[path] = safe_open(path, "pt")
            else:
                self._files[path] = torch.load(path, map_location="cpu", weights_only=True,
                                               mmap=True)
        return self._files[path]

    def _tensor(self, key: str) -> torch.Tensor:
        """The checkpoint's tensor ``key`` (fused from per-expert keys where it has those)."""
        if key not in self._where:
            fused = _FUSED.match(key)
            if fused is not None:
                return self._experts(*fused.groups())
            raise KeyError(f"{key}: not in the checkpoint at {self.path}")
        self.read.append(key)
        f = self._open(self._where[key])
        return f.get_tensor(key) if hasattr(f, "get_tensor") else f[key]

    def _experts(self, prefix: str, name: str) -> torch.Tensor:
        """``prefix + name`` as ``from_pretrained`` builds it from per-expert keys."""
        per_expert: list[torch.Tensor] = []
        while f"{prefix}{len(per_expert)}.{_EXPERTS[name][0]}.weight" in self._where:
            e = len(per_expert)
            per_expert.append(torch.cat([self._tensor(f"{prefix}{e}.{part}.weight")
                                         for part in _EXPERTS[name]], dim=0))
        if not per_expert:
            raise KeyError(f"{prefix}{name}: not in the checkpoint at {self.path} (nor "
                           f"{prefix}0.{_EXPERTS[name][0]}.weight, its per-expert form)")
        return torch.stack(per_expert)

    def get(self, key: str, shape: Sequence[int]) -> torch.Tensor:
        """The tensor named ``key`` (float32 or the checkpoint's dtype), on this device.

        Example: ``weights.get("model.norm.weight", (64,))``.

        Raises:
            KeyError: the checkpoint does not hold ``key``.
            ValueError: it holds another shape.
        """
        if key == "lm_head.weight" and self.tied and (self.path is None
                                                      or key not in self._where):
            like = self._keys_like("embed_tokens.weight")
            if len(like) != 1:
                raise KeyError(f"{key}: tied, and the checkpoint has {len(like)} embeddings "
                               f"({like})")
            key = like[0]
        if self.path is None:
            self.read.append(key)
            return _random(f"{self.arch}:{key}", shape, self.seed, self.device)
        t = self._tensor(key)
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{key}: checkpoint shape {tuple(t.shape)}, model {tuple(shape)}")
        return t.to(self.device)

    def _keys_like(self, suffix: str) -> list[str]:
        """Checkpoint keys ending in ``suffix``."""
        if self.path is None:
            return ["model." + suffix]
        return [k for k in self._where if k.endswith(suffix)]

    def close(self) -> None:
        """Close the checkpoint files."""
        self._files.clear()
