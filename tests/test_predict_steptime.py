"""Step time responds to layout, schedule, placement and knobs the way the physics says."""

from __future__ import annotations

from dataclasses import replace

import pytest

from powertrain.hardware import get_device
from powertrain.predict import METRIC_NAMES, Case, predict
from powertrain.predict.calibration import Coefficients
from powertrain.predict.steptime import step_time

C = Coefficients()


def _llama(**kw: object) -> Case:
    base = dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256, seq_len=8192,
                tp=8, pp=4, dp=2, micro_batch=1, global_batch=128, sequence_parallel=True,
                device=get_device("h100-sxm"), nodes=8, devices_per_node=8)
    base.update(kw)
    return Case(**base)  # type: ignore[arg-type]


def t(case: Case) -> float:
    return step_time(case, C).total_s


def test_more_microbatches_shrink_the_bubble_share() -> None:
    few = step_time(_llama(global_batch=16), C)
    many = step_time(_llama(global_batch=128), C)
    assert few.breakdown["pp_bubble_s"] / few.total_s > many.breakdown["pp_bubble_s"] / many.total_s


def test_interleaving_divides_the_bubble() -> None:
    flat = step_time(_llama(global_batch=16), C)
    inter = step_time(_llama(global_batch=16, vp=4, pp_schedule="interleaved_1f1b"), C)
    assert inter.breakdown["pp_bubble_s"] == pytest.approx(flat.breakdown["pp_bubble_s"] / 4, rel=0.05)
    assert inter.total_s < flat.total_s


def test_tp_across_nodes_is_slower_than_inside_one() -> None:
    inside = _llama(tp=8, pp=4, dp=2)
    across = _llama(tp=16, pp=2, dp=2)  # TP group spans two 8-GPU nodes
    assert step_time(across, C).breakdown["tp_comm_exposed_s"] > 3 * step_time(inside, C).breakdown["tp_comm_exposed_s"]
    # an NVL72 domain keeps the same TP group on NVLink
    nvl = replace(across, device=get_device("gb200"), devices_per_node=4, nodes=16)
    assert step_time(nvl, C).breakdown["tp_comm_exposed_s"] < step_time(across, C).breakdown["tp_comm_exposed_s"]


def test_recompute_costs_time_and_overlap_saves_it() -> None:
    base = _llama()
    assert t(replace(base, recompute="full")) > t(replace(base, recompute="selective")) > t(base)
    assert t(replace(base, overlap_tp=True)) < t(base)
    dp_heavy = _llama(tp=1, pp=1, dp=64, layers=8, global_batch=64, overlap_dp=False)
    assert t(replace(dp_heavy, overlap_dp=True)) < t(dp_heavy)


def test_expert_parallel_all_to_all_crosses_nodes() -> None:
    moe = dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=32000, seq_len=4096, experts=8,
               top_k=2, tp=1, pp=1, dp=64, global_batch=128)
    near = _llama(**moe, ep=8)  # 8 consecutive ranks: one node
    far = _llama(**{**moe, "tp": 8, "dp": 8}, ep=8)  # stride 8: every peer on another node
    assert step_time(far, C).breakdown["ep_all_to_all_s"] > step_time(near, C).breakdown["ep_all_to_all_s"]
    assert t(replace(near, moe_imbalance=1.5)) > t(replace(near, moe_imbalance=1.0))


def test_power_limit_slows_compute() -> None:
    full = predict(_llama())
    capped = predict(_llama(power_limit_w=350))
    assert capped.metrics["step_time_mean_s"] > full.metrics["step_time_mean_s"]
    assert capped.metrics["power_peak_w"] <= 350 + 1e-6
    assert capped.breakdown["clock_factor_power_limit"] < 1


def test_prediction_has_every_metric_or_a_reason() -> None:
    p = predict(_llama())
    assert set(METRIC_NAMES) <= set(p.metrics)
    assert all(p.metrics[k] is not None or k in p.why_null for k in METRIC_NAMES)
    assert 0.2 < p.metrics["mfu"] < 0.7 and p.metrics["hfu"] >= p.metrics["mfu"]
    s = p.summary({"x": 1})
    assert s["kind"] == "prediction" and s["profile"] == "default" and s["model_error"]
