"""POSIX shared-memory segments (files under /dev/shm) and the per-process cleanup registry.

Every segment this process *creates* is recorded and unlinked by ``Segment.close`` or, at
the latest, at interpreter exit (atexit). Readers only map segments; they never unlink.
``cleanup_segments(prefix)`` removes whatever a crashed process left behind (the driver
calls it at teardown with the graph's unique prefix).

Example:
    >>> from cgc.runtime.channels.shm import Segment, list_segments
    >>> s = Segment.create("cgc-doc-seg", 4096)
    >>> list_segments("cgc-doc-seg")
    ['cgc-doc-seg']
    >>> s.close(); list_segments("cgc-doc-seg")
    []
"""

from __future__ import annotations

import atexit
import ctypes
import mmap
import os
import threading

__all__ = ["SHM_DIR", "Segment", "list_segments", "cleanup_segments"]

SHM_DIR = "/dev/shm"

_created: set[str] = set()  # names this process created and has not unlinked yet
_created_lock = threading.Lock()


def _path(name: str) -> str:
    if not name or "/" in name or len(name) > 200:
        raise ValueError(f"invalid shared-memory segment name {name!r}")
    return os.path.join(SHM_DIR, name)


class Segment:
    """One mapped /dev/shm file: ``mv`` (bytes view), ``addr`` (base address for futexes)."""

    __slots__ = ("name", "size", "mm", "mv", "addr", "_anchor", "owner")

    def __init__(self, name: str, mm: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.mm = mm
        self.size = len(mm)
        self.mv = memoryview(mm)
        # Why a ctypes anchor: it pins the mapping (mmap.close refuses while exported), so
        # the address we hand to futex() can never dangle.
        self._anchor = ctypes.c_char.from_buffer(mm)
        self.addr = ctypes.addressof(self._anchor)
        self.owner = owner

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Create and map a new zero-filled segment of ``size`` bytes (fails if it exists).

        Raises:
            FileExistsError: the name is taken.
            OSError: /dev/shm is full (ENOSPC) - reported now rather than as SIGBUS later.
        """
        path = _path(name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        with _created_lock:
            _created.add(name)
        try:
            os.ftruncate(fd, size)
            # Why fallocate: tmpfs pages are reserved now, so a full /dev/shm fails here
            # with ENOSPC instead of killing a process with SIGBUS on first touch.
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            _unlink(name)
            raise
        os.close(fd)
        return cls(name, mm, owner=True)

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map an existing segment.

        Raises:
            FileNotFoundError: no such segment.
        """
        fd = os.open(_path(name), os.O_RDWR)
        try:
            mm = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        return cls(name, mm, owner=False)

    def unlink(self) -> None:
        """Remove the name (mappings stay valid until closed). Only the creator unlinks."""
        if self.owner:
            _unlink(self.name)

    def close(self) -> None:
        """Unlink (if created here) and unmap; an unmap still in use by views is left to GC."""
        self.unlink()
        try:
            self.mv.release()
        except BufferError:
            pass
        self._anchor = None
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass  # a zero-copy view still uses it; the mapping goes when that view dies


def _unlink(name: str) -> None:
    with _created_lock:
        _created.discard(name)
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def list_segments(prefix: str) -> list[str]:
    """Names of the /dev/shm entries starting with ``prefix`` (sorted).

    Example:
        >>> list_segments("no-such-prefix-xyz")
        []
    """
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def cleanup_segments(prefix: str | None = None) -> list[str]:
    """Unlink segments; returns the names removed.

    With ``prefix``: every /dev/shm entry starting with it, whoever created it (use a
    prefix unique to one graph). Without: every segment this process created.

    Example:
        >>> cleanup_segments("no-such-prefix-xyz")
        []
    """
    if prefix is None:
        with _created_lock:
            names = sorted(_created)
    else:
        if not prefix:
            raise ValueError("an empty prefix would remove every segment")
        names = list_segments(prefix)
    for n in names:
        _unlink(n)
    return names


atexit.register(cleanup_segments)
