"""cgc's builder API traced to pb.Graph: structure, names, values, hints, determinism."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import frontend_models as m
import pytest

import cgc
from cgc.frontend import InputNode, MultiOutputNode, ReduceOp, allgather, allreduce, trace
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.values import decode_value

Echo = cgc.actor(m.Echo)
Worker = cgc.actor(num_cpus=1)(m.Worker)


def _kinds(g: pb.Graph) -> list[str]:
    return [pb.NodeKind.Name(n.kind) for n in g.nodes]


def _names(g: pb.Graph) -> list[str]:
    return [n.name for n in g.nodes]


def _args(node: pb.Node) -> list:
    out = []
    for a in node.args:
        if a.HasField("ref"):
            out.append(("ref", a.ref.node, a.ref.output_index))
        else:
            out.append(("const", decode_value(a.constant)))
    return out


def test_echo():
    e = Echo.bind()
    with InputNode() as inp:
        dag = e.echo.bind(inp)
    g = trace(dag).graph
    assert _kinds(g) == ["INPUT", "CALL", "OUTPUT"]
    assert _names(g) == ["input", "echo.echo#0", "output"]
    assert [n.id for n in g.nodes] == [0, 1, 2]
    assert g.whole_input and g.num_positional == 0 and not g.keyword_fields
    assert [a.name for a in g.actors] == ["echo"]
    assert g.actors[0].cls.qualname == "Echo" and g.actors[0].cls.module == "frontend_models"
    assert _args(g.nodes[1]) == [("ref", 0, 0)]
    out = g.nodes[2]
    assert _args(out) == [("ref", 1, 0)] and not out.multi_output


def test_chain_with_constants_and_kwargs():
    ws = [Worker.bind(i, bias=0.5 * i) for i in range(3)]
    with InputNode() as inp:
        x = ws[0].fwd.bind(inp[0], scale=2.0)
        x = ws[1].add.bind(x, b=[1, {"k": (2, None)}])
        dag = ws[2].fwd.bind(x, 3)
    res = trace(dag)
    g = res.graph
    assert [a.name for a in g.actors] == ["worker0", "worker1", "worker2"]
    assert _names(g) == [
        "input",
        "input[0]",
        "worker0.fwd#0",
        "worker1.add#0",
        "worker2.fwd#0",
        "output",
    ]
    assert _args(g.nodes[2]) == [("ref", 1, 0)]
    assert [(k.name, decode_value(k.arg.constant)) for k in g.nodes[2].kwargs] == [("scale", 2.0)]
    assert [(k.name, decode_value(k.arg.constant)) for k in g.nodes[3].kwargs] == [
        ("b", [1, {"k": (2, None)}])
    ]
    assert _args(g.nodes[4]) == [("ref", 3, 0), ("const", 3)]
    a1 = g.actors[1]
    assert [decode_value(v) for v in a1.ctor_args] == [1]
    assert [(kw.name, decode_value(kw.value)) for kw in a1.ctor_kwargs] == [("bias", 0.5)]
    assert a1.options.num_cpus == 1.0 and not a1.options.HasField("num_gpus")
    assert g.num_positional == 1 and not g.whole_input
    assert res.classes == {f"worker{i}": m.Worker for i in range(3)}
    assert not res.needs_trust and res.live_handles == {}


def test_fan_out_fan_in_with_input_attributes():
    a, b, c = Worker.bind(), Worker.bind(), Worker.bind()
    with InputNode() as inp:
        assert inp["y"] is inp.y  # both are the keyword argument y
        left = a.fwd.bind(inp[1], scale=inp.y)
        right = b.fwd.bind(inp[0])
        dag = c.add.bind(left, right)
    g = trace(dag).graph
    assert _names(g)[:4] == ["input", "input[0]", "input[1]", "input.y"]
    attrs = g.nodes[1:4]
    assert [(pb.InputKeyKind.Name(n.key_kind), n.index, n.field) for n in attrs] == [
        ("INDEX", 0, ""),
        ("INDEX", 1, ""),
        ("FIELD", 0, "y"),
    ]
    assert g.num_positional == 2 and list(g.keyword_fields) == ["y"] and not g.whole_input
    assert _kinds(g) == [
        "INPUT",
        "INPUT_ATTR",
        "INPUT_ATTR",
        "INPUT_ATTR",
        "CALL",
        "CALL",
        "CALL",
        "OUTPUT",
    ]
    add = g.nodes[-2]
    assert add.name == "worker2.add#0"
    left_id, right_id = (r[1] for r in _args(add))
    assert g.nodes[left_id].name == "worker0.fwd#0" and g.nodes[right_id].name == "worker1.fwd#0"
    for n in g.nodes:  # topological: every ref points backwards
        for a in list(n.args) + [k.arg for k in n.kwargs]:
            if a.HasField("ref"):
                assert a.ref.node < n.id


def test_multi_return_unpack_index_and_options():
    s = cgc.actor(_Two).bind()
    w = Worker.bind()
    with InputNode() as inp:
        a, b = s.two.bind(inp)
        c = w.split3.options(num_returns=3).bind(a)
        dag = MultiOutputNode([b, c[2], w.add.bind(c[0], c[1])])
    g = trace(dag).graph
    two = g.nodes[1]
    assert two.name == "two.two#0" and two.num_returns == 2
    out = g.nodes[-1]
    assert out.multi_output
    split3 = next(n for n in g.nodes if n.method == "split3")
    assert split3.num_returns == 3
    assert _args(out)[:2] == [("ref", two.id, 1), ("ref", split3.id, 2)]
    add = next(n for n in g.nodes if n.method == "add")
    assert _args(add) == [("ref", split3.id, 0), ("ref", split3.id, 1)]
    assert [n.bind_index for n in g.nodes if n.actor == "worker"] == [0, 1]


class _Two:
    @cgc.method(num_returns=2)
    def two(self, x):
        return x, x


def test_single_return_cannot_be_unpacked():
    w = Worker.bind()
    with InputNode() as inp:
        node = w.fwd.bind(inp)
        with pytest.raises(TypeError, match="num_returns"):
            _a, _b = node


def test_collective_allreduce_and_allgather():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        g0, g1 = w0.grad.bind(inp), w1.grad.bind(inp)
        r0, r1 = allreduce.bind([g0, g1], op=ReduceOp.MAX)
        a0, a1 = allgather.bind([r0, r1])
        dag = MultiOutputNode([w0.add.bind(a0, 1), w1.add.bind(a1, 2)])
    g = trace(dag).graph
    assert len(g.collectives) == 2
    red, gat = g.collectives
    assert pb.CollectiveKind.Name(red.kind) == "ALLREDUCE" and red.reduce_op == pb.MAX
    assert pb.CollectiveKind.Name(gat.kind) == "ALLGATHER"
    members = [g.nodes[i] for i in red.nodes]
    assert [n.name for n in members] == ["worker0.allreduce#1", "worker1.allreduce#1"]
    assert all(n.kind == pb.COLLECTIVE and n.collective == 0 for n in members)
    assert [g.nodes[i].collective for i in gat.nodes] == [1, 1]
    assert _args(members[1]) == [
        ("ref", next(n.id for n in g.nodes if n.name == "worker1.grad#0"), 0)
    ]
    assert red.hint.transport == pb.NCCL
    assert red.loc.line > 0


def test_bucketed_allreduce_returns_per_member_lists():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        xs = [w.grad.bind(inp) for w in (w0, w1)]
        ys = [w.fwd.bind(inp) for w in (w0, w1)]
        (a0, b0), (a1, b1) = allreduce.bind([xs, ys])
        dag = MultiOutputNode([a0, b0, a1, b1])
    g = trace(dag).graph
    # One collective per bucket, each with one member per actor, in the actors' order.
    assert len(g.collectives) == 2
    members = [[g.nodes[n] for n in c.nodes] for c in g.collectives]
    assert [[m.actor for m in c] for c in members] == [["worker0", "worker1"]] * 2
    assert all(m.num_returns == 1 and len(m.args) == 1 for c in members for m in c)
    sources = {m.id: g.nodes[m.args[0].ref.node].name for c in members for m in c}
    assert [sources[a.ref.node] for a in g.nodes[-1].args] == [
        "worker0.grad#0", "worker0.fwd#1", "worker1.grad#0", "worker1.fwd#1"]


def test_tensor_hints():
    w0, w1 = Worker.bind(), Worker.bind()
    s = cgc.actor(_Two).bind()
    with InputNode() as inp:
        x = w0.fwd.bind(inp.with_tensor_transport(device="gpu"))
        hint_line = sys._getframe().f_lineno + 1
        x.with_tensor_transport("nccl", _static_shape=True)
        a, b = s.two.bind(x)
        b.with_tensor_transport("shm", device="cpu", direct_return=True)
        dag = MultiOutputNode([w1.add.bind(a, b)])
    g = trace(dag).graph
    fwd = g.nodes[1 if g.nodes[1].kind == pb.CALL else 2]
    (h,) = fwd.hints
    assert h.output_index == 0 and h.hint.transport == pb.NCCL and h.hint.static_shape
    assert h.hint.loc.line == hint_line
    two = next(n for n in g.nodes if n.method == "two")
    assert [
        (o.output_index, o.hint.transport, o.hint.device, o.hint.direct_return) for o in two.hints
    ] == [(1, pb.HOST, pb.CPU, True)]
    assert [(o.hint.transport, o.hint.device) for o in g.nodes[0].hints] == [(pb.AUTO, pb.GPU)]


def test_actor_options_and_names():
    A = cgc.actor(
        num_gpus=1, resources={"zz": 2, "aa": 1}, runtime_env={"b": 1, "a": [2]}, max_concurrency=2
    )(m.Worker)
    named = A.options(name="trainer", namespace="ns", num_gpus=0.5).bind()
    other = A.bind()
    with InputNode() as inp:
        dag = MultiOutputNode([named.fwd.bind(inp), other.fwd.bind(inp)])
    g = trace(dag).graph
    assert [a.name for a in g.actors] == ["trainer", "worker"]
    o = g.actors[0].options
    assert o.num_gpus == 0.5 and o.actor_name == "trainer" and o.namespace == "ns"
    assert [(r.name, r.amount) for r in o.resources] == [("aa", 1.0), ("zz", 2.0)]
    assert o.runtime_env_json == json.dumps({"a": [2], "b": 1}, separators=(",", ":"))
    assert o.max_concurrency == 2
    assert g.actors[1].options.num_gpus == 1.0


def test_decorated_class_stays_a_class():
    assert Worker.cls is m.Worker
    inst = Worker(3, bias=1.0)
    assert isinstance(inst, m.Worker) and inst.fwd(2) == 3.0
    with pytest.raises(TypeError, match="unknown actor option"):
        cgc.actor(num_cpu=1)(m.Worker)


def test_cgc_package_reexports():
    assert cgc.InputNode is InputNode and cgc.allreduce is allreduce


MODEL = textwrap.dedent("""
    import cgc
    from cgc import InputNode, MultiOutputNode

    @cgc.actor
    class Stage:
        def __init__(self, k):
            self.k = k

        def fwd(self, x):
            return x + self.k

    def build_dag():
        stages = [Stage.bind(i) for i in range(2)]
        with InputNode() as inp:
            x = stages[0].fwd.bind(inp[0])
            return MultiOutputNode([stages[1].fwd.bind(x)])
