"""LoRA in the cost model: adapter counts and FLOPs (core.lora, core.flops), memory, step time, the optimizer
and the data-parallel reduction of the adapters alone (predict.lora), and what published runs state."""

from __future__ import annotations

from dataclasses import replace

import pytest

from powertrain.core import flops
from powertrain.core.lora import Lora, adapter_parameters, layer_adapters
from powertrain.hardware import get_device
from powertrain.predict import Case, predict
from powertrain.predict.calibration import Coefficients
from powertrain.predict.lora import adapter_forward_time, adapter_parameters_on, adapter_tp_time
from powertrain.predict.memory import memory_per_device
from powertrain.predict.published import read_lora
from powertrain.predict.steptime import (
    compute_rates,
    data_parallel_time,
    layer_time,
    local_parameters,
    optimizer_time,
    step_time,
)
from powertrain.spec.model import get_model

C = Coefficients()
MLPERF = Lora(16, ("qkv_proj", "o_proj"))


def _llama70(**kw: object) -> Case:
    """MLPerf's Llama-2-70B LoRA shape on 8 H100s (TP1 unless told)."""
    base = dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=32000, seq_len=8192,
                tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, precision="bf16", recompute="full",
                device=get_device("h100-sxm"), devices_per_node=8)
    base.update(kw)
    return Case(**base)  # type: ignore[arg-type]


def _lora(case: Case, lora: Lora = MLPERF) -> Case:
    return replace(case, lora_rank=lora.rank, lora_targets=lora.targets)


def test_adapter_counts_are_rank_times_each_maps_sides():
    s = flops.shape_of(get_model("llama3-70b"))
    # fused QKV: d_out (64 + 2·8)·128 = 10240; the output projection 8192 → 8192
    assert [(a.target, a.d_in, a.d_out, a.row_parallel) for a in layer_adapters(s, MLPERF.targets)] == [
        ("qkv_proj", 8192, 10240, False), ("o_proj", 8192, 8192, True)]
    assert adapter_parameters(s, MLPERF) == {"dense": 80 * 16 * (8192 + 10240 + 8192 + 8192), "experts": 0.0}
    moe = flops.shape_of(get_model("mixtral-8x7b"))  # an MLP target adapts each of the 8 experts
    up = adapter_parameters(moe, Lora(8, ("up_proj",)))
    assert up == {"dense": 0.0, "experts": 32 * 8 * 8 * (4096 + 14336)}


def test_lora_model_flops_count_no_weight_gradients_of_frozen_layers():
    m = get_model("llama3-70b")
    s, sl = flops.shape_of(m), flops.shape_of(m, lora=MLPERF)
    p = flops.parameter_counts(m)
    frozen_gemm = 2 * (p["attention"] + p["mlp"] + p["head"])  # forward FLOPs per token of the frozen GEMMs
    adapters = 2 * adapter_parameters(s, MLPERF)["dense"]
    # full training does forward + activation + weight gradients (3×); LoRA drops the frozen weight gradients
    # and adds the adapters' three passes
    assert flops.model_flops_per_token(sl) == pytest.approx(flops.model_flops_per_token(s) - frozen_gemm + 3 * adapters)
    assert flops.recompute_flops_per_token(sl, "full") == pytest.approx(
        flops.recompute_flops_per_token(s, "full") + adapters)
    case = _lora(_llama70())
    out = predict(case)  # the prediction's MFU divides the LoRA step's own work
    assert out.metrics["model_flops_per_step"] == pytest.approx(flops.model_flops_per_step(
        flops.shape_of(_llama70(), lora=MLPERF), 8))
    assert out.metrics["model_flops_per_step"] < flops.model_flops_per_step(flops.shape_of(_llama70()), 8)


def test_memory_holds_frozen_weights_once_and_states_for_the_adapters_alone():
    full, lora = _llama70(), _lora(_llama70())
    _, bf = memory_per_device(full, C)
    _, bl = memory_per_device(lora, C)
    a_dense, _ = adapter_parameters_on(lora, 80)
    assert bl["gradients"] == pytest.approx(4 * a_dense) and bl["optimizer"] == pytest.approx(12 * a_dense)
    assert bl["weights"] == pytest.approx(bf["weights"] + 2 * a_dense)  # 16-bit base, once, plus the adapters
    assert bl["total"] < bf["total"] / 2
    fsdp = _lora(_llama70(fsdp=True))
    _, bfs = memory_per_device(fsdp, C)
    assert bfs["weights"] == pytest.approx(bl["weights"] / 8)  # FSDP shards the frozen base over dp …
    assert bfs["fsdp_gathered"] > 0  # … and still gathers each layer for both passes


