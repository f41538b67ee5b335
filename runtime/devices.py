"""Device moves for host channels whose plan says where readers get the value.

A ``with_tensor_transport(device="cpu"|"gpu")`` hint on a host edge becomes
``Channel.device``: the reader moves every torch tensor in the value (inside lists, tuples
and dicts too) to that device after reading. Without CUDA on a reader the plan takes for a
GPU actor (CPU-only runs of GPU plans), "gpu" keeps tensors on the CPU, the same way those
runs drop ``num_gpus``. A reader the plan knows holds no GPU (only a Ray program through
``cgc.ray_compat`` compiles such an edge, as Ray 2.60 runs it) moves them anyway, so the
read fails where Ray's does ("No CUDA GPUs are available").
"""

from __future__ import annotations

import sys
from typing import Any

from cgc.plan_schema import plan_pb2 as pb

__all__ = ["move_to", "DeviceReader", "DeviceMoveError", "with_device", "plan_gives_gpu"]


class DeviceMoveError(Exception):
    """A value was read but could not be moved to the reader's device (its ``__cause__``
    is torch's error). The value is consumed: the reader records the task's error and
    goes on, as Ray's reader does."""


def move_to(value: Any, device: str) -> Any:
    """``value`` with every torch tensor in it moved to ``device`` ("cpu" or "cuda").

    Example: ``move_to({"x": torch.ones(2)}, "cpu")``.
    """
    torch = sys.modules.get("torch")
    if torch is None:  # no tensor can have been unpickled without importing torch
        return value
    return _move(value, device, torch)


def _move(value: Any, device: str, torch: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value if value.device.type == device else value.to(device)
    if type(value) is list:
        return [_move(v, device, torch) for v in value]
    if type(value) is tuple:
        return tuple(_move(v, device, torch) for v in value)
    if type(value) is dict:
        return {k: _move(v, device, torch) for k, v in value.items()}
    return value


class DeviceReader:
    """A channel reader that moves what it reads to one device."""

    def __init__(self, inner: Any, device: str) -> None:
        self._inner = inner
        self._device = device

    def read(self, timeout: float | None = None) -> Any:
        return self._moved(self._inner.read(timeout))

    def read_at(self, position: int, timeout: float | None = None) -> Any:
        return self._moved(self._inner.read_at(position, timeout))

    def _moved(self, value: Any) -> Any:
        """``value`` on this reader's device (DeviceMoveError if torch cannot)."""
        try:
            return move_to(value, self._device)
        except Exception as exc:  # noqa: BLE001 - torch's error, carried as the task's
            raise DeviceMoveError(f"moving the value read to {self._device}: {exc}") from exc

    @property
    def position(self) -> int:
        """Values consumed so far (the inner reader's)."""
        return self._inner.position

    @property
    def last_nbytes(self) -> int:
        """Payload bytes of the last value read (the inner reader's)."""
        return self._inner.last_nbytes

    def poison(self) -> None:
        """Wake a blocked read in another thread (the inner reader's ``poison``)."""
        self._inner.poison()

    def close(self) -> None:
        """Close the channel (the inner reader's ``close``)."""
        self._inner.close()

    def detach(self) -> None:
        """Let go of this end without closing the channel (the inner reader's ``detach``)."""
        self._inner.detach()


def with_device(reader: Any, ch: pb.Channel, reader_has_gpu: bool = True) -> Any:
    """Wrap ``reader`` when ``ch`` asks for a device; return it unchanged otherwise
    (``reader_has_gpu``: whether the plan takes the reading actor for a GPU actor)."""
    if ch.device == pb.CPU:
        return DeviceReader(reader, "cpu")
    if ch.device == pb.GPU:
        import torch

        if torch.cuda.is_available() or not reader_has_gpu:
            return DeviceReader(reader, "cuda")
    return reader


def plan_gives_gpu(actor: pb.Actor) -> bool:
    """Whether the plan takes ``actor`` for a GPU actor (the compiler's rule, which the
    runtime may not import: created with ``num_gpus > 0``, or live with GPU ids when
    compiled).

    Example: ``plan_gives_gpu(pb.Actor(options=pb.ActorOptions(num_gpus=1)))`` is True.

    Raises:
        Nothing.
    """
    if actor.external.placement.observed:
        return len(actor.external.placement.gpu_ids) > 0
    return actor.options.num_gpus > 0
