"""The ``cgc`` command: one click group, one module per subcommand.

Subcommand modules are imported only when their command runs (``LazyGroup``), so
``cgc --help`` imports neither Ray nor torch. Every command body calls into the same
Python API users call; errors are ``CgcError``s that carry their exit code.
"""

from __future__ import annotations

import importlib.util
import sys

import click

from cgc.plan_schema.errors import EXIT_RUNTIME, CgcError
from cgc.plan_schema.version import CGC_VERSION

__all__ = ["cli", "main"]

# name -> (module, attribute, one-line help shown by `cgc --help`)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "compile": ("cgc.cli.compile_cmd", "compile_cmd", "Compile a model file into a .cgplan."),
    "inspect": ("cgc.cli.inspect_cmd", "inspect_cmd", "Print a plan as text or JSON."),
    "check": (
        "cgc.cli.check_cmd",
        "check_cmd",
        "Verify a plan's format, checksum and deadlock-freedom.",
    ),
    "run": ("cgc.cli.run_cmd", "run_cmd", "Run a plan on Ray and report latency."),
    "viz": ("cgc.cli.viz_cmd", "viz_cmd", "Draw a plan's graph or schedule."),
    "keys": ("cgc.cli.keys_cmd", "keys_cmd", "Show your plan-signing key; trust others' keys."),
    "trust": ("cgc.cli.trust_cmd", "trust_cmd", "Trust modules whose classes unsigned plans use."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in SUBCOMMANDS if _available(name))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS or not _available(cmd_name):
            return None
        module, attr, _ = SUBCOMMANDS[cmd_name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text from the table: listing commands must not import them.
        rows = [(name, SUBCOMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _available(name: str) -> bool:
    return importlib.util.find_spec(SUBCOMMANDS[name][0]) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(CGC_VERSION, prog_name="cgc")
@click.option("--debug", is_flag=True, help="Show Python tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """cgc: compile static graphs of Ray actor calls into verified, portable plans."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the CLI, turning cgc errors into one line and an exit code.

    Ctrl-C at any moment ends with "Aborted." and exit code 130: a SIGINT interrupts the
    command; the cleanup it starts (teardown, Ray's shutdown) runs to its end first.
    Everything the command writes to stdout and stderr passes ``escape_lines`` (no control
    sequence from a plan reaches the terminal: ``cgc.plan_schema.display``).
    """
    import signal

    from cgc.plan_schema.display import EscapedText
    from cgc.runtime.driver.interrupts import interrupts_seen, own_process, watch_interrupts

    # Called from Python (tests, notebooks: argv given), main() must leave the caller's Ray
    # and SIGINT handler as it found them; as the `cgc` program it owns the process.
    owns_process = argv is None
    ray_mod = sys.modules.get("ray")
    ray_was_up = ray_mod is not None and ray_mod.is_initialized()
    handler = signal.getsignal(signal.SIGINT)
    watch_interrupts()
    if owns_process:  # a Ctrl-C during a long ray.init() may then end the process at once
        own_process()
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapedText(sys.stdout), EscapedText(sys.stderr)
    code = 130
    try:
        code = _main(argv)
    except KeyboardInterrupt:  # after the command's own handling, before leaving Ray
        click.echo("Aborted.", err=True)
    finally:
        try:
            _leave_ray(shutdown=not ray_was_up)
        except KeyboardInterrupt:  # the first Ctrl-C, before _leave_ray ignored SIGINT
            _leave_ray(shutdown=not ray_was_up)
            code = 130
        if interrupts_seen() and code != 130:
            # A Ctrl-C while leaving, or one some library caught: still an abort.
            click.echo("Aborted.", err=True)
            code = 130
        if not owns_process:
            sys.stdout, sys.stderr = streams
            if handler is not None:
                signal.signal(signal.SIGINT, handler)
        else:
            # The exit code is decided. SIG_IGN, not a Python handler: Python resets those
            # to SIG_DFL while it finalizes, where a late Ctrl-C would kill the process.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


def _leave_ray(shutdown: bool) -> None:
    """Stop the Ray this command started (``shutdown``), with SIGINT ignored from here on.

    Why here: otherwise Ray's own shutdown runs at interpreter exit, where a Ctrl-C makes its
    C++ core worker abort the process (SIGABRT or SIGSEGV instead of exit code 130).
    """
    from cgc.runtime.driver.interrupts import ignore_interrupts

    ignore_interrupts()
    ray = sys.modules.get("ray")
    if shutdown and ray is not None and ray.is_initialized():
        ray.shutdown()


def _main(argv: list[str] | None) -> int:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="cgc", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.ClickException as exc:  # usage errors: click's own message and code
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except CgcError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        where = _remote_site(getattr(exc, "remote_traceback", ""))
        if where:
            click.echo(where, err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("Aborted.", err=True)
        return 130
    except Exception as exc:  # a bug in cgc: still one line unless --debug
        if debug:
            raise
        click.echo(
            f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
            err=True,
        )
        return EXIT_RUNTIME
    return 0


def _remote_site(traceback_text: str) -> str:
    """The innermost frame of a remote traceback (the user's line that raised), indented."""
    lines = traceback_text.rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    if not frames:
        return ""
    i = frames[-1]
    site = [lines[i].strip()]
    # A source line is indented under its frame; the exception line is not.
    if i + 1 < len(lines) and lines[i + 1].startswith("    "):
        site.append(lines[i + 1].strip())
    return "  raised at " + ": ".join(site) + "  (--debug shows the whole traceback)"


if __name__ == "__main__":
    from cgc.cli.entry import forget_caught_interrupts

    exit_code = main()
    forget_caught_interrupts()  # python -m: a caught Ctrl-C must not end the run by SIGINT
    sys.exit(exit_code)
