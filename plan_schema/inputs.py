"""What one execution's arguments must look like: the rule ``execute()`` applies, and the
structure check applies to a plan's stored example inputs (so ``cgc run`` never starts a
plan whose examples it would refuse).

Example:
    >>> from cgc.plan_schema import plan_pb2 as pb
    >>> input_problems(pb.Graph(num_positional=2), 1, set())
    ['2 positional argument(s), got 1']
"""

from __future__ import annotations

from collections.abc import Collection

from cgc.plan_schema import plan_pb2 as pb

__all__ = ["input_problems", "positional_arity", "describe_inputs"]


def positional_arity(g: pb.Graph) -> int:
    """Positional arguments of the common call: 1 for a graph taking its bare input."""
    return 1 if g.whole_input and not g.num_positional and not g.keyword_fields \
        else g.num_positional


def describe_inputs(g: pb.Graph) -> str:
    """What one execution takes, in words (``inspect``'s ``inputs:`` line), by the rule
    ``input_problems`` applies.

    >>> describe_inputs(pb.Graph(whole_input=True))
    '1 positional argument (its tasks take it whole)'
    >>> describe_inputs(pb.Graph(num_positional=2, keyword_fields=["k"]))
    "2 positional argument(s), keywords ['k']"

    Raises:
        Nothing.
    """
    npos, whole = g.num_positional, g.whole_input
    keywords = f", keywords {list(g.keyword_fields)}" if g.keyword_fields else ""
    if whole and not npos and not keywords:
        return "1 positional argument (its tasks take it whole)"
    if whole:
        return (f"at least {npos} positional argument(s){keywords} (some tasks take all the "
                "arguments together, as Ray's InputNode)")
    return f"{npos} positional argument(s){keywords}"


def input_problems(g: pb.Graph, n_args: int, keywords: Collection[str]) -> list[str]:
    """What is wrong with calling the graph with ``n_args`` positional arguments and these
    keyword names (empty: nothing).

    A graph whose tasks take the whole input (``whole_input``) and no attribute of it stands
    for exactly one argument (Ray's rule); one that also takes attributes needs at least
    ``num_positional`` positional arguments and every keyword field, and takes more.
    """
    problems = []
    npos, kwset = g.num_positional, set(g.keyword_fields)
    whole = g.whole_input
    if whole and not npos and not kwset:
        if n_args != 1 or keywords:
            problems.append(f"exactly 1 positional argument, got {n_args}"
                            + (f" and keywords {', '.join(sorted(keywords))}" if keywords
                               else ""))
    elif whole:
        if n_args < npos:
            problems.append(f"at least {npos} positional argument(s), got {n_args}")
    elif n_args != npos:
        problems.append(f"{npos} positional argument(s), got {n_args}")
    missing = sorted(kwset - set(keywords))
    extra = sorted(set(keywords) - kwset)
    if missing:
        problems.append(f"keyword argument(s) {', '.join(missing)} (missing)")
    if extra and not (whole and (npos or kwset)):
        problems.append(f"no keyword argument(s) {', '.join(extra)}")
    return problems
