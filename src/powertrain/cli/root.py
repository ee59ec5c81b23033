"""The ``powertrain`` typer application: its help, the root options (``--version``, ``--verbose``,
``--quiet``, ``--debug``) and :func:`main`. Commands register on :data:`app` from their own modules
of :mod:`powertrain.cli`.

**One error path.** Whatever escapes a command — a damaged file, a refused value, a bug — ends as
one line on stderr, ``powertrain: error: <message>`` (naming the file, field or line where the
exception carries it), and exit code 2; a usage error (unknown option, bad option value) is one
such line too. ``--debug`` (or ``POWERTRAIN_DEBUG=1``) lets the exception through with its
traceback instead. A command that reports its own failure and chooses its exit code keeps both.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from powertrain.core.names import printable
from powertrain.diagnostics import show_on_stderr
from powertrain.fast_exit import skip_final_collection

PREFIX = "powertrain: error: "
DEBUG_ENV = "POWERTRAIN_DEBUG"
_DEBUG_KEY = "powertrain.debug"
_MAX_MESSAGE = 600  # characters of one error line (a hostile value can be megabytes long)


def debug_from_env() -> bool:
    """``POWERTRAIN_DEBUG`` set to anything but empty, 0, false, no or off."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def error_line(exc: BaseException) -> str:
    """``exc`` as one readable line (no prefix): the first problem of a validation error with its
    field path, a YAML error with file:line:column, an OS error with its file, a decoding error
    with the byte and position; newlines and control characters escaped, length capped."""
    return _one_line(_describe(exc))


def _describe(exc: BaseException) -> str:
    import json

    import yaml
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        errs = exc.errors()
        if not errs:
            return f"{exc.title}: invalid"
        first = errs[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        more = f" (and {len(errs) - 1} more problem(s))" if len(errs) > 1 else ""
        return f"{exc.title}: {loc + ': ' if loc else ''}{first.get('msg', 'invalid')}{more}"
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"{mark.name}:{mark.line + 1}:{mark.column + 1}: " if mark is not None else ""
        return f"{where}not valid YAML: {' '.join(x for x in (exc.context, exc.problem) if x)}"
    if isinstance(exc, yaml.YAMLError):
        return f"not valid YAML: {exc}"
    if isinstance(exc, UnicodeDecodeError):
        bad = exc.object[exc.start:exc.start + 1]
        return f"not UTF-8 text: byte 0x{bad.hex()} at position {exc.start} ({exc.reason})"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, OSError) and exc.strerror:
        names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
        return f"{' → '.join(names) + ': ' if names else ''}{exc.strerror}"
    if isinstance(exc, KeyError):
        return f"missing key {exc.args[0]!r}" if exc.args else "missing key"
    if isinstance(exc, MemoryError):
        return "ran out of memory (an input far larger than this machine can hold?); --debug shows where"
    if _is_arrow_error(exc):
        return f"unreadable table data ({type(exc).__name__}): {exc}"
    text = str(exc).strip()
    if isinstance(exc, (ValueError, OSError, EOFError)):
        return text or type(exc).__name__
    # anything else is not a foreseen input problem: say what it was, and how to see more
    return f"{type(exc).__name__}: {text or 'no message'} (unexpected; --debug shows the traceback)"


def _is_arrow_error(exc: BaseException) -> bool:
    mod = type(exc).__module__ or ""
    return mod.startswith("pyarrow")


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    safe = printable("; ".join(lines))  # an escape sequence or bidi override in a name is shown, not obeyed
    return safe if len(safe) <= _MAX_MESSAGE else safe[:_MAX_MESSAGE - 1] + "…"


# `run` and `monitor`: whether the sampler reads the GPU driver's buffered power samples (one definition)
PowerBufferOption = Annotated[bool, typer.Option(
    "--power-buffer/--no-power-buffer",
    help="Read the GPU driver's own buffered power samples (NVML) between polls, so peaks and short bursts "
         "come from the driver's samples (telemetry/power-samples/); each device records whether it was used.")]


def shown_text(value: object) -> str:
    """Text from data (a run name, host, device, reason) for a rich console or table with markup on:
    unprintable characters escaped (:func:`powertrain.core.names.printable`: terminal escape sequences,
    bidi overrides) and rich markup escaped (a name like ``[red]x`` is shown as it is written)."""
    from rich.markup import escape

    return escape(printable(value))


def report_error(message: str) -> None:
    """Write ``powertrain: error: <message>`` to stderr, as one line."""
    sys.stderr.write(PREFIX + _one_line(message) + "\n")
    sys.stderr.flush()


class OneErrorLineGroup(TyperGroup):
    """The root command: every exception a command lets out, and every usage error, becomes one
    line on stderr (see the module doc); ``--debug`` re-raises instead."""

    _let_through: BaseException | None = None  # the exception --debug lets out of invoke

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # a command's chosen exit code; usage errors (typer's click): handled in main
        except Exception as exc:
            if ctx.meta.get(_DEBUG_KEY) or debug_from_env():
                self._let_through = exc
                raise
            report_error(error_line(exc))
            raise typer.Exit(2) from None

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:
            report_error("aborted")
            sys.exit(1)
        except typer.TyperException as exc:  # typer's click: usage errors (bad option value, unknown option)
            if type(exc).__name__ == "NoArgsIsHelpError":  # the help was shown
                sys.exit(exc.exit_code)
            report_error(_usage_line(exc))
            sys.exit(exc.exit_code)
        except Exception as exc:  # outside any command (a root option's callback)
            if exc is self._let_through or debug_from_env():
                raise
            report_error(error_line(exc))
            sys.exit(2)
        sys.exit(code if isinstance(code, int) else 0)


def _usage_line(exc: typer.TyperException) -> str:
    """A usage error as one line: the message, then where ``--help`` shows the right usage."""
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None)
    return exc.format_message() + (f" (see {path} --help)" if path else "")


app = typer.Typer(
    name="powertrain",
    cls=OneErrorLineGroup,
    help=(
        "Measure, explain and predict the power, performance and thermal behaviour of distributed "
        "LLM training.\n\n"
        "Start with `powertrain monitor -- COMMAND` to sample every device of this node while a "
        "command runs, e.g.\n\n"
        "  powertrain monitor --out runs/loop -- python examples/cpu_train_loop.py --steps 30\n\n"
        "Every command's --help shows an example."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        import importlib.metadata

        typer.echo(f"powertrain {importlib.metadata.version('powertrain')}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, show_default=False,
                                help="Show more diagnostics on stderr: -v what is being done, -vv debugging detail."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Show only errors on stderr (no warnings)."),
    debug: bool = typer.Option(False, "--debug", envvar=DEBUG_ENV,
                               help="On an error, show the full traceback instead of one line "
                                    "(also POWERTRAIN_DEBUG=1)."),
) -> None:
    """Measure, explain and predict the power, performance and thermal behaviour of LLM training."""
    ctx.meta[_DEBUG_KEY] = debug
    show_on_stderr(log_level(verbose, quiet))


def log_level(verbose: int, quiet: bool) -> int:
    """The diagnostics shown: warnings and errors by default, errors only with ``--quiet`` (it wins
    over ``--verbose``), informational with ``-v`` and debugging with ``-vv``."""
    if quiet:
        return logging.ERROR
    return (logging.WARNING, logging.INFO)[verbose] if verbose < 2 else logging.DEBUG


def main() -> None:
    """The ``powertrain`` console script (errors: see the module doc)."""
    skip_final_collection()  # `run`, `predict` and the probes import torch: its exit-time GC costs seconds
    app()
