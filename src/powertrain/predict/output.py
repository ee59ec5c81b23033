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
from powertrain.store.rundir import write_json_atomic
from powertrain.store.targets import check_run_target


def write_prediction(run_dir: str | Path, config: Any, prediction: Prediction | None = None,
                     calibration: Calibration | str | None = None, *, force: bool = False) -> RunDir:
    """Create ``run_dir`` with ``run.json`` (kind ``prediction``, status ``ok``) and ``summary.json``.

    ``config`` is a RunConfig; the prediction is computed if not given. A prediction is always
    labelled as one: ``kind: prediction`` in both files, with the calibration (``profile``) and the model's error.

    ``run_dir`` must be new or empty; an existing prediction is replaced only with ``force``, and a
    measured or imported run never (:func:`powertrain.store.targets.check_run_target`). The directory
    is built in a hidden sibling folder and renamed into place, so a failure leaves nothing behind.
    """
    target = check_run_target(run_dir, "prediction", force=force)
    pred = prediction or predict(config, calibration)
    cfg = config.model_dump(mode="json") if hasattr(config, "model_dump") else None
    target.absolute().parent.mkdir(parents=True, exist_ok=True)
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