""")


def _load(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("cgc_test_model", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_model_file_source_is_embedded_and_paths_are_relative(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    mod = _load(path)
    g = trace(mod.build_dag(), model_file=path, model_module=mod).graph
    ref = g.actors[0].cls
    assert ref.module == "cgc_test_model" and ref.qualname == "Stage"
    assert [m.name for m in g.modules] == ["cgc_test_model"]  # once, for all its actors
    assert g.modules[0].source == MODEL and g.modules[0].source_file == "model.py"
    assert len(g.actors) > 1 and {a.cls.module for a in g.actors} == {"cgc_test_model"}
    assert g.nodes[-2].loc.file == "model.py" and g.nodes[-2].loc.function == "build_dag"
    assert (
        g.nodes[-2].loc.line
        == MODEL.splitlines().index("        return MultiOutputNode([stages[1].fwd.bind(x)])") + 1
    )


def test_trace_twice_is_byte_identical():
    def build():
        ws = [Worker.bind(i) for i in range(2)]
        with InputNode() as inp:
            a, b = cgc.actor(_Two).bind().two.bind(inp.x)
            r = allreduce.bind([ws[0].fwd.bind(a), ws[1].fwd.bind(b, scale=inp.s)])
            return MultiOutputNode(r)

    first = trace(build()).graph.SerializeToString(deterministic=True)
    second = trace(build()).graph.SerializeToString(deterministic=True)
    assert first == second


def test_two_fresh_processes_give_identical_bytes(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    script = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("model", {str(path)!r})
        mod = importlib.util.module_from_spec(spec); sys.modules["model"] = mod
        spec.loader.exec_module(mod)
        from cgc.frontend import trace
        g = trace(mod.build_dag(), model_file={str(path)!r}, model_module=mod).graph
        sys.stdout.buffer.write(g.SerializeToString(deterministic=True))
    """)
    outs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, check=True).stdout
        for _ in range(2)
    ]
    assert outs[0] == outs[1] and len(outs[0]) > 100


def test_actor_shared_by_two_graphs_numbers_each_graph_densely():
    w = Worker.bind()
    with InputNode() as inp1:
        first = w.fwd.bind(inp1)
    with InputNode() as inp2:
        second = w.add.bind(inp2, 1)
    assert [n.name for n in trace(first).graph.nodes] == ["input", "worker.fwd#0", "output"]
    assert [n.name for n in trace(second).graph.nodes] == ["input", "worker.add#0", "output"]
