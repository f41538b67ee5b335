"""Pass ``weight_sync``: the transfer plan of every declared weight sync
(``Lowered.transfers``, one per ``Graph.weight_syncs``, same order).

The plan of a sync is data the runtime replays: its buckets (members, byte offsets and
sizes, in send order; ``cgc.plan_schema.weight_sync.bucket_layout`` packs the parameters
whole and in order), its total bytes, and the SHA-256 of its canonical parameter list that
both ends check against their live modules at start. The buckets travel as the outputs of
the source's ``cgc.sync.send`` node, so the channel, schedule and verify passes treat them
as ordinary edges.

Example: a sync of ``[("w", (2, 3), "float32"), ("b", (3,), "float32")]`` with
``bucket_bytes=16`` gets ``transfers[0].buckets`` of 24 and 12 bytes.
"""

from __future__ import annotations

from cgc.passes.state import LowerState, require
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.verify.weight_sync import check_weight_syncs
from cgc.plan_schema.weight_sync import bucket_layout, param_digest

__all__ = ["assign_transfers", "pre", "post"]

_NAME = "weight_sync"


def _specs(sync: pb.WeightSync) -> list[tuple[str, tuple[int, ...], str]]:
    """The sync's parameter list as (name, shape, dtype)."""
    return [(p.name, tuple(p.shape), p.dtype) for p in sync.params]


def assign_transfers(state: LowerState) -> None:
    """Write ``Lowered.transfers`` from ``Graph.weight_syncs``.

    Example: ``[b.nbytes for b in plan.lowered.transfers[0].buckets] == [24, 12]`` in the
    module's example.
    """
    for sync in state.plan.graph.weight_syncs:
        params = _specs(sync)
        tp = state.lowered.transfers.add(sync=sync.id, digest=param_digest(params))
        for i, members in enumerate(bucket_layout(params, sync.bucket_bytes)):
            b = tp.buckets.add(index=i, nbytes=sum(m.nbytes for m in members))
            for m in members:
                b.members.add(param=m.param, offset=m.offset, nbytes=m.nbytes)
        tp.total_bytes = sum(b.nbytes for b in tp.buckets)


def pre(state: LowerState) -> None:
    require(not state.lowered.transfers, _NAME, "transfers already assigned")
    nodes = state.plan.graph.nodes
    for sync in state.plan.graph.weight_syncs:
        require(sync.send_node < len(nodes), _NAME, f"sync {sync.name}: no send node")
        n = len(bucket_layout(_specs(sync), sync.bucket_bytes))
        require(nodes[sync.send_node].num_returns == n, _NAME,
                f"sync {sync.name}: the send node has {nodes[sync.send_node].num_returns} "
                f"outputs for {n} buckets")


def post(state: LowerState) -> None:
    require(len(state.lowered.transfers) == len(state.plan.graph.weight_syncs), _NAME,
            "one transfer plan per weight sync")
    try:
        check_weight_syncs(state.plan)
    except Exception as exc:  # noqa: BLE001 - a broken postcondition is the pass's bug
        require(False, _NAME, str(exc))
