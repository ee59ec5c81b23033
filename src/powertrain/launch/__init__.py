"""Launching runs: one configuration on this node (:mod:`.local`), or a sweep of them (:mod:`.sweep`)."""

from powertrain.launch.local import RunResult, launch_local

__all__ = ["RunResult", "launch_local"]