def test_a_lora_layers_backward_drops_the_frozen_weight_gradients_and_adds_the_adapters():
    # the adapters are thin GEMMs bound by their input and output traffic, which TP splits less than the
    # base's work (A of a column-parallel layer reads the whole input), plus their own collectives
    for kw, most in (({}, 0.1), ({"tp": 8, "dp": 1, "sequence_parallel": True}, 0.5)):
        full = _llama70(**kw)
        lora = _lora(full)
        r = compute_rates(full, C)
        lf = flops.layer_flops_per_token(flops.shape_of(full))
        a, b = layer_time(full, C, r, lf), layer_time(lora, C, r, lf)
        assert b.forward == pytest.approx(a.forward)  # the adapters are carried in the backward
        weight_grads = a.compute_f - a.attention_f
        adapters = 3 * adapter_forward_time(lora, C, r) + adapter_tp_time(lora, C, r)
        assert b.backward == pytest.approx(a.backward - weight_grads + adapters)
        assert 0 < adapters < most * weight_grads
    assert adapter_tp_time(_lora(_llama70()), C, compute_rates(_llama70(), C)) == 0.0  # no TP, no collectives


def test_optimizer_and_data_parallel_work_cover_the_adapters_alone():
    full = _llama70(recompute="none", overlap_dp=False)
    lora = _lora(full)
    sh = flops.shape_of(full)
    params, r = local_parameters(full, sh), compute_rates(full, C)
    a_dense, _ = adapter_parameters_on(lora, 80)
    assert optimizer_time(lora, params, r) == pytest.approx(optimizer_time(full, params, r) * a_dense / params.dense)
    dp_full, _ = data_parallel_time(full, C, params, 1.0)
    dp_lora, _ = data_parallel_time(lora, C, params, 1.0)
    assert 0 < dp_lora < dp_full / 100  # the adapters' gradients are reduced, not none
    fsdp_full = data_parallel_time(replace(full, fsdp=True), C, params, 1.0)[1]
    fsdp_lora = data_parallel_time(replace(lora, fsdp=True), C, params, 1.0)[1]
    assert 0 < fsdp_lora < fsdp_full  # the frozen weights are still gathered; only the adapters reduced
    assert step_time(lora, C).total_s < step_time(full, C).total_s
    bigger = _lora(full, Lora(1024, ("qkv_proj", "o_proj", "gate_proj", "up_proj", "down_proj")))
    assert step_time(bigger, C).total_s > step_time(lora, C).total_s


def test_a_case_states_rank_and_targets_together():
    assert not _llama70().lora and _lora(_llama70()).lora
    with pytest.raises(ValueError, match="give a rank ≥ 1 and its targets"):
        _llama70(lora_rank=16)
    with pytest.raises(ValueError, match="unknown LoRA target 'linear_qkv'"):
        _llama70(lora_rank=16, lora_targets=("linear_qkv",))


def test_a_spec_task_reaches_the_case():
    from powertrain.predict.case import case_from_run_config
    from powertrain.spec.run import RunConfig

    cfg = RunConfig.model_validate({"model": "llama3-70b", "hardware": {"device": "h100-sxm", "devices_per_node": 8},
                                    "task": {"kind": "lora", "rank": 8, "targets": ["qkv_proj", "o_proj"]}})
    case = case_from_run_config(cfg)
    assert (case.lora_rank, case.lora_targets) == (8, ("qkv_proj", "o_proj"))
    assert not case_from_run_config(cfg.model_copy(update={"task": type(cfg.task)()})).lora


def test_published_runs_state_rank_and_targets_or_say_what_is_assumed():
    stated = {"task": {"kind": "lora", "rank": 8, "targets": "linear_qkv, linear_fc1"}}
    assert read_lora(stated) == (8, ("qkv_proj", "gate_proj", "up_proj"), [])
    from_caveats = {"task": "lora", "caveats": [
        "LoRA fine-tuning (MLCommons llama2_70b_lora): frozen Llama-2-70B base, rank 16, alpha 32",
        "rank 0 log read; LoRA target modules: attention (linear_qkv and linear_proj adapters)"]}
    rank, targets, notes = read_lora(from_caveats)
    assert (rank, targets) == (16, ("qkv_proj", "o_proj")) and all("read from the caveats" in n for n in notes)
    rank, targets, notes = read_lora({"task": "lora", "caveats": ["rank 0 wrote the log"]})
    assert (rank, targets) == (16, ("qkv_proj", "o_proj")) and all("assumed" in n for n in notes)
    assert read_lora({"task": "pretrain"}) == (0, (), [])
