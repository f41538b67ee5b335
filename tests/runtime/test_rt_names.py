"""Actors under their own names: Ray shows the user's class and the plan's actor name.

What Ray shows of an actor (state API ``class_name``, process title ``ray::<Class>``, the
prefix ``(<Class> pid=...)`` of the lines it prints) is checked on a fresh Ray with its
dashboard, in a child process (``names_script.py``): the state API needs the dashboard,
which the shared test cluster runs without.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import rt_graphs as G

import cgc
from cgc import InputNode
from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.actor.host import ActorHost, host_class
from cgc.runtime.driver.plan_actors import ray_actor_name

ROOT = Path(__file__).resolve().parents[2]
_DASHBOARD_DEPS = ("aiohttp", "aiohttp_cors", "opencensus", "prometheus_client", "colorful")


def _graph_ids(names: list[str], plan_name: str) -> set[str]:
    return {n.rsplit("@", 1)[1] for n in names if n.startswith(plan_name + ".")}


@pytest.mark.slow
@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in _DASHBOARD_DEPS),
    reason="the state API needs Ray's dashboard: pip install -e '.[test]' (ray[default])",
)
def test_state_api_shows_user_classes_of_a_model_file_plan(tmp_path):
    path = tmp_path / "chain.cgplan"
    cgc.compile_file(ROOT / "examples" / "chain.py").save(path)  # classes embedded in the plan
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a Ray of its own
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("names_script.py")), str(path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(r["class_name"] for r in rows) == ["Adder", "Adder", "Rounder"]
    names = [r["name"] for r in rows]
    assert [n.split("@")[0] for n in names] == ["chain.adder0", "chain.adder1", "chain.rounder"]
    assert len(_graph_ids(names, "chain")) == 1
    for r in rows:
        assert r["title"].startswith(f"ray::{r['class_name']}"), r
        assert r["log_prefix"] == f"({r['class_name']} pid={r['pid']})", r
        assert "ActorHost" not in json.dumps(r)


def test_two_graphs_of_one_plan_never_clash(ray_cluster):
    plan = G.chain_plan(2)
    before = set(ray.util.list_named_actors())
    with plan.start(get_timeout=30) as g1, plan.start(get_timeout=30) as g2:
        assert g1.execute(1).get() == 4 and g2.execute(2).get() == 5
        names = sorted(set(ray.util.list_named_actors()) - before)
    assert [n.split("@")[0] for n in names] == ["t_chain.worker0"] * 2 + ["t_chain.worker1"] * 2
    assert len(_graph_ids(names, "t_chain")) == 2
    assert not set(ray.util.list_named_actors()) - before  # gone with the graphs


def test_a_name_the_user_gave_is_kept(ray_cluster):
    mine = G.Worker.options(name="cgc-test-names-mine").bind(1)
    with InputNode() as inp:
        dag = mine.add.bind(inp)
    with cgc.compile(dag, name="t_names").start(get_timeout=30) as g:
        assert g.execute(1).get() == 2
        named = set(ray.util.list_named_actors())
    assert "cgc-test-names-mine" in named and not any(n.startswith("t_names.") for n in named)


def test_existing_actors_are_never_renamed(ray_cluster):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(G)
    try:
        cls = ray.remote(G.Worker.__wrapped__)
        a, b = cls.options(name="cgc-test-names-ext").remote(1), cls.remote(2)
    finally:
        cloudpickle.unregister_pickle_by_value(G)
    try:
        with G.two_actor_plan((a, b)).start(get_timeout=30) as g:
            assert g.execute(0.1).get() == 0.2 and not g.created
            named = set(ray.util.list_named_actors())
        assert "cgc-test-names-ext" in named and not any(n.startswith("t_pair.") for n in named)
    finally:
        ray.kill(a)
        ray.kill(b)


def test_host_class_is_named_like_the_users_class():
    cls = host_class("Outer.Stage")
    assert (cls.__name__, cls.__qualname__) == ("Stage", "Outer.Stage")
    assert issubclass(cls, ActorHost) and host_class("Outer.Stage") is cls
    assert ray_actor_name("pipe", "stage0", "ab12") == "pipe.stage0@ab12"
    assert ray_actor_name("", "w", "ab12") == "cgc.w@ab12"


def test_host_repr_is_the_users_repr_or_class_name():
    def host_of(qualname: str) -> ActorHost:
        actor = pb.Actor(name="a", cls=pb.ClassRef(module="rt_graphs", qualname=qualname))
        return host_class(qualname)(actor.SerializeToString())

    assert repr(host_of("Worker")) == "Worker"  # Ray's log prefix: (Worker pid=...)
    assert repr(host_of("AppError")) == "AppError()"  # a class with its own __repr__
