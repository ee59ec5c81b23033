"""powertrain: measure, explain and predict the power, performance and thermal behaviour of
distributed LLM training.

The public API is small: :class:`Monitor` samples this node's devices around a region of code or a
command; :func:`powertrain.store.read_telemetry` / ``read_events`` load what a run recorded.
:func:`step` / :func:`phase` mark a training loop (recorded into the run of the enclosing
``Monitor`` block, or of ``powertrain monitor``), :func:`window` / :func:`set_window` mark warm-up,
:func:`load` opens a run directory and :func:`summary` gives its metrics (see :mod:`powertrain.api`).
"""

from powertrain.api import Run, begin_step, end_step, load, phase, set_window, step, summary, window
from powertrain.monitor import Monitor

__version__ = "0.1.0"
__all__ = ["Monitor", "Run", "__version__", "begin_step", "end_step", "load", "phase", "set_window", "step",
           "summary", "window"]
