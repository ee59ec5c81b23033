"""The study's matrices predict whole, and the cluster figure is written for a report to embed."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from powertrain.predict import write_prediction
from powertrain.predict.figures import plot_cluster_comparison
from powertrain.predict.study import predict_study, study_configs
from powertrain.store import RunDir


def test_matrices_cover_both_clusters_and_all_models() -> None:
    cfgs = list(study_configs())
    per = Counter((c.name.split("/")[0], c.model.name) for c in cfgs)
    assert {cl for cl, _ in per} == {"32xH200", "64xH100"}
    assert {m for _, m in per} == {"gpt3-175b", "llama3-70b", "mixtral-8x7b", "mixtral-8x22b"}
    assert all(c.knobs.global_batch % (c.knobs.micro_batch * c.layout.dp) == 0 for c in cfgs)
    assert {c.hardware.world for c in cfgs} == {32, 64}


def test_study_predictions_and_figure(tmp_path) -> None:
    pts = predict_study()
    assert len(pts) == len(list(study_configs()))
    fitting = [p for p in pts if p.prediction.fits]
    assert len(fitting) > len(pts) / 2
    # a bigger micro-batch never needs less memory
    by = {(p.cluster, p.model, p.label.rsplit("/", 1)[0], p.config.knobs.micro_batch): p for p in pts}
    for (cl, m, lab, mb), p in by.items():
        if (cl, m, lab, mb * 2) in by:
            assert by[(cl, m, lab, mb * 2)].prediction.metrics["mem_per_device_bytes"] >= \
                p.prediction.metrics["mem_per_device_bytes"]
    paths = plot_cluster_comparison(pts, tmp_path / "clusters")
    assert [p.suffix for p in paths] == [".png", ".svg"] and all(p.stat().st_size > 1000 for p in paths)
    svg = paths[1].read_text()
    assert "predicted" in svg
    # the study's physics row: peak power against micro-batch, per-slot temperature and throttling
    assert "vs micro-batch" in svg and "°C per slot" in svg and "power-capped" in svg and "link utilisation" in svg


def test_write_prediction_makes_a_run_directory(tmp_path) -> None:
    cfg = next(iter(study_configs("64xH100")))
    rd = write_prediction(tmp_path / "run", cfg)
    info = RunDir(rd.path).read()
    assert info["kind"] == "prediction" and info["status"] == "ok" and info["config"]["name"] == cfg.name
    summ = json.loads(rd.summary_json.read_text())
    assert summ["kind"] == "prediction" and summ["config"]["hardware"]["device"] == "h100-sxm"
    assert summ["metrics"]["tokens_per_s"] > 0 and "memory" in summ["breakdown"]


def test_study_slots_differ_and_their_spread_is_the_fitted_one() -> None:
    """Per-slot temperatures of the study's nodes spread as the slot ratios fitted on real 8×H100 logs say."""
    from powertrain.hardware import get_device
    from powertrain.predict.slot_thermal import slot_ratios

    pts = [p for p in predict_study("default", "32xH200") if p.prediction.fits][:20]
    assert pts
    for p in pts:
        slots = p.prediction.breakdown["slots"]
        hottest = max(slots, key=lambda s: s["end_c"])
        assert p.prediction.metrics["hottest_slot"] == hottest["slot"]
        dev = p.config.hardware.device
        ratios = slot_ratios(get_device(dev), 8)[:4]
        r = get_device(dev).thermal.r_c_per_w
        by_node: dict[int, list[dict]] = {}
        for s in slots:
            by_node.setdefault(s["first_node"], []).append(s)
        for node in by_node.values():
            assert [s["slot"] for s in node] == [f"gpu{i}" for i in range(8)]
            front = node[:4]
            if len({s["stage"] for s in front}) == 1:  # one stage kind in the front row: the spread is the fitted one
                w = front[0]["power_w"] / ratios[0]
                spread = max(s["steady_c"] for s in front) - min(s["steady_c"] for s in front)
                assert spread == pytest.approx(r * w * (max(ratios) - min(ratios)), rel=1e-6)
