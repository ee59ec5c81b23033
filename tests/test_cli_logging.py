"""`powertrain --verbose/--quiet`: which of the library's logged diagnostics reach stderr, as plain text."""

from __future__ import annotations

import logging

import pytest
from typer.testing import CliRunner

from powertrain.cli import app, log_level
from powertrain.diagnostics import LOGGER, CurrentStderr


@pytest.fixture(autouse=True)
def _restore_powertrain_logger():
    logger = logging.getLogger(LOGGER)
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_levels():
    assert log_level(0, False) == logging.WARNING
    assert log_level(1, False) == logging.INFO
    assert log_level(2, False) == logging.DEBUG
    assert log_level(1, True) == logging.ERROR  # --quiet wins


@pytest.mark.parametrize(("options", "shown"), [([], ["warn", "err"]), (["-q"], ["err"]),
                                                 (["-v"], ["info", "warn", "err"]),
                                                 (["-vv"], ["debug", "info", "warn", "err"])])
def test_root_options_choose_what_reaches_stderr(options, shown, capsys):
    assert CliRunner().invoke(app, [*options, "trace", "--help"]).exit_code == 0
    capsys.readouterr()
    log = logging.getLogger("powertrain.some.module")
    log.debug("debug")
    log.info("info")
    log.warning("warn")
    log.error("err")
    assert capsys.readouterr().err.splitlines() == shown  # message text only, nothing added
    assert sum(isinstance(h, CurrentStderr) for h in logging.getLogger(LOGGER).handlers) == 1


def test_debug_is_a_root_option_and_leaves_the_levels_alone(capsys):
    res = CliRunner().invoke(app, ["--debug", "trace", "--help"])
    assert res.exit_code == 0
    assert "--debug" in CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).stdout
    capsys.readouterr()
    logging.getLogger("powertrain.some.module").info("info")
    assert capsys.readouterr().err == ""  # --debug shows tracebacks, not more diagnostics (that is -v)
