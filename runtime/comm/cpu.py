"""CPU communicator: NCCL's blocking semantics over shared-memory rings, for CPU-only runs.

Names (all under the group ``prefix``, which the caller makes unguessable - see
``endpoints.communicator_prefix``; no set-up round trips: rank r creates the rings it
writes and attaches to its peers' rings by name on first use, and the rings refuse any
name they did not create - see ``shm``):

- ``<prefix>p<i>-<j>``: 1-slot data ring, rank i → rank j (created by i). ``send`` returns
  only after rank j's ``recv`` took the value, which is NCCL's rendezvous (the blocking
  semantics the verifier proves plans against: a schedule that would deadlock on NCCL
  blocks here too). The acknowledgement is j's read cursor on that ring, stored after the
  value is decoded (``ShmRingWriter.wait_taken``): no message travels back, so a hop costs
  one ring write and one read, and at most one wake-up each way;
- ``<prefix>c<r>``: rank r's collective ring, read by all other ranks. Each rank writes its
  contribution once and reduces all contributions locally in rank order, so every rank
  gets a bit-identical result. A tag (op, call number) catches mismatched call orders.

Example (two ranks in two threads):
    >>> import threading, numpy as np
    >>> from cgc.runtime.comm.cpu import CpuCommunicator
    >>> out = {}
    >>> def run(r):
    ...     c = CpuCommunicator("cgc-doc-comm-", r, 2)
    ...     out[r] = c.allreduce(np.array([r + 1.0]))
    ...     c.destroy()
    >>> ts = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    >>> _ = [t.start() for t in ts]; _ = [t.join() for t in ts]
    >>> out[0].tolist(), out[1].tolist()
    ([3.0], [3.0])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cgc.runtime.channels.errors import ChannelError, ErrorValue
from cgc.runtime.channels.ring_reader import ShmRingReader
from cgc.runtime.channels.ring_writer import ShmRingWriter
from cgc.runtime.comm.interface import ExchangingCommunicator, first_error
from cgc.runtime.comm.ring_mesh import RingMesh

__all__ = ["CpuCommunicator"]


class CpuCommunicator(ExchangingCommunicator):
    """Rank ``rank`` of a ``world_size`` group whose segment names start with ``prefix``."""

    def __init__(self, prefix: str, rank: int, world_size: int, slot_bytes: int = 1 << 16,
                 attach_timeout: float = 60.0, spin_us: float = 0.0) -> None:
        self._mesh = RingMesh(prefix, "p", rank, world_size, slots=1, slot_bytes=slot_bytes,
                              spin_us=spin_us, attach_timeout=attach_timeout)
        self.prefix = prefix
        self.rank = rank
        self.world_size = world_size
        self._attach_timeout = attach_timeout
        self._spin = spin_us
        self._peers = self._mesh.peers
        self._data_out = self._mesh.out  # peer -> our data ring to it
        self._coll_out = (ShmRingWriter.create(f"{prefix}c{rank}", 1, slot_bytes,
                                               world_size - 1, spin_us)
                          if world_size > 1 else None)
        self._data_in = self._mesh.inbound  # peer -> its data ring to us
        self._coll_in: dict[int, ShmRingReader] = {}  # peer -> its collective ring
        self._attached: set[int] = set()
        self._ncoll = 0

    def _attach_peer(self, p: int) -> None:
        # Why all of p's rings, before our first write to p: p can only finish an op with
        # us after reading what we write, so p's destroy() never unlinks a ring we have yet
        # to map (and destroy's linger covers values p wrote that we have yet to read).
        r = self.rank
        self._mesh.attach(p)
        self._coll_in[p] = ShmRingReader.attach(f"{self.prefix}c{p}", r if r < p else r - 1,
                                                self._spin, self._attach_timeout)
        self._attached.add(p)

    def _coll_reader(self, peer: int) -> ShmRingReader:
        r = self._coll_in.get(peer)
        if r is None:
            self._attach_peer(peer)
            r = self._coll_in[peer]
        return r

    def send(self, value: Any, peer: int, timeout: float | None = None, *,
             shape: Any = None, dtype: Any = None) -> None:
        """Rendezvous send: returns after rank ``peer``'s ``recv`` took the value.

        Raises:
            ChannelTimeoutError, ChannelClosedError (PeerDiedError: the peer's process
            died while this call waited), ValueError (bad peer).
        """
        if peer not in self._attached:
            self._mesh.check_peer(peer)
            self._attach_peer(peer)  # before writing: see _attach_peer
        w = self._data_out[peer]
        w.write(value, timeout)
        w.wait_taken(timeout)  # each of the two waits gets ``timeout``, as before

    def recv(self, peer: int, shape: Any = None, dtype: Any = None,
             timeout: float | None = None) -> Any:
        """Take the next value from ``peer`` and release its blocked ``send`` (a value that
        cannot be decoded here comes back as an ``ErrorValue`` with ``cause == "decode"``).

        Raises:
            ChannelTimeoutError, ChannelClosedError (PeerDiedError: the peer's process
            died while this call waited), ValueError (bad peer).
        """
        r = self._data_in.get(peer)
        if r is None:
            self._mesh.check_peer(peer)
            self._attach_peer(peer)
            r = self._data_in[peer]
        return r.read(timeout)  # its cursor store releases the peer's send

    def _exchange(self, tag: str, value: Any, timeout: float | None) -> list[Any]:
        self._ncoll += 1
        key = (tag, self._ncoll)
        if self._coll_out is None:
            return [value]
        for p in self._peers:
            if p not in self._attached:
                self._attach_peer(p)  # before writing: see _attach_peer
        self._coll_out.write((key, value), timeout)
        out = []
        for p in range(self.world_size):
            if p == self.rank:
                out.append(value)
                continue
            got = self._coll_reader(p).read(timeout)
            if type(got) is ErrorValue:  # rank p's contribution could not be decoded here
                raise ChannelError(f"rank {self.rank}: {got.message}")
            got_key, v = got
            if got_key != key:
                raise ChannelError(f"rank {self.rank}: collective mismatch: this rank runs "
                                   f"{key}, rank {p} runs {got_key}")
            out.append(v)
        return out

    def _exchanged(self, tag: str, value: Any, timeout: float | None,
                   finish: Callable[[list[Any]], Any]) -> Any:
        parts = self._exchange(tag, value, timeout)
        err = first_error(parts)
        return err if err is not None else finish(parts)

    def warm_up(self, peers: Sequence[int], timeout: float | None = 60.0,
                collective: bool = False) -> None:
        """Nothing to do: rings are mapped at the first op with a peer, and the executor's
        warm-up runs the execution-0 sends and receives of CPU communicators itself."""

    def abort(self) -> None:
        """End waits on this rank's rings: ``destroy()`` (closing a ring wakes everyone
        blocked on it, here and in the peers). Idempotent."""
        self.destroy()

    def destroy(self, linger: float = 2.0) -> None:
        """Close every ring this rank owns and the data rings it receives on: a peer
        blocked on one of them (in ``recv`` from us, or in ``send`` to us waiting for a
        ``recv`` that will never come) raises ChannelClosedError; a peer whose value we
        took before closing still returns normally.

        Waits up to ``linger`` s for peers to take values still in flight (e.g. this rank's
        part of the last collective), so finishing first never breaks a slower peer.
        """
        self._mesh.close_out(linger, quiet=False)
        if self._coll_out is not None:
            self._coll_out.close(linger=linger)
        self._mesh.let_go(close=True, quiet=False)  # its cursor is the peer's acknowledgement
        for r in self._coll_in.values():
            r.detach()
        self._coll_in.clear()
