"""Run directories on disk: layout, atomic JSON, crash-safe Parquet streams and readers."""

from powertrain.store.rundir import RunDir, read_json, write_json_atomic
from powertrain.store.tables import read_events, read_telemetry

__all__ = ["RunDir", "read_events", "read_json", "read_telemetry", "write_json_atomic"]
