"""tools/bench/capture_transfer.py without a GPU: the fixed-value flag scheme is model-checked
(and its broken controls are caught), the table never times a wrong variant, and the two-
process harness runs end to end on the CPU device with every step's data checked."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "bench"))
import capture_transfer as ct  # noqa: E402
from capture_transfer_scheme import (  # noqa: E402
    FREE,
    FULL,
    reader_program,
    simulate,
    writer_program,
)


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_the_flag_scheme_orders_every_step_under_random_interleavings(slots):
    for seed in range(100):
        r = simulate(slots, 40, random.Random(seed))
        assert r.ok, (seed, r.errors[:3], r.deadlock)
        assert r.reads == 40


def test_a_reader_without_its_wait_is_caught():
    rs = [simulate(2, 40, random.Random(s), reader=lambda k: reader_program(k, wait_full=False))
          for s in range(50)]
    assert sum(bool(r.errors) for r in rs) >= 45


def test_a_writer_without_its_wait_is_caught():
    rs = [simulate(2, 40, random.Random(s), writer=lambda k: writer_program(k, wait_free=False))
          for s in range(50)]
    assert sum(bool(r.errors) for r in rs) >= 45


def test_a_reset_before_the_copy_out_is_caught():
    # The reader frees the slot before reading it: the writer may overwrite mid-copy.
    def early_free(k):
        return [("wait", k, FULL), ("write", k, FREE), ("copy_out", k), ("consume",)]
    rs = [simulate(2, 40, random.Random(s), reader=early_free) for s in range(100)]
    assert any(r.errors for r in rs)


def test_programs_are_fixed_per_slot():
    # What a captured graph bakes in must not depend on the step: same slot, same ops.
    assert writer_program(1) == writer_program(1)
    assert [op for op in writer_program(0) if op[0] == "write"] == [("write", 0, FULL)]
    assert [op for op in reader_program(0) if op[0] == "wait"] == [("wait", 0, FULL)]
    with pytest.raises(ValueError):
        simulate(0, 1, random.Random(0))


def test_sizes_and_variants_are_parsed_and_checked():
    a = ct.parse_args(["--sizes", "16K,1M,16MiB", "--variants", "ipc-eager,nccl-graph"])
    assert a.size_list == [16384, 1 << 20, 16 << 20]
    assert a.variant_list == ["ipc-eager", "nccl-graph"]
    for bad in (["--variants", "ipc-magic"], ["--sizes", "6"], ["--modes", "sideways"]):
        with pytest.raises(SystemExit):
            ct.parse_args(bad)


def test_two_gpus_take_the_nccl_variants_only_and_divide_by_nccl_eager():
    a = ct.parse_args(["--gpus", "2", "--sizes", "1M"])
    assert a.variant_list == ["nccl-eager", "nccl-graph"] and a.baseline == "nccl-eager"
    assert ct.parse_args([]).baseline == "ipc-eager"
    for bad in (["--gpus", "2", "--variants", "ipc-eager,nccl-graph"],
                ["--gpus", "2", "--device", "cpu"], ["--gpus", "3"]):
        with pytest.raises(SystemExit):
            ct.parse_args(bad)
    cells = {("nccl-eager", 1024): ct.Cell([40.0], [20.0], 1),
             ("nccl-graph", 1024): ct.Cell([30.0], [10.0], 1)}
    rows = ct.table(cells, a.variant_list, [1024], a.baseline).splitlines()
    assert "÷ nccl-eager" in rows[0]
    assert rows[3].endswith("| 30.0 | 0.75 | 10.0 | 0.50 | yes |")


def test_the_table_does_not_time_a_wrong_variant_and_divides_by_ipc_eager():
    cells = {("ipc-eager", 1024): ct.Cell([100.0, 300.0], [50.0], 2),
             ("ipc-memop-graph", 1024): ct.Cell([50.0], [25.0], 2),
             ("nccl-graph", 1024): ct.Cell([1.0], [1.0], 1, wrong=["lockstep: 3 wrong words"]),
             ("nccl-eager", 1024): ct.Cell(error="rank 1: boom")}
    rows = ct.table(cells, list(ct.VARIANTS), [1024]).splitlines()
    by = {r.split(" | ")[0].lstrip("| "): r for r in rows[2:]}
    assert by["ipc-eager"].endswith("| 200.0 | 1.00 | 50.0 | 1.00 | yes |")
    assert by["ipc-memop-graph"].endswith("| 50.0 | 0.25 | 25.0 | 0.50 | yes |")
    assert by["nccl-graph"].endswith("| - | - | - | - | no |")
    assert by["nccl-eager"].endswith("| failed |")
    assert "ipc-memop-eager" not in by  # no cell, no row


@pytest.mark.slow
def test_the_two_process_harness_runs_on_the_cpu_device_and_checks_data():
    cells = ct.main(["--device", "cpu", "--sizes", "16K", "--iters", "20", "--warmup", "3",
                     "--rounds", "1", "--job-timeout", "60"])
    for v in ("ipc-eager", "ipc-memop-eager", "ipc-memop-graph"):
        c = cells[(v, 16384)]
        assert c.correct is True, (v, c.error, c.wrong)
        assert len(c.lat_us) == 20 and len(c.pipe_us) == 1
    # the control (no device-side wait on the reader) must be caught by the data check
    assert cells[("ipc-memop-graph-nowait", 16384)].correct is False
    assert cells[("nccl-graph", 16384)].skip
