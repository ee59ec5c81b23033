"""Writing a prediction as a run directory, so reports and ``compare`` treat it like a measured run."""

from __future__ import annotations

import datetime as _dt
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from powertrain.predict.calibration import Calibration
from powertrain.predict.core import Prediction, predict
from powertrain.store import RunDir
from powertrain.store.leftovers import remove_stale
from powertrain.store.rundir import write_json_atomic
from powertrain.store.targets import check_run_target


def prediction_interval(pred: Prediction, metric: str = "tokens_per_s", level: str = "80") -> tuple[float, float] | None:
    """The ``level`` % prediction interval of a throughput-like metric, from the profile's
    leave-one-source-out residuals (``error.interval_80_log``: the 80th percentile of
    |log(predicted/measured)| per architecture), or None when the profile holds none.

    Step-time-like metrics (``step_time_mean_s``) get the same factor the other way round."""
    q = (pred.model_error or {}).get(f"interval_{level}_log")
    v = pred.metrics.get(metric)
    if not isinstance(q, dict) or v is None:
        return None
    raw = pred._raw[0] if pred._raw else None
    arch = "moe" if raw is not None and getattr(raw, "is_moe", False) else "dense"
    w = q.get(arch)
    if not isinstance(w, int | float):
        return None
    import math

    f = math.exp(float(w))
    return (float(v) / f, float(v) * f)


def write_prediction(run_dir: str | Path, config: Any, prediction: Prediction | None = None,
                     calibration: Calibration | str | None = None, *, force: bool = False) -> RunDir:
    """Create ``run_dir`` with ``run.json`` (kind ``prediction``, status ``ok``) and ``summary.json``.

    ``config`` is a RunConfig; the prediction is computed if not given. A prediction is always
    labelled as one: ``kind: prediction`` in both files, with the calibration (``profile``) and the model's error.

    ``run_dir`` must be new or empty; an existing prediction is replaced only with ``force``, and a
    measured or imported run never (:func:`powertrain.store.targets.check_run_target`). The directory
    is built in a hidden sibling folder and renamed into place, so a failure leaves nothing behind (and
    the folder a killed one left is removed here, :func:`powertrain.store.leftovers.remove_stale`).
    """
    target = check_run_target(run_dir, "prediction", force=force)
    pred = prediction or predict(config, calibration)
    cfg = config.model_dump(mode="json") if hasattr(config, "model_dump") else None
    target.absolute().parent.mkdir(parents=True, exist_ok=True)
    # the staging folder of a `predict` killed here before (kill -9 skips the finally below)
    remove_stale(target.absolute().parent, [f".{target.name}.predicting-*"])
    tmp = Path(tempfile.mkdtemp(dir=target.absolute().parent, prefix=f".{target.name}.predicting-"))
    try:
        rd = RunDir(tmp / "run").create()
        now = _dt.datetime.now(_dt.UTC).isoformat()
        rd.write({
            "kind": "prediction", "status": "ok", "name": getattr(config, "name", target.name),
            "config": cfg, "profile": pred.calibration, "model_error": pred.model_error,
            "created": now, "start": now, "end": now, "fits_in_memory": pred.fits,
        })
        write_json_atomic(rd.summary_json, pred.summary(cfg))
        if target.is_dir():  # empty, or a prediction replaced with force (checked above)
            os.rename(target, tmp / "old")
        os.rename(rd.path, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return RunDir(target)
