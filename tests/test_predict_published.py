"""The packaged calibration set and the model's validation on it, from a fresh clone (no ../shared)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from powertrain.predict import load_calibration, predict
from powertrain.predict.memory import least_recompute_that_fits
from powertrain.predict.published import CALIBRATION_RUNS, load_published

SHARED = Path(os.environ.get("POWERTRAIN_SHARED", Path(__file__).resolve().parents[2] / "shared"))


def test_the_calibration_set_ships_with_the_package_and_names_its_sources() -> None:
    assert CALIBRATION_RUNS.is_file() and "powertrain" in CALIBRATION_RUNS.parts
    text = CALIBRATION_RUNS.read_text()
    assert text.startswith("# Published, measured LLM-training runs")
    raw = yaml.safe_load(text)
    assert len(raw["runs"]) == raw["meta"]["n_runs"]
    assert all(r.get("source", {}).get("ref") for r in raw["runs"])  # every figure keeps its source
    runs = load_published()
    assert len(runs) == raw["meta"]["n_runs"]


def test_the_packaged_copy_is_the_shared_file_plus_its_header() -> None:
    shared = SHARED / "data" / "published" / "calibration_runs.yaml"
    if not shared.is_file():
        pytest.skip(f"shared data not found at {shared} (set POWERTRAIN_SHARED)")
    body = "".join(line for line in CALIBRATION_RUNS.read_text().splitlines(keepends=True)[6:])
    assert hashlib.sha256(body.encode()).hexdigest() == hashlib.sha256(shared.read_bytes()).hexdigest()


def test_a_missing_file_names_the_fix(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="pass the path"):
        load_published(tmp_path / "nope.yaml")


def test_default_profile_meets_the_published_accuracy_targets() -> None:
    """Model validation (what benchmarks/predict_accuracy.py prints): tokens/s per GPU of the
    published runs, dense within 12% and MoE within 20% mean absolute error."""
    prof = load_calibration("default")
    errs: dict[str, list[float]] = {"dense": [], "moe": []}
    for r in load_published():
        if r.skip or r.case is None:
            continue
        case = r.case if r.recompute_stated else replace(
            r.case, recompute=least_recompute_that_fits(r.case, prof.coefficients))
        got = predict(case, prof).metrics["tokens_per_s_per_device"]
        errs[r.arch].append(got / r.tokens_per_s_per_gpu - 1)
    assert len(errs["dense"]) > 100 and len(errs["moe"]) > 10
    assert float(np.mean(np.abs(errs["dense"]))) <= 0.12
    assert float(np.mean(np.abs(errs["moe"]))) <= 0.20
