"""Launching runs: one configuration on this node (:mod:`.local`), or a sweep of them (:mod:`.sweep`);
:mod:`.gpu_check` drives a whole monitored run to check the NVIDIA telemetry path on a real GPU."""

from powertrain.launch.local import RunResult, launch_local

__all__ = ["RunResult", "launch_local"]
