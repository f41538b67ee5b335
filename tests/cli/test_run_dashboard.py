"""`cgc run --dashboard` asks the local Ray for Ray's dashboard; without it, none starts.

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

    from cgc.plan_schema import plan_pb2 as pb

    class _Plan:
        name = "stub"
        proto = pb.Plan()  # no programs: nothing captured, no CUDA graph stats asked

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


def test_ensure_ray_passes_include_dashboard(monkeypatch):
    import ray

    from cgc.plan_schema import plan_pb2 as pb
    from cgc.runtime.driver import cluster

    got: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: got.append(kw))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "get_runtime_context",
                        lambda: types.SimpleNamespace(get_node_id=lambda: "n"))
    monkeypatch.setattr(cluster, "_OWN", {})
    for dash in (False, True):
        cluster.ensure_ray(pb.Plan(), None, dashboard=dash)
    assert [kw["include_dashboard"] for kw in got] == [False, True]
