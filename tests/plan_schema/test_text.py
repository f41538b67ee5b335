"""Op and program text forms parse back; the plan dump has every section."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op, format_program, parse_op, parse_program

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
        ("3SEND:c5→b#0", pb.Op(kind=pb.SEND, task=3, channel=5, peer="b")),
        ("3SEND:c5->b#0", pb.Op(kind=pb.SEND, task=3, channel=5, peer="b")),
        (
            "7RECV:c5←a#2+1~",
            pb.Op(
                kind=pb.RECV,
                task=7,
                channel=5,
                peer="a",
                seq=2,
                exec_offset=1,
                stream=pb.COMM_STREAM,
            ),
        ),
        ("9COLL#2", pb.Op(kind=pb.COLL, task=9, seq=2)),
    ],
)
def test_documented_examples(tok, op):
    assert parse_op(tok) == op


@pytest.mark.parametrize("bad", ["", "C3", "3X", "3C:c", "3SEND:c1=>b", "3C junk"])
def test_bad_tokens_are_refused(bad):
    with pytest.raises(ValueError, match="not an op token"):
        parse_op(bad)


def test_program_line_shape():
    prog = pb.Program(
        actor="w1",
        prologue=[pb.Op(kind=pb.RECV, task=2, channel=3, peer="w0")],
        ops=[pb.Op(kind=pb.COMPUTE, task=2)],
    )
    assert format_program(prog) == "w1: [2RECV:c3←w0#0] 2C"
    with pytest.raises(ValueError):
        parse_program("no colon here")
