"""Ray GPU programs through ``cgc.ray_compat`` with live GPU actors, on a machine without
GPUs: a local Ray declaring two logical GPUs, the communicators bound to the CPU
communicator. The live actors keep what Ray gave them (GPU ids read at compile time), so
their tensor edges compile to device edges; every value equals the same compute in one
process, and the live actors outlive the graph.

The programs (``ray_gpu_programs``) run in one subprocess with its own Ray
(``logical_gpus_script.py``): the test session's cluster declares no GPUs. The same
programs run on a real GPU in ``tests/gpu/test_gpu_ray_compat.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent

# Ray would hand real GPUs out as the logical ones (and refuses more than it can see when
# they are hidden): on a GPU machine tests/gpu/test_gpu_ray_compat.py runs these programs.
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="logical GPUs stand in for real ones only where there are none (see tests/gpu)",
)


@pytest.fixture(scope="module")
def reports() -> dict:
    """Every program's report from one run of the script (about a minute here)."""
    proc = subprocess.run([sys.executable, str(HERE / "logical_gpus_script.py")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(reports: dict, name: str) -> dict:
    rep = reports[name]
    assert "error" not in rep, rep.get("traceback") or rep["error"]
    return rep


def exact(rep: dict) -> None:
    assert rep["outputs"] == rep["reference"]
    assert rep["alive_after"], "a live actor did not outlive the graph's teardown"


@pytest.mark.parametrize("name", ["nccl_pipeline_half", "nccl_pipeline_one"])
def test_issue_program_live_gpu_actors_nccl_edge(reports, name):
    """Two ``ray.remote(num_gpus=...)(Stage)`` actors from ``.remote()``, one
    ``with_tensor_transport("nccl")`` edge: compiles (the live actors hold GPU ids), binds
    the CPU communicator, and computes what one process computes."""
    rep = report(reports, name)
    exact(rep)
    assert rep["channels"] == ["@driver->stage0:host", "stage0->stage1:nccl",
                               "stage1->@driver:host"]
    assert rep["bindings"] == ["cpu"]
    held = rep["held"]
    assert all(len(ids) == 1 for ids in held.values())
    # num_gpus=0.5: both on one (logical) GPU; num_gpus=1: one each.
    assert (held["stage0"] == held["stage1"]) == (name == "nccl_pipeline_half")


def test_collectives_allreduce_bucketed_and_reducescatter(reports):
    rep = report(reports, "collectives")
    exact(rep)
    assert rep["bindings"] == ["cpu"]
    assert all(ch.endswith(":host") for ch in rep["channels"])  # collectives use no channel


def test_device_hints_deliver_where_asked(reports):
    """device="cpu" (host memory, moved to the CPU), "gpu" on a host edge, "cuda" and
    "default" on device edges; without CUDA the GPU ones stay on the CPU."""
    rep = report(reports, "device_hints")
    exact(rep)
    kinds = [c.rsplit(":", 1)[1] for c in rep["channels"] if c.startswith("stage0->")]
    assert sorted(kinds) == ["host", "host", "nccl", "nccl"]


def test_auto_transport_device_edge_between_gpu_actors_host_elsewhere(reports):
    rep = report(reports, "auto_transport")
    exact(rep)
    chans = set(rep["channels"])
    # stage1 makes t; stage0 (GPU) gets it on a device edge, stage2 (no GPU) over host.
    assert {"stage1->stage0:nccl", "stage1->stage2:host", "stage0->@driver:host"} <= chans
    assert rep["held"]["stage2"] == []


@pytest.mark.parametrize("flag", [True, False])
def test_overlap_gpu_communication_flag_reaches_the_plan(reports, flag):
    rep = report(reports, "overlap_on" if flag else "overlap_off")
    exact(rep)
    assert rep["overlap"] is flag
    assert (rep["comm_stream_ops"] > 0) is flag


def test_torch_tensor_type_hint(reports):
    rep = report(reports, "tensor_type_hint")
    exact(rep)
    assert rep["channels"][1] == "stage0->stage1:nccl"


@pytest.mark.parametrize("name", ["nccl_error_direct_return", "nccl_error_static_shape",
                                  "nccl_error_plain", "direct_return_broken"])
def test_app_error_on_an_nccl_edge_breaks_the_graph_as_in_ray(reports, name):
    """Ray 2.60: an app error in an NCCL edge's writer is the task's error; with
    _static_shape or _direct_return the graph is then torn down (RayChannelError next). A
    non-tensor on a _direct_return edge is Ray's ValueError, in its words."""
    exact(report(reports, name))


@pytest.mark.parametrize("name", ["auto_resolved_one", "auto_resolved_half"])
def test_auto_hints_show_rays_resolved_type_after_compile(reports, name):
    """Ray's test_torch_tensor_auto: "accelerator" between actors on different GPUs, "auto"
    (host memory) on a shared GPU and towards the driver."""
    exact(report(reports, name))


@pytest.mark.parametrize("name", ["auto_needs_communicator_one",
                                  "auto_needs_communicator_half"])
def test_auto_edge_resolved_to_the_accelerator_needs_a_communicator_as_in_ray(reports, name):
    """_default_communicator=None refuses an auto edge between different GPUs (Ray's words);
    on a shared GPU Ray resolves to host memory, and it compiles."""
    exact(report(reports, name))
