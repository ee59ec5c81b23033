"""predict: an analytical model of memory, step time, power, energy and temperature.

Public API (stable):

* :func:`predict` — one configuration (RunConfig or :class:`Case`) → :class:`Prediction`;
* :func:`write_prediction` — a prediction as a run directory (``kind: prediction``);
* :func:`fits` — ``(fits, bytes_per_device, breakdown)`` for the planner;
* :mod:`powertrain.core.flops` — THE model-FLOPs definition (MFU/HFU), shared with the analysis;
* :func:`fit_thermal` — thermal parameters from a measured timeline;
* :func:`fit_profile` / :func:`collect_runs` — calibration; :func:`load_profile` / :func:`save_profile`;
* :func:`study_configs` — the study's 32×H200 and 64×H100 matrices; :func:`plot_cluster_comparison`.

The formulas, their sources and the validation table are in ``docs/model.md``.
"""

from powertrain.core.flops import (
    hardware_flops_per_step,
    hardware_flops_per_token,
    model_flops_per_step,
    model_flops_per_token,
)
from powertrain.predict.calibrate import MeasuredRun, collect_runs, fit_profile, read_measured_run
from powertrain.predict.case import Case, case_from_run_config
from powertrain.predict.core import METRIC_NAMES, Prediction, predict
from powertrain.predict.memory import fits, least_recompute_that_fits, memory_per_device
from powertrain.predict.output import write_prediction
from powertrain.predict.profile import Coefficients, Profile, load_profile, save_profile
from powertrain.predict.thermal import ThermalParams, fit_thermal

__all__ = [
    "METRIC_NAMES",
    "Case",
    "Coefficients",
    "MeasuredRun",
    "Prediction",
    "Profile",
    "ThermalParams",
    "case_from_run_config",
    "collect_runs",
    "fit_profile",
    "fit_thermal",
    "fits",
    "hardware_flops_per_step",
    "hardware_flops_per_token",
    "least_recompute_that_fits",
    "load_profile",
    "memory_per_device",
    "model_flops_per_step",
    "model_flops_per_token",
    "predict",
    "read_measured_run",
    "save_profile",
    "write_prediction",
]
