"""Analysis: the metrics of DESIGN.md per step, device, node, run and sweep.

* :func:`summarize_run` / :func:`write_summary` / :func:`load_summary` — one run's ``summary.json``;
* :func:`summarize_sweep` — one row per run of a sweep folder, written as ``summary.parquet``;
* :data:`METRICS` — every run-level metric's name, unit and one-line definition.

Definitions are in the docstrings of :mod:`~powertrain.analyze.steps`,
:mod:`~powertrain.analyze.telemetry`, :mod:`~powertrain.analyze.signal`,
:mod:`~powertrain.analyze.work` and :mod:`~powertrain.analyze.summary`, and in ``docs/metrics.md``.
"""

from powertrain.analyze.metrics import METRIC_NAMES, METRICS, format_value
from powertrain.analyze.summary import (
    classify_status,
    load_summary,
    summarize_run,
    window_text,
    write_summary,
)
from powertrain.analyze.sweep import is_sweep_dir, load_sweep, summarize_sweep

__all__ = [
    "METRICS",
    "METRIC_NAMES",
    "classify_status",
    "format_value",
    "is_sweep_dir",
    "load_summary",
    "load_sweep",
    "summarize_run",
    "summarize_sweep",
    "window_text",
    "write_summary",
]
