"""The ``powertrain`` command line: thin commands over the Python API.

Each command lives in its own module of this package and registers itself on :data:`app`.
"""

from __future__ import annotations

import typer

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
) -> None:
    """Measure, explain and predict the power, performance and thermal behaviour of LLM training."""


# Command modules register themselves on `app` when imported.
from powertrain.cli import calibrate as _calibrate  # noqa: E402,F401
from powertrain.cli import compare as _compare  # noqa: E402,F401
from powertrain.cli import importer as _importer  # noqa: E402,F401
from powertrain.cli import monitor as _monitor  # noqa: E402,F401
from powertrain.cli import plan as _plan  # noqa: E402,F401
from powertrain.cli import predict as _predict  # noqa: E402,F401
from powertrain.cli import report as _report  # noqa: E402,F401
from powertrain.cli import run as _run  # noqa: E402,F401
from powertrain.cli import summarize as _summarize  # noqa: E402,F401
from powertrain.cli import sweep as _sweep  # noqa: E402,F401
from powertrain.cli import trace as _trace  # noqa: E402,F401


def main() -> None:
    app()
