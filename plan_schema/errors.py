"""Error types shared by the compiler, the plan file reader and the runtime.

Every cgc error carries the process exit code the CLI uses for it, so the CLI and the
Python API raise the same exceptions and the CLI only maps them to exit codes.
"""

from __future__ import annotations

__all__ = [
    "EXIT_OK",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "EXIT_INVALID_INPUT",
    "EXIT_INVALID_PLAN",
    "EXIT_VERIFY",
    "CgcError",
    "PlanFormatError",
    "UntrustedPlanError",
    "PlanFileMissingError",
    "ConfigError",
    "CgcTimeoutError",
    "CompileError",
    "RayVersionError",
]

EXIT_OK = 0
EXIT_RUNTIME = 1  # the graph ran and failed (or could not start)
EXIT_USAGE = 2  # wrong command line (click's own code for usage errors)
EXIT_INVALID_INPUT = 3  # the model file or graph is wrong
EXIT_INVALID_PLAN = 4  # the plan file is not a valid plan
EXIT_VERIFY = 5  # the plan is well-formed but its programs can deadlock


class CgcError(Exception):
    """Base of all cgc errors; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_RUNTIME


class PlanFormatError(CgcError):
    """A file is not a plan, is truncated or corrupted, or has an unsupported version."""

    exit_code = EXIT_INVALID_PLAN


class UntrustedPlanError(PlanFormatError):
    """The plan holds pickled values and the caller did not say it trusts the file."""


class PlanFileMissingError(PlanFormatError):
    """The plan path names no file (a usage error: exit 2, not 4).

    A ``PlanFormatError`` still, so code that catches those for any unreadable plan keeps
    working; the CLI exits with 2 because the command line named a path that is not there.
    """

    exit_code = EXIT_USAGE


class ConfigError(CgcError):
    """A run setting is unknown or out of range (``start()`` arguments, ``cgc run`` options)."""

    exit_code = EXIT_USAGE


class CgcTimeoutError(CgcError, TimeoutError):
    """Base of every cgc timeout (also a builtin ``TimeoutError``): a result not read in time
    (``GetTimeoutError``), a submission that found no room (``SubmitTimeoutError``) and a
    channel or communicator read or write (``ChannelTimeoutError``) are all caught by
    ``except CgcTimeoutError`` (or ``except TimeoutError``)."""


# The compiler's error lives here, beside the others, because ``RayVersionError`` is one:
# the registry of Ray's internals (``cgc.runtime.ray_internals``) raises it for the
# frontend and the runtime alike, and the runtime may not import the compiler.
class CompileError(CgcError):
    """The model or graph is invalid; the message names the node, class.method and line.

    Example::

        raise CompileError(
            "model.py:14: w1.fwd#2 (Worker.fwd): fwd() takes 1 argument but 2 were bound",
            node="w1.fwd#2", actor="w1", method="fwd", loc="model.py:14",
        )

    Attributes:
        node: the node's name (``"w1.fwd#2"``), or ``""`` when the error is not about one.
        actor: the actor's name in the graph (``"w1"``), or ``""``.
        method: the method name (``"fwd"``), or ``""``.
        loc: ``"file:line"`` of the user's code the error is about, or ``""``.
    """

    exit_code = EXIT_INVALID_INPUT

    def __init__(
        self,
        message: str,
        *,
        node: str = "",
        actor: str = "",
        method: str = "",
        loc: str = "",
    ) -> None:
        super().__init__(message)
        self.node = node
        self.actor = actor
        self.method = method
        self.loc = loc


class RayVersionError(CompileError):
    """The installed Ray lacks an internal that cgc uses.

    Raised instead of an ``AttributeError`` when a Ray release renamed or removed one of
    the private attributes or functions listed in ``cgc.runtime.ray_internals``; the
    message names the installed Ray version and the missing internal.

    Example::

        RayVersionError("the installed Ray 3.0.0 has no <internal>, which cgc's Ray DAG "
                        "adapter uses (it was written for Ray 2.60); install ...")
    """
