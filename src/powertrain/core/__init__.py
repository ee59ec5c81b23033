"""The shared vocabulary at the bottom of powertrain: definitions every layer uses and none owns.

Modules here import nothing from the rest of powertrain (only the standard library and numpy), so
any package may import them without creating a cycle (the ``core`` import contract in
pyproject.toml checks it):

* :mod:`.flops` — model and hardware FLOPs of a training step (MFU/HFU, the predictor);
* :mod:`.engine_logs` — what an engine's printed step line says (importers, live parsing);
* :mod:`.throttle` — the vendor-neutral throttle bit set and the NVML reason map onto it;
* :mod:`.counters` — un-wrapping hardware counters into monotonic totals;
* :mod:`.series` — a series clipped to a window and its trapezoid integral (analysis, MLPerf import);
* :mod:`.energy` — the one energy integral over an explicit window.
"""
