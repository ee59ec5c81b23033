"""The ``powertrain`` typer application: its help, the root options (``--version``, ``--verbose``,
``--quiet``) and :func:`main`. Commands register on :data:`app` from their own modules of
:mod:`powertrain.cli`."""

from __future__ import annotations

import logging

import typer

from powertrain.diagnostics import show_on_stderr

app = typer.Typer(
    name="powertrain",
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
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, show_default=False,
                                help="Show more diagnostics on stderr: -v what is being done, -vv debugging detail."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Show only errors on stderr (no warnings)."),
) -> None:
    """Measure, explain and predict the power, performance and thermal behaviour of LLM training."""
    show_on_stderr(log_level(verbose, quiet))


def log_level(verbose: int, quiet: bool) -> int:
    """The diagnostics shown: warnings and errors by default, errors only with ``--quiet`` (it wins
    over ``--verbose``), informational with ``-v`` and debugging with ``-vv``."""
    if quiet:
        return logging.ERROR
    return (logging.WARNING, logging.INFO)[verbose] if verbose < 2 else logging.DEBUG

def main() -> None:
    app()
