"""Every knob the predictor accepts changes what it predicts, or is refused: the settings an audit found
accepted and then ignored (tied embeddings, FSDP resharding, the DDP bucket, clock locks, a published
record's stated sequence parallelism, misspelt schedule/precision/recipe names)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from powertrain.hardware import get_device
from powertrain.predict import Case, predict
from powertrain.predict.calibration import load_calibration
from powertrain.predict.steptime import step_time
from powertrain.spec.run import RunConfig

H100 = get_device("h100-sxm")
LLAMA8B = dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256, seq_len=8192, micro_batch=1,
               device=H100, devices_per_node=8)


def test_tied_embeddings_hold_one_vocab_matrix_fewer_in_memory_and_in_the_gradient_reduction() -> None:
    c = load_calibration("default").coefficients
    base = Case(**LLAMA8B, dp=8, global_batch=64, overlap_dp=False)
    untied, tied = predict(base), predict(replace(base, tied_embeddings=True))
    # weights (2 B), fp32 gradients (4 B), Adam moments and master copy (12 B): 18 B per parameter at pp = 1
    saved = base.vocab * base.hidden * 18
    assert untied.metrics["mem_per_device_bytes"] - tied.metrics["mem_per_device_bytes"] == pytest.approx(saved, rel=0.05)
    assert step_time(replace(base, tied_embeddings=True), c).breakdown["dp_comm_exposed_s"] < \
        step_time(base, c).breakdown["dp_comm_exposed_s"]


def test_fsdp_without_resharding_keeps_the_layers_gathered_and_skips_the_backward_gather() -> None:
    c = load_calibration("default").coefficients
    base = Case(**LLAMA8B, dp=16, global_batch=64, fsdp=True, overlap_fsdp=False)  # gathers exposed
    kept = replace(base, fsdp_reshard=False)
    assert predict(kept).metrics["mem_per_device_bytes"] > predict(base).metrics["mem_per_device_bytes"] + 5 * 2**30
    assert step_time(kept, c).breakdown["fsdp_comm_exposed_s"] < step_time(base, c).breakdown["fsdp_comm_exposed_s"]


def test_a_larger_ddp_bucket_leaves_more_of_the_gradient_reduction_exposed() -> None:
    c = load_calibration("default").coefficients
    base = Case(**LLAMA8B, dp=16, global_batch=16)
    small, whole = replace(base, dp_bucket_params=6.5e6), replace(base, dp_bucket_params=1e10)
    assert step_time(small, c).breakdown["dp_comm_exposed_s"] < step_time(whole, c).breakdown["dp_comm_exposed_s"]


def _spec(device: str = "h100-sxm", **knobs: object) -> RunConfig:
    return RunConfig.model_validate({
        "name": "k", "model": "llama3-8b", "hardware": {"device": device, "nodes": 2, "devices_per_node": 8},
        "layout": {"fsdp": True}, "knobs": {"micro_batch": 1, "global_batch": 64, **knobs}})


def test_a_run_specs_fsdp_and_bucket_knobs_reach_the_prediction() -> None:
    base = predict(_spec())
    kept = predict(_spec(overlap={"fsdp_reshard_after_forward": False}))
    assert kept.metrics["mem_per_device_bytes"] > base.metrics["mem_per_device_bytes"]
    from powertrain.predict import case_from_run_config

    # PyTorch DDP's bucket_cap_mb is MiB of the trainer's fp32 gradients
    assert case_from_run_config(_spec(overlap={"ddp_bucket_mb": 100.0})).dp_bucket_params == 100 * 2**20 / 4


def test_an_sm_clock_lock_slows_compute_and_lowers_power_by_the_devices_clock_range() -> None:
    free = predict(_spec())
    locked = predict(_spec(sm_clock_mhz=[1200, 1200]))  # h100-sxm tops at 1980 MHz: 61 % of its clock
    assert locked.metrics["step_time_mean_s"] > free.metrics["step_time_mean_s"] * 1.2
    assert locked.metrics["power_mean_w"] < free.metrics["power_mean_w"] * 0.8
    # a lock at or above the maximum, or a range whose top is the maximum, changes nothing
    assert predict(_spec(sm_clock_mhz=[900, 1980])).metrics == free.metrics
    # under a power limit that already holds the clock lower, a higher lock changes nothing either
    capped = predict(_spec(power_limit_w=300))
    assert predict(_spec(power_limit_w=300, sm_clock_mhz=[1900, 1900])).metrics == capped.metrics


def test_a_lock_the_catalog_cannot_turn_into_a_ratio_and_a_memory_clock_lock_are_refused() -> None:
    spec = _spec("b200", sm_clock_mhz=[1500, 1500])  # no max_sm_clock_mhz in the catalog
    with pytest.raises(ValueError, match=r"knobs\.sm_clock_mhz: the catalog does not know b200's maximum SM clock.*max_sm_clock_mhz"):
        predict(spec)
    with pytest.raises(ValueError, match=r"knobs\.mem_clock_mhz: predict models SM clock locks and power limits"):
        predict(_spec(mem_clock_mhz=1593))


@pytest.mark.parametrize(("field", "value", "says"), [
    ("pp_schedule", "GPipe", r"pp_schedule 'GPipe': use one of gpipe, 1f1b, interleaved_1f1b"),
    ("precision", "FP8", r"precision 'FP8': use one of fp32"),
    ("recipe", "mx-fp8", r"recipe 'mx-fp8' does not apply to precision bf16"),
])
def test_a_misspelt_schedule_precision_or_recipe_is_refused_not_read_as_the_default(field: str, value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Case(**LLAMA8B, dp=8, global_batch=8, **{field: value})
    with pytest.raises(ValueError, match=r"recipe 'mxfp8' does not apply to precision fp4"):
        Case(**LLAMA8B, dp=8, global_batch=8, precision="fp4", recipe="mxfp8")
    Case(**LLAMA8B, dp=8, global_batch=8, precision="fp8", recipe="mxfp8")  # a known pair is fine


def test_a_published_record_that_states_no_sequence_parallelism_is_read_as_stated() -> None:
    from powertrain.predict.published import run_from_entry

    entry = {"id": "sp-off", "framework": "NeMo 2.0", "source": {"ref": "t"}, "task": "pretrain", "precision": "bf16",
             "model": {"name": "llama", "arch": "dense", "layers": 80, "hidden": 8192, "ffn": 28672, "heads": 64,
                       "kv_heads": 8, "vocab": 32000, "seq_len": 4096, "activation": "swiglu"},
             "hardware": {"gpu": "H100", "count": 8, "gpus_per_node": 8},
             "parallel": {"tp": 2, "pp": 1, "cp": 1, "dp": 4, "sequence_parallel": False},
             "batch": {"micro": 1, "global": 8}, "measured": {"tokens_per_s_per_gpu": 1000}}
    assert run_from_entry(entry).case.sequence_parallel is False
    entry["parallel"].pop("sequence_parallel")
    unstated = run_from_entry(entry)
    assert unstated.case.sequence_parallel is True
    assert any("sequence parallelism not published" in a for a in unstated.assumptions)


def test_min_measured_s_extends_the_predicted_window_as_the_trainer_extends_the_measured_one() -> None:
    short = predict(_spec())
    t = short.metrics["step_time_mean_s"]
    spec = _spec().model_copy(update={"protocol": _spec().protocol.model_copy(update={"min_measured_s": 10 * t + 0.5})})
    long = predict(spec)
    steps = long.window["measured_steps"]
    assert steps == 11 > short.window["measured_steps"]
    assert long.metrics["energy_j"] == pytest.approx(short.metrics["energy_per_step_j"] * steps)
