"""STAND-IN ``pynvml`` for subprocess tests — not NVIDIA's library.

Put this folder first on ``PYTHONPATH`` (with ``tests`` after it) and name the state file in
``FAKE_NVML_STATE``: every process of the run (launcher, sampler, ``powertrain restore``) then
imports this module as ``pynvml`` and sees the same stand-in GPUs (:mod:`standins.nvml_state`).
A GPU written with a ``sensor_spec`` (e.g. ``{"waveform": "training_swing", "buffer_period_s": 0.01}``)
reads from a known-truth power sensor on the real clock in each process, its driver buffer
(``nvmlDeviceGetSamples``) included; without one, a GPU has no buffer (NOT_SUPPORTED).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from standins.nvml_state import PersistentNvml

_nvml = PersistentNvml(Path(os.environ["FAKE_NVML_STATE"]))


def __getattr__(name: str) -> Any:
    return getattr(_nvml, name)
