"""cgc host channels: shared-memory rings and TCP, one writer to N readers.

Design of the ring: see the ``ring_layout`` (format, memory ordering), ``ring_endpoint``
(waiting), ``ring_writer`` (payload, forwarding), ``ring_reader`` (positions, borrowing)
and ``pool`` module docstrings.

Same node (one writer, N readers, one write serves all)::

    from cgc.runtime.channels import ShmRingWriter, ShmRingReader, ErrorValue
    w = ShmRingWriter.create("g1234-c7", slots=4, slot_bytes=1 << 20, num_readers=2)
    r = ShmRingReader.attach("g1234-c7", reader_index=0)   # waits for the writer's segment
    w.write(value, timeout=10.0)       # blocks while the slowest reader is `slots` behind
    v = r.read(timeout=10.0)           # blocks (futex sleep, ~0% CPU) until written
    if isinstance(v, ErrorValue): ...  # an upstream failure travels as a value
    r.detach(); w.close()              # close() on either end wakes everyone with
                                       # ChannelClosedError; writer.close() unlinks
    ShmRingWriter.poison_by_name("g1234-c7")   # from any process, e.g. a death monitor
    cleanup_segments("g1234-")         # teardown: unlink whatever a crashed peer left

Signatures:

- ``ShmRingWriter.create(name, slots=4, slot_bytes=1<<20, num_readers=1, spin_us=0.0,
  zero_copy_min=65536, max_data_bytes=None, keep_free_bytes=64<<20)``;
  ``.write(value, timeout=None)``; ``.position``; ``.poison()``; ``.close(linger=0)``;
  ``.closed``; ``ShmRingWriter.poison_by_name(name) -> bool``.
- ``ShmRingReader.attach(name, reader_index, spin_us=0.0, timeout=10.0)``;
  ``.read(timeout=None)``; ``.read_at(position, timeout=None)``; ``.position``;
  ``.last_nbytes``; ``.poison()``; ``.close()`` (closes for all); ``.detach()``.
- ``timeout=None`` waits forever, ``0`` tries once. Timeouts raise ``ChannelTimeoutError``
  (a ``CgcError`` and a ``TimeoutError``); closed/poisoned raise ``ChannelClosedError``;
  a peer process that died while we waited raises ``PeerDiedError`` (a
  ``ChannelClosedError``) within about a second. Readers drain values already written
  before they see the close.
- Positions: ``reader.position`` counts values consumed. A value that cannot be decoded
  comes back as an ``ErrorValue`` for its position (``cause == "decode"``); ``read_at(p)``
  returns value ``p`` or an error value for ``p`` (``cause == "lost"`` when an interrupted
  read consumed it) - never another position's value. Slots and frames carry their sequence
  number; a mismatch is ``ChannelSequenceError``.
- Values: anything picklable. numpy arrays / CPU torch tensors with >= ``zero_copy_min``
  bytes are read zero-copy (numpy read-only); holding them never blocks the writer; data
  blocks beyond a small reusable pool are freed when the last reader drops them. Such a
  value written on unchanged (alone, sliced, in a container) travels as a reference to the
  block it views, not as a second copy (``forward``).
- Wake-ahead: ``reader.set_bell(Bells, depth)`` makes a sleeping read also wake (and spin
  up to 1 ms) when that doorbell rings (``bell``; needs ``futex_waitv``).
- One thread per endpoint. Names: unique and unguessable per channel (``endpoints`` builds
  them from a random graph prefix); data blocks are ``<name>.d<k>``. Segments live in
  ``segment_dir()`` (``/dev/shm/cgc-<uid>``, or ``cgc-<uid>.N`` when another user took
  that name first; mode 0700, owner-checked; see ``shm``).
  ``sweep_dead_segments()`` removes segments whose creator process is gone.
- The ring runs on x86_64 only (``ring_supported()``; why: ``ring_layout`` docstring); elsewhere
  it raises ``UnsupportedPlatformError``: use TCP channels there.
- ``spin_us``: 0 (default) sleeps at once. Measured on the 2-core VM, int ping-pong round
  trip: 0 → ~65 µs with an idle peer core (the VM's idle-vCPU wake-up; a raw futex
  ping-pong is the same), ~18 µs when the peer core is busy; 20 → ~7 µs idle but p99 of
  ms under CPU contention. Pinning both ends to one core gives ~17 µs. Pick per deployment.

Across nodes (same API; the writer listens on the node's IP, each reader connects and both
prove they hold the graph's secret, once, at set-up)::

    w = TcpWriter.listen(node_ip, 0, num_readers=1, secret=key, channel=name)  # publish w.port
    r = TcpReader.connect(node_ip, port, reader_index=0, secret=key, channel=name)
    w.accept(timeout=30.0)          # optional: write() accepts lazily; closes the listener
    w.write(value); r.read(timeout=None); r.close(); w.close()   # w.poison() also exists

``ChannelAuthError``: a peer failed the proof. ``FrameTooLargeError``: a frame over
``max_frame_bytes`` (default ``DEFAULT_MAX_FRAME_BYTES``), refused before allocating.

Communicators (CPU, NCCL, CUDA IPC) live beside this package in ``cgc.runtime.comm``.

Example:
    >>> from cgc.runtime.channels import ShmRingWriter, ShmRingReader
    >>> w = ShmRingWriter.create("cgc-doc-pkg", slots=2, slot_bytes=4096)
    >>> r = ShmRingReader.attach("cgc-doc-pkg", 0)
    >>> w.write([1, 2]); r.read(timeout=1.0)
    [1, 2]
    >>> r.detach(); w.close()
"""

from __future__ import annotations

from cgc.runtime.channels.errors import (
    ChannelAuthError,
    ChannelClosedError,
    ChannelError,
    ChannelSequenceError,
    ChannelTimeoutError,
    ErrorValue,
    FrameTooLargeError,
    PeerDiedError,
    SegmentExistsError,
    ShmSecurityError,
    UnsupportedPlatformError,
    decode_error,
    lost_value,
)
from cgc.runtime.channels.ring_layout import require_ring_support, ring_supported
from cgc.runtime.channels.ring_reader import ShmRingReader
from cgc.runtime.channels.ring_writer import ShmRingWriter
from cgc.runtime.channels.shm import (
    cleanup_segments,
    list_segments,
    segment_dir,
    sweep_dead_segments,
)
from cgc.runtime.channels.tcp import DEFAULT_MAX_FRAME_BYTES, TcpReader, TcpWriter

__all__ = ["ChannelAuthError", "ChannelClosedError", "ChannelError", "ChannelSequenceError",
           "ChannelTimeoutError", "DEFAULT_MAX_FRAME_BYTES",
           "ErrorValue", "FrameTooLargeError", "PeerDiedError",
           "SegmentExistsError", "ShmRingReader", "ShmRingWriter",
           "ShmSecurityError", "TcpReader", "TcpWriter", "UnsupportedPlatformError",
           "cleanup_segments", "decode_error", "list_segments", "lost_value", "require_ring_support", "ring_supported",
           "segment_dir", "sweep_dead_segments"]
