"""POSIX shared-memory segments: a private per-user directory, owner checks, cleanup, sweep.

Where: every segment is a file in ``/dev/shm/cgc-<euid>/`` (tmpfs, so futex words in it
work as in any shared mapping). That directory is created with mode 0700 and, whenever it
is used, opened with ``O_NOFOLLOW`` and checked: a directory, ours, mode 0700 - else
``ShmSecurityError`` (another local user cannot plant or read files in it, nor swap it for
a symlink).

Squatting: /dev/shm is writable by everyone, so another user can take the name
``cgc-<euid>`` first. Then the folder is ``cgc-<euid>.1`` (or ``.2``, ...): the first of
those names that is ours or free. Every process of ours on the node finds the same one
with no shared record, because the choice is made from what /dev/shm holds: an entry's
owner says whose it is, mkdir is atomic (two of our processes creating at once agree) and
/dev/shm's sticky bit means only its owner can remove or rename an entry. An existing
folder of ours is always preferred to creating one (a squat removed later does not split
our processes between two folders). A name another user holds is never opened as ours -
the checks above still run on whatever is chosen. Cost: one ``lstat`` when ``cgc-<euid>``
is ours (the usual case); under a squat, one listing of /dev/shm per process (the choice is
then remembered), so a user who creates many such names slows a first start by about a
second per million names, and cannot stop it. Segment files are created ``O_EXCL`` with mode 0600: a name that already
exists is ``SegmentExistsError``, never something to attach to. Attaching opens with
``O_NOFOLLOW | O_NONBLOCK`` (a symlink or FIFO is refused, not followed or waited on) and
``fstat`` must show a regular file of ours with mode 0600 before anything is mapped. Names
are the caller's; the runtime makes them unguessable (``endpoints.new_graph_prefix``).

Header: the first 64 bytes of each file record its creator (PID, start time, PID
namespace; see ``procs``). ``Segment.mv`` / ``.addr`` start after it, so channel layouts
never see it. ``sweep_dead_segments()`` unlinks every segment whose creator is gone - what
a SIGKILLed process left behind - and leaves live ones alone; a reused PID is not mistaken
for the creator (start times differ).

Cleanup: every segment this process creates is unlinked by ``Segment.close`` or, at the
latest, at interpreter exit (atexit). Readers only map; they never unlink.
``cleanup_segments(prefix)`` removes whatever is left under one graph's prefix.

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
import errno
import mmap
import os
import stat
import struct
import threading
import time

from cgc.runtime.channels.errors import SegmentExistsError, ShmSecurityError
from cgc.runtime.channels.procs import identity, is_alive

__all__ = ["SHM_ROOT", "SHM_DIR", "HEADER", "Segment", "SegmentNotReady", "segment_dir", "shm_free_bytes",
           "list_segments",
           "cleanup_segments", "sweep_dead_segments"]

SHM_ROOT = "/dev/shm"
SHM_DIR: str | None = None  # the segment directory itself, when set (tests: a private one)
HEADER = 64  # bytes before the data view: the creator record
_SEG_MAGIC = 0x47534743  # "CGSG"
_SEG_VERSION = 1
_SEG_HDR = struct.Struct("<IIIIQQ")  # magic, version, pid, 0, start ticks, pid namespace
_HEADERLESS_AGE = 60.0  # a file without a header this old was left mid-create by a crash

_created: set[str] = set()  # names this process created and has not unlinked yet
_created_lock = threading.Lock()


class SegmentNotReady(FileNotFoundError):
    """The segment exists but its creator has not finished writing its header yet."""


def segment_dir() -> str:
    """This user's segment directory: ``SHM_DIR`` when set, else ``<SHM_ROOT>/cgc-<euid>``,
    or the fallback chosen when another user holds that name (see the module docstring).
    Nothing is created: when no folder exists yet, the name one would get.

    Example:
        >>> import os
        >>> segment_dir().startswith(SHM_DIR or f"{SHM_ROOT}/cgc-{os.geteuid()}")
        True
    """
    try:
        return _locate(create=False)[0]
    except FileNotFoundError as e:
        return str(e.filename)


def shm_free_bytes() -> int:
    """Bytes this user may still allocate on the filesystem that holds ``segment_dir()``
    (``statvfs``: ``f_bavail * f_frsize``). The one place the runtime reads it: the start
    check of the plan's rings (``cgc.runtime.driver.shm_space``) - and the seam tests patch.

    Why the parent folder is asked: the segment folder may not exist yet, and a name in
    /dev/shm is never followed before it is checked (it lives on the same filesystem).

    Example:
        >>> shm_free_bytes() >= 0
        True

    Raises:
        OSError: the folder above the segment directory does not exist (no /dev/shm).
    """
    st = os.statvfs(os.path.dirname(segment_dir()) or ".")
    return st.f_bavail * st.f_frsize


_chosen: dict[tuple[str, int], str] = {}  # (SHM_ROOT, euid) -> the fallback folder in use


def _ours(path: str) -> bool | None:
    """Whose is the entry ``path`` (not followed): True ours, False another user's, None
    no such entry."""
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except FileNotFoundError:
        return None


def _fallbacks(root: str, base: str) -> tuple[list[str], set[str]]:
    """The fallback folders of ours under ``root`` (lowest index first), and every name."""
    try:
        names = set(os.listdir(root))
    except FileNotFoundError:
        return [], set()  # no /dev/shm at all: creating the folder says so
    mine = []
    for n in names:
        tail = n[len(base) + 1:]
        if n.startswith(base + ".") and tail.isdigit() and tail[0] != "0" and \
                _ours(os.path.join(root, n)):
            mine.append((int(tail), os.path.join(root, n)))
    return [path for _i, path in sorted(mine)], names


def _locate(create: bool) -> tuple[str, bool]:
    """The segment folder's path, and whether this call created it (nothing is checked
    here but whose each name is: ``_open_dir`` checks what it opens).

    Raises:
        FileNotFoundError: no folder of ours exists and ``create`` is False (``filename``:
            the path one would create).
    """
    if SHM_DIR:
        if not create:
            return SHM_DIR, False
        try:
            os.mkdir(SHM_DIR, 0o700)
            return SHM_DIR, True
        except FileExistsError:
            return SHM_DIR, False
    uid = os.geteuid()
    root, base = SHM_ROOT, f"cgc-{uid}"
    primary = os.path.join(root, base)
    key = (root, uid)
    for _ in range(100):  # a turn ends, or loses a creation race and looks again
        known = _chosen.get(key)
        if known is not None and _ours(known):
            return known, False
        owner = _ours(primary)
        if owner:
            return primary, False  # ours (the usual case)
        mine, names = _fallbacks(root, base)
        if mine:  # an earlier squat: where our other processes already are
            _chosen[key] = mine[0]
            return mine[0], False
        if owner is None:  # free: the usual first start
            if not create:
                raise FileNotFoundError(errno.ENOENT, "no segment folder yet", primary)
            try:
                os.mkdir(primary, 0o700)
                return primary, True
            except FileExistsError:
                continue  # made meanwhile: by us or by someone else?
        # Another user holds the name: the first fallback that is free.
        i = 1
        while f"{base}.{i}" in names:
            i += 1
        path = os.path.join(root, f"{base}.{i}")
        if not create:
            raise FileNotFoundError(errno.ENOENT, "no segment folder yet", path)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue  # taken since the listing (perhaps by one of ours): look again
        _chosen[key] = path
        return path, True
    raise ShmSecurityError(f"cannot settle on a segment folder in {root}: its entries keep "
                           "changing")


def _check_name(name: str) -> str:
    if not name or "/" in name or name.startswith(".") or len(name) > 200 or "\0" in name:
        raise ValueError(f"invalid shared-memory segment name {name!r}")
    return name


def _open_dir(create: bool) -> int:
    """An fd of the checked segment directory (callers close it).

    Raises:
        FileNotFoundError: it does not exist (and ``create`` is False).
        ShmSecurityError: it is a symlink, not a directory, not ours, or not mode 0700.
    """
    path, made = _locate(create)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ShmSecurityError(f"{path} is a symlink or not a directory: cgc will not "
                                   "use it (remove it)") from None
        raise
    try:
        if made:
            os.fchmod(fd, 0o700)  # exactly 0700 whatever the umask
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
            raise ShmSecurityError(
                f"{path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}; "
                f"cgc needs it owned by uid {os.geteuid()} with mode 700 (remove it)")
    except BaseException:
        os.close(fd)
        raise
    return fd


class Segment:
    """One mapped segment: ``mv`` (data bytes view), ``addr`` (data base address, for
    futexes), ``size`` (data bytes), ``creator`` ((pid, start, pidns) from its header)."""

    __slots__ = ("name", "size", "mm", "mv", "addr", "_full", "_anchor", "owner", "creator")

    HEADER = HEADER

    def __init__(self, name: str, mm: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.mm = mm
        self.size = len(mm) - HEADER
        self._full = memoryview(mm)
        self.mv = self._full[HEADER:]
        # Why a ctypes anchor: it pins the mapping (mmap.close refuses while exported), so
        # the address we hand to futex() can never dangle.
        self._anchor: ctypes.c_char | None = ctypes.c_char.from_buffer(mm)
        self.addr = ctypes.addressof(self._anchor) + HEADER
        self.owner = owner
        _m, _v, pid, _z, start, ns = _SEG_HDR.unpack_from(mm, 0)
        self.creator = (pid, start, ns)

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Create and map a new zero-filled segment with ``size`` data bytes.

        Raises:
            SegmentExistsError: the name is taken (also a ``FileExistsError``).
            ShmSecurityError: the segment directory is not safe to use.
            OSError: /dev/shm is full (ENOSPC) - reported now rather than as SIGBUS later.
        """
        _check_name(name)
        dfd = _open_dir(create=True)
        try:
            fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except FileExistsError:
            raise SegmentExistsError(
                f"shared-memory segment {name} already exists in {segment_dir()}: a name is "
                "only ever created fresh (a reused graph prefix, or a planted file)") from None
        finally:
            os.close(dfd)
        with _created_lock:
            _created.add(name)
        try:
            os.fchmod(fd, 0o600)
            total = HEADER + size
            os.ftruncate(fd, total)
            # Why fallocate: tmpfs pages are reserved now, so a full /dev/shm fails here
            # with ENOSPC instead of killing a process with SIGBUS on first touch.
            os.posix_fallocate(fd, 0, total)
            mm = mmap.mmap(fd, total)
        except BaseException:
            os.close(fd)
            _unlink(name)
            raise
        os.close(fd)
        pid, start, ns = identity()
        _SEG_HDR.pack_into(mm, 0, 0, _SEG_VERSION, pid, 0, start, ns)
        struct.pack_into("<I", mm, 0, _SEG_MAGIC)  # last: a header is whole once it shows
        return cls(name, mm, owner=True)

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map an existing segment after checking it is ours (see the module docstring).

        Raises:
            FileNotFoundError: no such segment (``SegmentNotReady``: it is being created).
            ShmSecurityError: a symlink, not a regular file, another owner, a mode other
                than 0600, or not a cgc segment.
        """
        _check_name(name)
        dfd = _open_dir(create=False)
        try:
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ShmSecurityError(f"shared-memory segment {name} is a symlink: "
                                       "refused") from None
            raise
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            mode = stat.S_IMODE(st.st_mode)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or mode != 0o600:
                raise ShmSecurityError(
                    f"shared-memory segment {name} is not a regular file of uid "
                    f"{os.geteuid()} with mode 600 (uid {st.st_uid}, mode {mode:o}): refused")
            if st.st_size < HEADER:
                raise SegmentNotReady(f"segment {name} is being created")
            mm = mmap.mmap(fd, st.st_size)
        finally:
            os.close(fd)
        magic, version = struct.unpack_from("<II", mm, 0)
        if magic != _SEG_MAGIC or version != _SEG_VERSION:
            mm.close()
            if magic == 0:
                raise SegmentNotReady(f"segment {name} is being created")
            raise ShmSecurityError(f"{name} is not a cgc segment (magic {magic:#x}): refused")
        return cls(name, mm, owner=False)

    def unlink(self) -> None:
        """Remove the name (mappings stay valid until closed). Only the creator unlinks."""
        if self.owner:
            _unlink(self.name)

    def punch(self, start: int) -> None:
        """Give back the memory of data bytes ``start..`` to the system (for every process
        that maps them: they read as zeros afterwards). Only for bytes nobody uses."""
        page = mmap.PAGESIZE
        a = (HEADER + start + page - 1) // page * page
        if a < len(self.mm):
            self.mm.madvise(mmap.MADV_REMOVE, a, len(self.mm) - a)

    def close(self) -> None:
        """Unlink (if created here) and unmap; an unmap still in use by views is left to GC."""
        self.unlink()
        for v in (self.mv, self._full):
            try:
                v.release()
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
        dfd = _open_dir(create=False)
    except (FileNotFoundError, ShmSecurityError):
        return  # nothing of ours there (a directory swapped for a symlink is never followed)
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dfd)


def list_segments(prefix: str) -> list[str]:
    """Names of this user's segments starting with ``prefix`` (sorted).

    Example:
        >>> list_segments("no-such-prefix-xyz")
        []

    Raises:
        ShmSecurityError: the segment directory is not safe to use.
    """
    try:
        dfd = _open_dir(create=False)
    except FileNotFoundError:
        return []
    try:
        return sorted(n for n in os.listdir(dfd) if n.startswith(prefix))
    finally:
        os.close(dfd)


def cleanup_segments(prefix: str | None = None) -> list[str]:
    """Unlink segments; returns the names removed.

    With ``prefix``: every segment of this user starting with it, whoever created it (use a
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
        try:
            names = list_segments(prefix)
        except ShmSecurityError:
            return []
    for n in names:
        _unlink(n)
    return names


def sweep_dead_segments() -> list[str]:
    """Unlink every segment of this user whose creator process is gone; returns the names.

    A creator counts as gone only when it is certain: same PID namespace and either no
    such PID or a different start time (a reused PID). Segments of live processes, and of
    processes in other PID namespaces, are left alone. Run it at every graph start.

    Example:
        >>> isinstance(sweep_dead_segments(), list)
        True

    Raises:
        ShmSecurityError: the segment directory is not safe to use.
    """
    try:
        dfd = _open_dir(create=False)
    except FileNotFoundError:
        return []
    removed = []
    try:
        for name in sorted(os.listdir(dfd)):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=dfd)
            except OSError:
                continue  # gone meanwhile, or a symlink: not a segment
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    continue
                head = os.pread(fd, _SEG_HDR.size, 0)
            finally:
                os.close(fd)
            if len(head) == _SEG_HDR.size and struct.unpack_from("<I", head)[0] == _SEG_MAGIC:
                _m, _v, pid, _z, start, ns = _SEG_HDR.unpack(head)
                dead = not is_alive(pid, start, ns)
            else:  # no header: left mid-create by a crash, once old enough to be sure
                dead = time.time() - st.st_ctime > _HEADERLESS_AGE
            if dead:
                try:
                    os.unlink(name, dir_fd=dfd)
                    removed.append(name)
                except FileNotFoundError:
                    pass
    finally:
        os.close(dfd)
    return removed


atexit.register(cleanup_segments)
