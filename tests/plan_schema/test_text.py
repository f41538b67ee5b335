"""Op and program text forms parse back; the plan dump refuses unknown enum values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cgc.plan_schema import PlanFormatError
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import (
    format_op,
    format_plan_text,
    format_program,
    parse_op,
    parse_program,
)

_KINDS = [pb.READ, pb.COMPUTE, pb.WRITE, pb.SEND, pb.RECV, pb.COLL]
_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True) | st.just("@driver")

ops = st.builds(
    pb.Op,
    kind=st.sampled_from(_KINDS),
    task=st.integers(0, 10_000),
    channel=st.integers(0, 500),
    output_index=st.integers(0, 5),
    peer=st.just("") | _names,
    stream=st.sampled_from([pb.COMPUTE_STREAM, pb.COMM_STREAM]),
    exec_offset=st.integers(0, 2),
    seq=st.integers(0, 1000),
    communicator=st.integers(0, 50),
    extract=st.lists(st.integers(0, 10_000), max_size=4),
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_op_tokens_parse_back(op):
    tok = format_op(op)
    assert " " not in tok
    assert parse_op(tok) == op


@settings(max_examples=50, deadline=None)
@given(
    _names.filter(lambda n: n != "@driver"), st.lists(ops, max_size=5), st.lists(ops, max_size=8)
)
def test_programs_parse_back(actor, prologue, loop):
    prog = pb.Program(actor=actor, prologue=prologue, ops=loop)
    assert parse_program(format_program(prog)) == prog


@pytest.mark.parametrize(
    ("tok", "op"),
    [
        ("3C", pb.Op(kind=pb.COMPUTE, task=3)),
        ("3R:c1", pb.Op(kind=pb.READ, task=3, channel=1)),
        ("3W.1:c4", pb.Op(kind=pb.WRITE, task=3, output_index=1, channel=4)),
        ("3R:c1{1,2}", pb.Op(kind=pb.READ, task=3, channel=1, extract=[1, 2])),
        ("3SEND:c5→b@g0#0", pb.Op(kind=pb.SEND, task=3, channel=5, peer="b")),
        ("3SEND:c5->b@g0#0", pb.Op(kind=pb.SEND, task=3, channel=5, peer="b")),
        (
            "7RECV:c5←a@g0#0~",
            pb.Op(kind=pb.RECV, task=7, channel=5, peer="a", stream=pb.COMM_STREAM),
        ),
        (
            "7RECV:c5←a@g2#3+1~",
            pb.Op(
                kind=pb.RECV,
                task=7,
                channel=5,
                peer="a",
                communicator=2,
                seq=3,
                exec_offset=1,
                stream=pb.COMM_STREAM,
            ),
        ),
        ("9COLL@g1#2", pb.Op(kind=pb.COLL, task=9, seq=2, communicator=1)),
    ],
)
def test_documented_examples(tok, op):
    assert parse_op(tok) == op
    assert format_op(op) == tok.replace("->", "→")


def test_extract_keeps_its_order():
    op = pb.Op(kind=pb.READ, task=3, channel=1, extract=[7, 2])
    assert format_op(op) == "3R:c1{7,2}" and parse_op("3R:c1{7,2}") == op


@pytest.mark.parametrize(
    "bad", ["", "C3", "3X", "3C:c", "3SEND:c1=>b", "3C junk", "3R:c1{}", "3R:c1{1,}", "3COLL@g#1"]
)
def test_bad_tokens_are_refused(bad):
    with pytest.raises(ValueError, match="not an op token"):
        parse_op(bad)


def test_program_line_shape():
    prog = pb.Program(
        actor="w1",
        prologue=[pb.Op(kind=pb.RECV, task=2, channel=3, peer="w0")],
        ops=[pb.Op(kind=pb.COMPUTE, task=2)],
    )
    assert format_program(prog) == "w1: [2RECV:c3←w0@g0#0] 2C"
    with pytest.raises(ValueError):
        parse_program("no colon here")


def test_unknown_op_kind_is_a_plan_format_error_naming_the_actor():
    prog = pb.Program(actor="w1", ops=[pb.Op(kind=9, task=2)])
    with pytest.raises(PlanFormatError, match="actor 'w1'.*kind 9"):
        format_program(prog)
    with pytest.raises(PlanFormatError, match="kind 9"):
        format_op(prog.ops[0])


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: setattr(p.graph.nodes[0], "kind", 17), "node %0 kind"),
        (lambda p: setattr(p.lowered.channels[0], "kind", 9), "channel c1 kind"),
        (lambda p: setattr(p.lowered.channels[0], "device", 7), "channel c1 device"),
        (lambda p: setattr(p.config, "at_capacity", 5), "ExecConfig.at_capacity"),
        (lambda p: p.graph.collectives.add(id=0, kind=8), "collective 0 kind"),
        (lambda p: p.graph.nodes[1].hints.add().hint.__setattr__("transport", 9), "hint"),
    ],
)
def test_plan_dump_names_an_unknown_enum_value(mutate, field):
    plan = pb.Plan(name="p")
    plan.graph.nodes.add(id=0, kind=pb.INPUT)
    plan.graph.nodes.add(id=1, kind=pb.CALL, actor="a", method="f", name="a.f#0")
    plan.lowered.channels.add(id=1, kind=pb.CHAN_HOST, writer="@driver", readers=["a"])
    format_plan_text(plan)  # well-formed enough to print
    mutate(plan)
    with pytest.raises(PlanFormatError, match=field):
        format_plan_text(plan)


def test_plan_dump_never_unpickles():
    plan = pb.Plan(name="p")
    node = plan.graph.nodes.add(id=0, kind=pb.CALL, actor="a", method="f", name="a.f#0")
    # nested in a list, where decoding the value would unpickle it
    node.args.add().constant.list_value.items.add(pickled=b"\x80\x04cbuiltins\nexit\n.")
    assert "[<pickled, " in format_plan_text(plan)
