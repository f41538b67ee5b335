"""What the three Ray Direct Transport examples share: actor classes that may use RDT, the
collective group a two-sided transport needs, and the hint on a call.

Plain Ray (2.60), nothing of cgc: an RDT hint is Ray's ``.options(tensor_transport=...)`` on
one call (``"gloo"`` on the CPU; ``"nccl"``, ``"cuda_ipc"``, ``"nixl"`` on GPUs), and
``"gloo"``/``"nccl"`` need the actors in one collective group first
(``ray.experimental.collective.create_collective_group``). ``"none"`` sends through Ray's
object store. The driver reads results from the object store: the last call of a step
carries no hint (``ray.get`` refuses an object of a two-sided RDT transport).
"""

from __future__ import annotations

from typing import Any

import ray

TRANSPORTS = ("gloo", "nccl", "cuda_ipc", "nixl", "none")


def actor_class(cls: type, num_gpus: float = 0.0, num_cpus: float = 0.5) -> Any:
    """``cls`` as a Ray actor class whose calls may use RDT."""
    opts: dict[str, Any] = {"num_gpus": num_gpus} if num_gpus else {"num_cpus": num_cpus}
    return ray.remote(enable_tensor_transport=True, **opts)(cls)


def setup_transport(actors: list, transport: str) -> None:
    """Put ``actors`` in one collective group when ``transport`` is two-sided (gloo, nccl)."""
    if transport in ("gloo", "nccl"):
        from ray.experimental.collective import create_collective_group

        create_collective_group(actors, backend="torch_gloo" if transport == "gloo" else "nccl")


def send(method: Any, transport: str) -> Any:
    """``actor.m`` with its result sent by ``transport`` (``"none"``: the object store)."""
    return method if transport == "none" else method.options(tensor_transport=transport)
