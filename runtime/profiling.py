"""Profilers as run options (never import-time environment variables).

- ``torch_profile=DIR`` (``cgc run --torch-profile DIR``): each actor's loop thread runs
  under ``torch.profiler`` (CPU, and CUDA when the actor has a GPU) and writes one Chrome
  trace per actor, ``DIR/<plan>-<actor>-<pid>.json``, when the loop stops (teardown). DIR is
  a path on each actor's node.
- ``nvtx=True`` (``cgc run --nvtx``): an NVTX range around every op, named by its token and
  task (``3C w1.fwd#0``), for Nsight Systems. Needs the ``nvtx`` package (the gpu extras).
  Nsight itself is Ray's business: give the actors ``runtime_env={"nsight": ...}`` in the
  model; the plan passes it through.

The two are refused together: the torch profiler and Nsight Systems both take CUDA's
activity API (CUPTI), so one would silently miss what the other records.

Example::

    with plan.start(torch_profile="/tmp/prof") as graph:
        graph.execute(1).get()
    # /tmp/prof/<plan>-<actor>-<pid>.json, one per actor
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

from cgc.plan_schema.errors import ConfigError
from cgc.runtime.errors import SetupError

__all__ = ["check_profiler_options", "nvtx_wrap", "torch_profile", "require_nvtx"]


def check_profiler_options(torch_profile: str, nvtx: bool) -> None:
    """Refuse combinations that cannot work together.

    Raises:
        ConfigError: ``torch_profile`` and ``nvtx`` both asked for.
    """
    if torch_profile and nvtx:
        raise ConfigError(
            "--torch-profile and --nvtx cannot be combined: the torch profiler and Nsight "
            "Systems both use CUDA's activity API (CUPTI); run them in separate runs")


def require_nvtx() -> Any:
    """The ``nvtx`` module.

    Raises:
        SetupError: the package is not installed in this actor's environment.
    """
    try:
        import nvtx
    except ImportError:
        raise SetupError("--nvtx needs the nvtx package in every actor's environment: "
                         "pip install nvtx (or, in a cgc clone, "
                         "pip install -e '.[gpu13]' or -e '.[gpu12]')") from None
    return nvtx


def nvtx_wrap(op: Callable[[], None], name: str, nvtx: Any) -> Callable[[], None]:
    """``op`` inside an NVTX range called ``name``."""
    push, pop = nvtx.push_range, nvtx.pop_range

    def run() -> None:
        push(name, domain="cgc")
        try:
            op()
        finally:
            pop(domain="cgc")
    return run


@contextlib.contextmanager
def torch_profile(directory: str, plan: str, actor: str) -> Iterator[None]:
    """Profile the calling thread with torch.profiler; export a Chrome trace on exit.

    Raises:
        SetupError: torch is missing or the directory cannot be created.
    """
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        raise SetupError("--torch-profile needs torch in every actor's environment") from None
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise SetupError(f"--torch-profile: cannot create {directory}: {exc}") from None
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    # One cycle covers the whole run: acc_events=True keeps its events, as without a
    # schedule they are kept anyway, and stops torch (2.11 on the GPU host) warning once per
    # actor that a cycle's events are cleared. Older torch has no such argument.
    opts: dict[str, Any] = {"record_shapes": False}
    if "acc_events" in inspect.signature(profile).parameters:
        opts["acc_events"] = True
    prof = profile(activities=activities, **opts)
    prof.__enter__()
    try:
        yield
    finally:
        prof.__exit__(None, None, None)
        path = os.path.join(directory, f"{plan}-{actor}-{os.getpid()}.json")
        prof.export_chrome_trace(path)
