"""Writing a prediction as a run directory, so reports and ``compare`` treat it like a measured run."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from powertrain.predict.calibration import Calibration
from powertrain.predict.core import Prediction, predict
from powertrain.store import RunDir
from powertrain.store.rundir import write_json_atomic


def write_prediction(run_dir: str | Path, config: Any, prediction: Prediction | None = None,
                     calibration: Calibration | str | None = None) -> RunDir:
    """Create ``run_dir`` with ``run.json`` (kind ``prediction``, status ``ok``) and ``summary.json``.

    ``config`` is a RunConfig; the prediction is computed if not given. A prediction is always
    labelled as one: ``kind: prediction`` in both files, with the calibration (``profile``) and the model's error.
    """
    pred = prediction or predict(config, calibration)
    cfg = config.model_dump(mode="json") if hasattr(config, "model_dump") else None
    rd = RunDir(run_dir).create()
    now = _dt.datetime.now(_dt.UTC).isoformat()
    rd.write({
        "kind": "prediction", "status": "ok", "name": getattr(config, "name", Path(run_dir).name),
        "config": cfg, "profile": pred.calibration, "model_error": pred.model_error,
        "created": now, "start": now, "end": now, "fits_in_memory": pred.fits,
    })
    write_json_atomic(rd.summary_json, pred.summary(cfg))
    return rd
