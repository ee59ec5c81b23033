"""Where powertrain's diagnostics go: the ``powertrain`` logger, shown on stderr as plain text.

Library modules only log (``log = logging.getLogger(__name__)``) and never print. A process that
has not configured logging still shows warnings and errors on stderr, message text only (Python's
last-resort handler), so a training script using the API sees what it saw before. The entry points
that own a process call :func:`show_on_stderr`: the CLI (``--verbose`` / ``--quiet`` pick the
level) and the sampler process (whose stderr the monitor keeps in ``logs/``).
"""

from __future__ import annotations

import logging
import sys

LOGGER = "powertrain"


class CurrentStderr(logging.Handler):
    """Writes each record, message text only, to whatever ``sys.stderr`` is when it is emitted (a
    test runner or ``typer.testing.CliRunner`` may have replaced it since the handler was made)."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def show_on_stderr(level: int = logging.WARNING) -> None:
    """Show records of the ``powertrain`` loggers at ``level`` and above on stderr (message text
    only). Calling it again replaces the handler it installed before rather than adding one. Records
    below ``level`` still reach handlers configured elsewhere (e.g. the sampler's log file)."""
    logger = logging.getLogger(LOGGER)
    for old in [h for h in logger.handlers if isinstance(h, CurrentStderr)]:
        logger.removeHandler(old)
    logger.addHandler(CurrentStderr(level))
    logger.setLevel(min(level, logging.getLogger().getEffectiveLevel()))
