"""Export a run as a Chrome / Perfetto trace (JSON Trace Event Format), on one time base; the
layout of the trace is described in :mod:`powertrain.trace.perfetto`."""

from powertrain.trace.perfetto import export_trace, trace_events

__all__ = ["export_trace", "trace_events"]
