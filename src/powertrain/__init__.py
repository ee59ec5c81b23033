"""powertrain: measure, explain and predict the power, performance and thermal behaviour of
distributed LLM training.

The public API is small: :class:`Monitor` samples this node's devices around a region of code or a
command; :func:`powertrain.store.read_telemetry` / ``read_events`` load what a run recorded.
"""

from powertrain.monitor import Monitor

__version__ = "0.1.0"
__all__ = ["Monitor", "__version__"]
