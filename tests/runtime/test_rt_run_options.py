"""Run options are typed once, in ``RunConfig``: ``Plan.start`` takes exactly its fields
(and passes them on as they are), and every run option of ``cgc run`` is one of them."""

from __future__ import annotations

import dataclasses
import inspect

from cgc.plan_schema.defaults import RunConfig
from cgc.runtime.driver.plan import Plan

FIELDS = {f.name for f in dataclasses.fields(RunConfig)}


def test_plan_start_takes_exactly_the_run_config_fields():
    params = inspect.signature(Plan.start).parameters
    options = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert options == FIELDS
    assert all(params[n].default is None for n in options)  # None: the plan's value


def test_plan_start_passes_every_option_on(monkeypatch):
    import cgc.runtime.driver.start as start
    import cgc.runtime.driver.trust_gate as gate

    seen = {}

    def fake_start(plan, address, **options):
        seen.update(options, address=address)
        return "graph"

    monkeypatch.setattr(start, "start_graph", fake_start)
    monkeypatch.setattr(gate, "require_trusted", lambda plan: None)
    from pathlib import Path

    from cgc.plan_schema import plan_pb2 as pb

    got = Plan(pb.Plan()).start("auto", get_timeout=5, trace=Path("t.json"), nvtx=True)
    assert got == "graph" and seen.pop("address") == "auto"
    assert set(seen) == FIELDS
    assert seen["get_timeout"] == 5 and seen["trace"] == "t.json" and seen["nvtx"] is True
    assert all(v is None for k, v in seen.items() if k not in ("get_timeout", "trace", "nvtx"))


def test_cgc_run_options_are_run_config_fields():
    from cgc.cli.run_cmd import run_cmd

    own = {"plan_path", "iters", "warmup", "address", "input_json", "as_json", "trust",
           "trace_path", "no_cuda_graphs",
           "verbose"}  # cgc run's own (display only, or renamed below)
    names = {p.name for p in run_cmd.params} - own
    assert names <= FIELDS, names - FIELDS
