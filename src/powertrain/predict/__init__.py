"""predict: an analytical model of memory, step time, power, energy and temperature.

Public API (stable):

* :func:`predict` — one configuration (RunConfig or :class:`Case`) → :class:`Prediction`;
* :func:`write_prediction` — a prediction as a run directory (``kind: prediction``);
* :func:`fits` — ``(fits, bytes_per_device, breakdown)`` for the planner;
* :mod:`powertrain.core.flops` — THE model-FLOPs definition (MFU/HFU), shared with the analysis;
* :func:`fit_thermal` — thermal parameters from a measured timeline;
* :func:`fit_calibration` / :func:`collect_runs` — calibration; :func:`load_calibration` / :func:`save_calibration`;
* :func:`study_configs` — the study's 32×H200 and 64×H100 matrices; :func:`plot_cluster_comparison`.

The formulas, their sources and the validation table are in ``docs/model.md``.
"""

from powertrain.core.flops import (
    hardware_flops_per_step,
    hardware_flops_per_token,
    model_flops_per_step,
    model_flops_per_token,
)
from powertrain.predict.calibrate import MeasuredRun, collect_runs, fit_calibration, read_measured_run
from powertrain.predict.calibration import Calibration, Coefficients, load_calibration, save_calibration
from powertrain.predict.case import Case, case_from_run_config
from powertrain.predict.core import METRIC_NAMES, Prediction, predict
from powertrain.predict.memory import fits, least_recompute_that_fits, memory_per_device
from powertrain.predict.output import write_prediction
from powertrain.predict.thermal import ThermalParams, fit_thermal

__all__ = [
    "METRIC_NAMES",
    "Calibration",
    "Case",
    "Coefficients",
    "MeasuredRun",
    "Prediction",
    "ThermalParams",
    "case_from_run_config",
    "collect_runs",
    "fit_calibration",
    "fit_thermal",
    "fits",
    "hardware_flops_per_step",
    "hardware_flops_per_token",
    "least_recompute_that_fits",
    "load_calibration",
    "memory_per_device",
    "model_flops_per_step",
    "model_flops_per_token",
    "predict",
    "read_measured_run",
    "save_calibration",
    "write_prediction",
]
