"""The ``powertrain`` command line: thin commands over the Python API.

Each command lives in its own module of this package and registers itself on :data:`app`. The CLI
alone prints: library code logs, and the root options ``--verbose`` / ``--quiet`` choose which of
those diagnostics reach stderr (warnings and errors by default, message text only).
"""

from powertrain.cli.root import app, log_level, main

__all__ = ["app", "log_level", "main"]

# Command modules register themselves on `app` when imported (after it is bound: some import it from here).
from powertrain.cli import advise as _advise  # noqa: F401
from powertrain.cli import calibrate as _calibrate  # noqa: F401
from powertrain.cli import compare as _compare  # noqa: F401
from powertrain.cli import importer as _importer  # noqa: F401
from powertrain.cli import monitor as _monitor  # noqa: F401
from powertrain.cli import plan as _plan  # noqa: F401
from powertrain.cli import predict as _predict  # noqa: F401
from powertrain.cli import report as _report  # noqa: F401
from powertrain.cli import restore as _restore  # noqa: F401
from powertrain.cli import run as _run  # noqa: F401
from powertrain.cli import summarize as _summarize  # noqa: F401
from powertrain.cli import sweep as _sweep  # noqa: F401
from powertrain.cli import trace as _trace  # noqa: F401
