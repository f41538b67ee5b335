"""Pass ``extract``: the input attributes an actor takes out of the whole input, on its READ."""

from __future__ import annotations

import pytest
import shapes
from stages import programs_text, run_pass, state_before

from cgc.passes import PassInvariantError
from cgc.plan_schema import plan_pb2 as pb


def test_whole_input_read_lists_the_attributes_taken_out_of_it():
    state = run_pass(state_before(shapes.whole_input(), "extract"), "extract")
    assert programs_text(state.plan) == (
        "a: 3R:c1{1} 3C 4C 4W:c3\n"  # a reads the whole input and takes inp[0] (%1) out
        "b: 5R:c2 5C 5W:c4"  # b reads inp[1] on its own channel
    )


@pytest.mark.parametrize("name", ["chain", "1f1b_2x4", "allreduce"])
def test_graphs_without_the_whole_input_extract_nothing(name):
    state = run_pass(state_before(shapes.ALL[name](), "extract"), "extract")
    assert not any(op.extract for p in state.lowered.programs for op in p.ops)


def test_postcondition_catches_a_wrong_extract():
    state = run_pass(state_before(shapes.whole_input(), "extract"), "extract")
    read = state.lowered.programs[0].ops[0]
    assert read.kind == pb.READ
    read.extract.append(2)  # inp[1] is not a's to take
    from cgc.passes import extract

    with pytest.raises(PassInvariantError, match="extract"):
        extract.post(state)
