"""How cgc starts its local Ray: `cgc run --dashboard` asks for Ray's dashboard (without
it, none starts); a plan with more actors than cores caps Ray's worker start-ups at once.

No Ray here: ``load`` is replaced by a stand-in plan that records what ``start`` got, and
``ensure_ray``'s kwargs are checked with ``ray.init`` replaced.
"""

from __future__ import annotations

import types

from click.testing import CliRunner

from cgc.cli.run_cmd import run_cmd


class _Ref:
    def get(self):
        return 1


class _Graph:
    setup_seconds, ray_start_seconds = 0.5, 0.25
    channel_bindings: dict = {}
    comm_bindings: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, *args, **kwargs):
        return _Ref()


def _run(monkeypatch, argv: list[str]) -> dict:
    seen: dict = {}

    class _Plan:
        name = "stub"

        def start(self, address, **kwargs):
            seen.update(kwargs)
            return _Graph()

    import cgc.runtime

    monkeypatch.setattr(cgc.runtime, "load", lambda path, trust=False: _Plan())
    res = CliRunner().invoke(run_cmd, ["p.cgplan", "--input", "[1]", "--iters", "1",
                                       "--warmup", "0", *argv])
    assert res.exit_code == 0, res.output
    return seen


def test_dashboard_flag_reaches_plan_start(monkeypatch):
    assert _run(monkeypatch, ["--dashboard"])["dashboard"] is True
    assert _run(monkeypatch, [])["dashboard"] is None  # the default: off


def _init_kwargs(monkeypatch, plans, **kw) -> list[dict]:
    """What ``ensure_ray`` passes to ``ray.init`` for each plan (no Ray started)."""
    import ray

    from cgc.runtime import cluster

    got: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **k: got.append(k))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "get_runtime_context",
                        lambda: types.SimpleNamespace(get_node_id=lambda: "n"))
    monkeypatch.setattr(cluster, "_OWN", {})
    for plan in plans:
        cluster.ensure_ray(plan, None, **kw)
    return got


def test_ensure_ray_passes_include_dashboard(monkeypatch):
    from cgc.plan_schema import plan_pb2 as pb

    got = _init_kwargs(monkeypatch, [pb.Plan()])
    got += _init_kwargs(monkeypatch, [pb.Plan()], dashboard=True)
    assert [kw["include_dashboard"] for kw in got] == [False, True]


def test_worker_startups_capped_at_the_cores(monkeypatch):
    from cgc.plan_schema import plan_pb2 as pb

    def plan(actors: int) -> pb.Plan:
        p = pb.Plan()
        for i in range(actors):
            p.graph.actors.add(name=f"a{i}")  # no num_cpus: 1 CPU each (Ray's default)
        return p

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.delenv("RAY_worker_maximum_startup_concurrency", raising=False)
    eight, two = _init_kwargs(monkeypatch, [plan(8), plan(2)])
    assert eight["num_cpus"] == 8
    assert eight["_system_config"] == {"worker_maximum_startup_concurrency": 2}
    assert "_system_config" not in two  # declared CPUs = cores: Ray's default already
    monkeypatch.setenv("RAY_worker_maximum_startup_concurrency", "5")
    (mine,) = _init_kwargs(monkeypatch, [plan(8)])
    assert "_system_config" not in mine  # the user's own setting stands
