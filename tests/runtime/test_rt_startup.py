"""Start-up: plan files, placement checks, binding actors, import isolation, idle cost."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import ray
import rt_graphs as G
from idle_cpu import BUDGET_S, cpu_seconds, is_quiet, quiet_window

import cgc
from cgc import InputNode
from cgc.runtime import PlacementError, Plan, PlanFormatError, SetupError, load

ROOT = Path(__file__).resolve().parents[2]


def test_save_load_roundtrip_and_run(ray_cluster, tmp_path):
    plan = cgc.compile_file(ROOT / "examples" / "multi_return.py")
    path = tmp_path / "mr.cgplan"
    plan.save(path)
    loaded = load(path)
    assert isinstance(loaded, Plan) and loaded.name == "multi_return"
    assert loaded.proto == plan.proto and not loaded.classes
    with loaded.start(get_timeout=30) as g:  # embedded source: built inside the actors
        assert [r.get() for r in g.execute("a bb ccc")] == [3, "8 chars"]


def test_bad_plan_files(tmp_path):
    with pytest.raises(PlanFormatError):
        load(tmp_path / "missing.cgplan")
    (tmp_path / "junk.cgplan").write_bytes(b"not a plan")
    with pytest.raises(PlanFormatError):
        cgc.load(tmp_path / "junk.cgplan")
    proto = G.echo_plan().proto
    proto.ClearField("lowered")
    with pytest.raises(PlanFormatError, match="program"):
        Plan(proto).start()


def test_unplaceable_actor_is_named(ray_cluster):
    w = G.Worker.options(resources={"no_such_accelerator": 1}).bind()
    with InputNode() as inp:
        dag = w.add.bind(inp)
    plan = cgc.compile(dag, name="t_unplaceable")
    with pytest.raises(PlacementError, match="actor worker needs .*no_such_accelerator"):
        plan.start(address="auto")


@cgc.actor(num_cpus=6)
class Wide:
    def f(self, x):
        return x + 1


def test_placement_waits_for_resources_being_released(ray_cluster):
    """A graph started right after another one's actors went away: Ray hands their
    resources back asynchronously, so start waits (bounded) instead of failing."""

    @ray.remote(num_cpus=14)
    class Holder:
        def ping(self) -> int:
            return 1

    h = Holder.remote()
    ray.get(h.ping.remote())
    with InputNode() as inp:
        dag = Wide.bind().f.bind(inp)
    plan = cgc.compile(dag, name="wide")
    threading.Timer(1.0, ray.kill, args=(h,)).start()
    with plan.start(get_timeout=30) as g:
        assert g.execute(1).get() == 2


def test_missing_external_actor_is_clear(ray_cluster):
    proto = G.echo_plan().proto
    proto.graph.actors[0].external.name = "cgc-test-no-such-actor"
    with pytest.raises(SetupError, match="cgc-test-no-such-actor"):
        Plan(proto).start()


def test_named_external_actor_is_bound_not_killed(ray_cluster):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(G)
    try:
        h = ray.remote(G.Worker.__wrapped__).options(name="cgc-test-ext").remote(5)
    finally:
        cloudpickle.unregister_pickle_by_value(G)
    try:
        proto = G.chain_plan(1).proto
        proto.graph.actors[0].external.name = "cgc-test-ext"
        with Plan(proto).start(get_timeout=30) as g:  # no live handle: found by name
            assert g.execute(1).get() == 6
        assert ray.get(h.add.remote(1), timeout=10) == 6  # still alive after teardown
    finally:
        ray.kill(h)


def test_idle_graph_uses_almost_no_cpu(ray_cluster):
    with G.chain_plan(3).start(get_timeout=30) as g:
        assert g.execute(1).get() == 7
        handles = list(g.actors.values())
        pids = [ray.get(h.pid.remote(), timeout=10) for h in handles]
        time.sleep(0.3)  # the last wake-ups of the run settle
        windows = quiet_window(pids)
        assert is_quiet(windows[-1]), f"CPU seconds per actor, per 1 s window: {windows}"
        # The control: the same measurement sees an actor that does burn CPU. Over the whole
        # busy call, not a fixed window: on 2 shared cores (pytest-xdist) a window can catch
        # the spinning actor descheduled.
        before = [cpu_seconds(p) for p in pids]
        busy = handles[0].busy.remote(0.8)
        assert ray.get(busy, timeout=30) == 0.8
        burnt = [round(cpu_seconds(p) - b, 3) for p, b in zip(pids, before, strict=True)]
        assert burnt[0] > 3 * BUDGET_S, burnt
        assert g.execute(2).get() == 8  # still running


def test_runtime_never_imports_the_compiler(ray_address, tmp_path):
    plan = tmp_path / "echo.cgplan"
    cgc.compile_file(ROOT / "examples" / "echo.py").save(plan)
    bad = tmp_path / "bad.cgplan"
    proto = G.echo_plan().proto
    proto.graph.actors[0].options.resources.add(name="no_such_accelerator", amount=1)
    Plan(proto).save(bad)
    script = textwrap.dedent(f"""
        import json, sys
        import cgc.runtime as rt
        from cgc.runtime import PlacementError
        out = {{}}
        with rt.load({str(plan)!r}).start(address={ray_address!r}, get_timeout=30) as g:
            out["value"] = g.execute("hi").get()
        out["prefixes"] = [g.prefix]
        try:
            rt.load({str(bad)!r}).start(address={ray_address!r})
        except PlacementError as exc:
            out["placement"] = str(exc)
        # start() runs the same checks as `cgc check`, from the contract package
        # (cgc.plan_schema.verify); nothing of the compiler may come with them.
        out["verifier"] = "cgc.plan_schema.verify" in sys.modules
        out["modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "networkx"
                                or m.startswith(("cgc.verify", "cgc.frontend", "cgc.passes",
                                                 "cgc.ir")))
        left_running = rt.load({str(plan)!r}).start(address={ray_address!r}, get_timeout=30)
        assert left_running.execute("again").get() == "again"
        out["prefixes"].append(left_running.prefix)
        print("RESULT" + json.dumps(out))  # exits with the graph running: atexit tears down
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, proc.stdout + proc.stderr
    out = json.loads(line[0][len("RESULT"):])
    assert out["value"] == "hi"
    assert "echo" in out["placement"] and "no_such_accelerator" in out["placement"]
    assert out["modules"] == []
    assert out["verifier"]
    assert proc.returncode == 0, proc.stderr
    from cgc.runtime.channels import list_segments

    assert [list_segments(p) for p in out["prefixes"]] == [[], []]


MODEL_WITH_RESULT_CLASS = '''
from dataclasses import dataclass

import cgc
from cgc import InputNode


@dataclass
class Result:
    value: int


@cgc.actor
class Maker:
    def make(self, x):
        return Result(x * 2)


@cgc.actor
class Reader:
    def read(self, r):
        return Result(r.value + 1)


def build_dag():
    m, r = Maker.bind(), Reader.bind()
    with InputNode() as inp:
        return r.read.bind(m.make.bind(inp))
'''


def test_values_of_model_file_classes_reach_a_fresh_driver(ray_address, tmp_path):
    """A plan file run by a process that never imported the model: the driver and every
    actor import the model module from the plan when a value needs it."""
    model = tmp_path / "resultmodel.py"
    model.write_text(MODEL_WITH_RESULT_CLASS)
    plan = tmp_path / "resultmodel.cgplan"
    cgc.compile_file(model).save(plan)
    script = textwrap.dedent(f"""
        import cgc.runtime as rt
        with rt.load({str(plan)!r}).start(address={ray_address!r}, get_timeout=30) as g:
            out = g.execute(20).get()
        print("RESULT", type(out).__module__, type(out).__name__, out.value)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT cgcmodel_resultmodel Result 41" in proc.stdout
