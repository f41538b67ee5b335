"""Run a graph across two Ray nodes (a head and a second raylet on this machine, made with
Ray's own test cluster) and print what came back as JSON. Started by test_rt_multinode.py
in its own process, so it cannot disturb the test session's cluster."""

from __future__ import annotations

import json
import sys

import numpy as np
import ray
from ray.cluster_utils import Cluster

import cgc
from cgc import InputNode, MultiOutputNode


@cgc.actor(num_cpus=1, resources={"head": 1})
class Near:
    def f(self, x):
        return x + 1

    def node(self, _):
        return ray.get_runtime_context().get_node_id()


@cgc.actor(num_cpus=1, resources={"far": 1})
class Far:
    def g(self, x):
        return x * 2

    def node(self, _):
        return ray.get_runtime_context().get_node_id()

    def big(self, x):
        return np.full(1 << 18, x, np.float32)


def main() -> int:
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head": 2}}
    )
    cluster.add_node(num_cpus=2, resources={"far": 2})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    near, far = Near.bind(), Far.bind()
    with InputNode() as inp:
        y = far.g.bind(near.f.bind(inp))
        dag = MultiOutputNode([y, near.node.bind(inp), far.node.bind(y), far.big.bind(y)])
    result: dict = {}
    with cgc.compile(dag).start(address=cluster.address) as graph:
        runs = []
        for x in range(20):  # many executions: in order, none lost
            out = [r.get(timeout=30) for r in graph.execute(x)]
            runs.append([out[0], float(out[3][0]), int(out[3].size)])
        result["runs"] = runs
        result["nodes"] = [out[1], out[2]]
        result["bindings"] = sorted(set(graph.channel_bindings.values()))
    ray.shutdown()
    cluster.shutdown()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
