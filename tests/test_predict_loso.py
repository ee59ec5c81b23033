"""Honest fitting: bounds that fail loudly, intervals from held-out residuals, stored host probes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from powertrain.hardware import HostProbe, get_device
from powertrain.predict import Calibration, Case, predict
from powertrain.predict.calibrate import MeasuredRun, fit_calibration, interval_half_width, pinned_at_bounds
from powertrain.predict.case import cpu_probe_for
from powertrain.predict.output import prediction_interval


def _case(**kw: object) -> Case:
    base = dict(layers=8, hidden=1024, ffn=4096, heads=8, kv_heads=8, vocab=32000, seq_len=1024,
                device=get_device("h100-sxm"), devices_per_node=8, global_batch=8, micro_batch=1)
    base.update(kw)
    return Case(**base)  # type: ignore[arg-type]


def test_pinned_coefficients_are_named() -> None:
    b = {"a": (0.1, 1.0), "b": (1.0, 10.0)}
    assert pinned_at_bounds({"a": 0.5, "b": 5.0}, b) == []
    got = pinned_at_bounds({"a": 0.1, "b": 9.999}, b)
    assert len(got) == 2 and got[0].startswith("a = 0.1")


def test_a_fit_that_runs_into_a_bound_fails_loudly() -> None:
    case = _case()
    t = predict(case).metrics["step_time_mean_s"]
    # a "measurement" 1000x slower than any GPU could be: the GEMM efficiency runs into its floor
    runs = [MeasuredRun(label="absurd", case=case, step_time_s=1000 * t)]
    with pytest.raises(ValueError, match=r"gemm_eff_16 = .* at its bound"):
        fit_calibration(runs, name="x", params=["gemm_eff"])
    ok = fit_calibration(runs, name="x", params=["gemm_eff"], allow_pinned=True)
    assert ok.error["pinned_at_bound"]


def test_a_plausible_fit_is_not_pinned() -> None:
    case = _case()
    t = predict(case).metrics["step_time_mean_s"]
    fitted = fit_calibration([MeasuredRun(label="ok", case=case, step_time_s=1.2 * t)], name="x", params=["gemm_eff"])
    assert fitted.error["pinned_at_bound"] == []
    assert predict(case, fitted).metrics["step_time_mean_s"] == pytest.approx(1.2 * t, rel=0.02)


def test_interval_is_the_quantile_of_absolute_log_residuals() -> None:
    res = [math.log(x) for x in (0.9, 1.1, 1.05, 0.8, 1.3, 1.0, 0.95, 1.2, 0.7, 1.02)]
    w = interval_half_width(res, 0.8)
    inside = sum(abs(r) <= w for r in res)
    assert inside == 8
    with pytest.raises(ValueError):
        interval_half_width([])


def test_prediction_interval_comes_from_the_profile() -> None:
    case = _case()
    cal = Calibration(name="t", error={"interval_80_log": {"dense": math.log(1.2), "moe": math.log(1.5)}})
    pred = predict(case, cal)
    lo, hi = prediction_interval(pred) or (0.0, 0.0)
    v = pred.metrics["tokens_per_s"]
    assert lo == pytest.approx(v / 1.2) and hi == pytest.approx(v * 1.2)
    assert prediction_interval(predict(case, Calibration(name="bare"))) is None


def test_cpu_predictions_use_the_profiles_probe_not_this_host(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = HostProbe(matmul_flops=5e10, copy_bytes_per_s=4e9, threads=1, cores=2, method="t").to_dict()
    cal = Calibration(name="cpu", host_probes=[{**rec, "runs": 3, "how": "median"}])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    p1 = cpu_probe_for(1, cal)
    assert p1.matmul_flops == 5e10 and "profile" in p1.source
    # another thread count: the stored probe scaled per thread, still not a fresh probe of this host
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    p2 = cpu_probe_for(1, replace(cal))
    assert p2.threads == 2 and p2.matmul_flops == 1e11 and "scaled from 1 to 2" in p2.source
