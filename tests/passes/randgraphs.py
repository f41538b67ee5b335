"""Hypothesis strategy for random graphs: 2-8 actors, up to ~60 tasks, NCCL edges, collectives."""

from __future__ import annotations

from builders import GraphBuilder
from hypothesis import strategies as st

from cgc.plan_schema import plan_pb2 as pb


@st.composite
def random_plans(draw, max_tasks: int = 60, max_actors: int = 8) -> pb.Plan:
    n_actors = draw(st.integers(2, max_actors))
    gpu = [draw(st.booleans()) or i < 2 for i in range(n_actors)]
    names = [f"a{i}" for i in range(n_actors)]
    n_inputs = draw(st.integers(1, 3))
    n_tasks = draw(st.integers(1, max_tasks))
    # abstract graph first: (actor, [sources]) with sources "i<k>" inputs or task indices
    tasks: list[tuple[int, list]] = []
    colls: dict[int, list[int]] = {}  # task index -> members (first task of the collective)
    t = 0
    while t < n_tasks:
        gpus = [i for i in range(n_actors) if gpu[i]]
        if len(gpus) >= 2 and t and draw(st.integers(0, 9)) == 0:
            members = draw(
                st.lists(st.sampled_from(gpus), min_size=2, max_size=len(gpus), unique=True)
            )
            start = len(tasks)
            for m in members:
                mine = [k for k, (a, _) in enumerate(tasks) if a == m]
                src = mine[-1] if mine else f"i{draw(st.integers(0, n_inputs - 1))}"
                tasks.append((m, [src]))
            colls[start] = members
            t += len(members)
            continue
        actor = draw(st.integers(0, n_actors - 1))
        k = draw(st.integers(1, 3))
        srcs = [
            draw(st.integers(0, len(tasks) - 1))
            if tasks and draw(st.booleans())
            else f"i{draw(st.integers(0, n_inputs - 1))}"
            for _ in range(k)
        ]
        tasks.append((actor, sorted(set(srcs), key=str)))
        t += 1
    consumers: dict[int, set[int]] = {}
    for j, (_, srcs) in enumerate(tasks):
        for s in srcs:
            if isinstance(s, int):
                consumers.setdefault(s, set()).add(j)
    leaves = [j for j in range(len(tasks)) if j not in consumers]
    nccl_ok = {
        j
        for j in consumers
        if gpu[tasks[j][0]] and all(gpu[tasks[c][0]] for c in consumers[j]) and draw(st.booleans())
    }
    b = GraphBuilder()
    for i, n in enumerate(names):
        b.actor(n, gpus=1 if gpu[i] else 0)
    inputs = [b.input(i) for i in range(n_inputs)]
    ids: dict[int, int] = {}
    j = 0
    while j < len(tasks):
        if j in colls:
            members = colls[j]
            refs = [
                ids[s] if isinstance(s, int) else inputs[int(s[1:])]
                for _, (s,) in tasks[j : j + len(members)]
            ]
            for k, nid in enumerate(b.allreduce(refs, [names[m] for m in members])):
                ids[j + k] = nid
            j += len(members)
            continue
        actor, srcs = tasks[j]
        args = [ids[s] if isinstance(s, int) else inputs[int(s[1:])] for s in srcs]
        ids[j] = b.call(names[actor], "f", *args, hint=pb.NCCL if j in nccl_ok else None)
        j += 1
    b.output(*[ids[j] for j in leaves])
    return b.plan("random")
