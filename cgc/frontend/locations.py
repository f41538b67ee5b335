"""Where the user wrote a node: capture at creation time, render relative to the model file.

A node remembers the first stack frame outside cgc's and Ray's own code (a ``RawLoc`` with
the path as Python knows it). Tracing turns it into ``pb.SourceLoc`` with the file made
relative to the model file's folder when it lies inside it, so plans do not depend on where
the checkout lives.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from types import FrameType

from cgc.plan_schema import plan_pb2 as pb

__all__ = ["RawLoc", "capture_loc", "loc_of_frame", "LocRenderer", "UNKNOWN_LOC"]

# cgc's package folder (cgc/, which also holds cgc/frontend); frames in it are ours.
_CGC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class RawLoc:
    """A source position as captured: the path as given by the interpreter."""

    file: str
    line: int
    function: str

    def short(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}" if self.file else "<unknown>"


UNKNOWN_LOC = RawLoc("", 0, "")


def _internal_dirs() -> tuple[str, ...]:
    dirs = [_CGC_DIR + os.sep]
    ray = sys.modules.get("ray")  # only skip Ray's frames when Ray is loaded at all
    ray_file = getattr(ray, "__file__", None)
    if ray_file:
        dirs.append(os.path.dirname(os.path.abspath(ray_file)) + os.sep)
    return tuple(dirs)


def _is_internal(filename: str, internal: tuple[str, ...]) -> bool:
    if filename.startswith("<frozen"):
        return True  # importlib machinery between a model file and our code
    path = os.path.abspath(filename)
    return path.startswith(internal)


def loc_of_frame(frame: FrameType | None) -> RawLoc:
    """The first frame at or above ``frame`` that is user code, as a ``RawLoc``.

    Example: ``loc_of_frame(sys._getframe()).line`` is the line of that call.

    Raises:
        Nothing; returns ``UNKNOWN_LOC`` when every frame is internal.
    """
    internal = _internal_dirs()
    while frame is not None:
        code = frame.f_code
        if not _is_internal(code.co_filename, internal):
            return RawLoc(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return UNKNOWN_LOC


def capture_loc() -> RawLoc:
    """The user's source position that led to this call (skips cgc and Ray frames).

    Example: inside ``InputNode.__init__``, the line of ``with InputNode() as inp:``.

    Raises:
        Nothing.
    """
    return loc_of_frame(sys._getframe(1))


class LocRenderer:
    """Renders ``RawLoc``s relative to the model file's folder (when inside it).

    A file outside the model's folder keeps its path as given:

    >>> r = LocRenderer("/x/model.py")
    >>> r.text(RawLoc("/x/model.py", 3, "f")), r.text(RawLoc("/y/lib.py", 9, "g"))
    ('model.py:3', '/y/lib.py:9')
    """

    def __init__(self, model_file: str | os.PathLike[str] | None) -> None:
        self._root = None
        if model_file is not None:
            self._root = os.path.dirname(os.path.abspath(os.fspath(model_file)))

    def path(self, file: str) -> str:
        if not file or self._root is None:
            return file
        full = os.path.abspath(file)
        if full.startswith(self._root + os.sep):
            return os.path.relpath(full, self._root).replace(os.sep, "/")
        return file

    def text(self, loc: RawLoc) -> str:
        """``file:line`` for messages; ``<unknown location>`` when not known."""
        if not loc.file:
            return "<unknown location>"
        return f"{self.path(loc.file)}:{loc.line}"

    def proto(self, loc: RawLoc) -> pb.SourceLoc:
        return pb.SourceLoc(file=self.path(loc.file), line=loc.line, function=loc.function)
