"""What run options need installed, checked in the driver before anything starts.

``cgc run --nvtx`` needs the ``nvtx`` package, ``--torch-profile`` needs torch (and a
folder it can write), ``--dashboard`` needs Ray's dashboard packages (``ray[default]``).
Without this check Ray would start first and every actor would then fail on its own
(exit 1, one error per actor); with it, ``start()`` raises ``ConfigError`` (the CLI: exit 2,
usage) naming the option and the install line, before Ray or any actor starts.

Nothing is imported to decide: ``importlib.util.find_spec`` of each top-level package
only looks it up (an ``import nvtx`` in the actors is still where it is used).

Example: ``check_option_needs(torch_profile="", nvtx=True, dashboard=False, address=None)``
raises ``ConfigError("nvtx=True (cgc run --nvtx) needs the nvtx package ...")`` where nvtx
is not installed.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable

from cgc.plan_schema.errors import ConfigError
from cgc.runtime.profiling import check_profiler_options

__all__ = ["check_option_needs", "missing_packages", "DASHBOARD_PACKAGES"]

# The modules Ray's dashboard imports before it starts (ray/dashboard/optional_deps.py),
# by their top-level package: all come with `pip install "ray[default]"`.
DASHBOARD_PACKAGES = ("aiohttp", "aiohttp_cors", "grpc", "opencensus", "opentelemetry",
                      "prometheus_client", "pydantic")

NVTX_INSTALL = ("pip install nvtx (or, in a cgc clone, pip install -e '.[gpu12]' for "
                "CUDA 12 or -e '.[gpu13]' for CUDA 13)")
DASHBOARD_INSTALL = "pip install 'ray[default]'"


def missing_packages(names: Iterable[str]) -> list[str]:
    """The top-level packages of ``names`` that cannot be imported here (none imported).

    Example: ``missing_packages(["json", "no_such_pkg"]) == ["no_such_pkg"]``.
    """
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # blocked (sys.modules[name] is None) or broken
            found = False
        if not found:
            out.append(name)
    return out


def check_option_needs(torch_profile: str, nvtx: bool, dashboard: bool,
                       address: str | None) -> None:
    """Refuse run options this environment cannot serve, before anything starts.

    ``dashboard`` is checked only for the local Ray cgc starts (``address`` None): a
    joined cluster keeps whatever dashboard it has.

    Raises:
        ConfigError: the torch profiler and NVTX together; a package an option needs is
            missing (the message names the option and what to install); the torch profile
            folder is a file.
    """
    check_profiler_options(torch_profile, nvtx)
    if nvtx and missing_packages(["nvtx"]):
        raise ConfigError(f"nvtx=True (cgc run --nvtx) needs the nvtx package, which is not "
                          f"installed: {NVTX_INSTALL}")
    if torch_profile:
        if missing_packages(["torch"]):
            raise ConfigError("torch_profile (cgc run --torch-profile) needs torch, which is "
                              "not installed: pip install torch")
        if address is None and os.path.exists(torch_profile) and not os.path.isdir(
                torch_profile):
            raise ConfigError(f"torch_profile (cgc run --torch-profile): {torch_profile} is a "
                              "file, not a folder for the traces")
    if dashboard and address is None:
        missing = missing_packages(DASHBOARD_PACKAGES)
        if missing:
            raise ConfigError(
                "dashboard=True (cgc run --dashboard) needs Ray's dashboard packages; "
                f"missing here: {', '.join(missing)}: {DASHBOARD_INSTALL}")
