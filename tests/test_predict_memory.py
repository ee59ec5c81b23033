"""Memory per device: Korthikanti et al.'s activations, sharding of states, and the planner's fits()."""

from __future__ import annotations

from dataclasses import replace

import pytest

from powertrain.hardware import get_device
from powertrain.predict.case import Case
from powertrain.predict.memory import (
    activation_bytes_per_layer,
    fits,
    in_flight_microbatches,
    least_recompute_that_fits,
    memory_per_device,
    stage_layers,
)
from powertrain.spec.run import RunConfig


def _gpt_case(**kw: object) -> Case:
    base = dict(layers=96, hidden=12288, ffn=4 * 12288, heads=96, kv_heads=96, vocab=51200, seq_len=2048,
                gated=False, tp=8, pp=8, dp=4, micro_batch=1, global_batch=64,
                device=get_device("a100-sxm4-80gb"), devices_per_node=8)
    base.update(kw)
    return Case(**base)  # type: ignore[arg-type]


def test_activations_match_korthikanti_with_sequence_parallel() -> None:
    c = _gpt_case(sequence_parallel=True)
    sbh = c.seq_len * c.micro_batch * c.hidden
    # 34·s·b·h/t (their Eq. with SP; fused attention stores no s×s matrices)
    assert activation_bytes_per_layer(c) == pytest.approx(34 * sbh / c.tp)
    assert activation_bytes_per_layer(c, "full") == pytest.approx(2 * sbh / c.tp)
    no_sp = replace(c, sequence_parallel=False)
    assert activation_bytes_per_layer(no_sp) == pytest.approx(sbh * (10 + 24 / c.tp))


def test_gqa_and_swiglu_change_the_terms() -> None:
    mha = _gpt_case(gated=True)
    gqa = replace(mha, kv_heads=8)
    assert activation_bytes_per_layer(gqa) < activation_bytes_per_layer(mha)
    gelu = replace(mha, gated=False)
    assert activation_bytes_per_layer(gelu) < activation_bytes_per_layer(mha)


def test_pipeline_schedules_hold_different_microbatches() -> None:
    c = _gpt_case(global_batch=256)
    assert in_flight_microbatches(c) == c.pp
    assert in_flight_microbatches(replace(c, pp_schedule="gpipe")) == c.micro_batches
    inter = in_flight_microbatches(replace(c, vp=2, pp_schedule="interleaved_1f1b"))
    assert c.pp < inter < 2 * c.pp


def test_sharding_shrinks_states() -> None:
    ddp = _gpt_case(pp=4, dp=8)
    dist = replace(ddp, distributed_optimizer=True)
    fsdp = replace(ddp, fsdp=True)
    m_ddp, b_ddp = memory_per_device(ddp)
    m_dist, b_dist = memory_per_device(dist)
    m_fsdp, b_fsdp = memory_per_device(fsdp)
    assert b_dist["optimizer"] == pytest.approx(b_ddp["optimizer"] / 8)
    assert b_dist["weights"] == b_ddp["weights"]
    assert b_fsdp["weights"] < b_ddp["weights"] and m_fsdp < m_dist < m_ddp


def test_uneven_splits() -> None:
    assert stage_layers(_gpt_case(pp=4, layers=96, pp_split="study_uneven")) == [25, 23, 25, 23]
    assert stage_layers(_gpt_case(pp=2, layers=10, pp_split=[6, 4])) == [6, 4]
    with pytest.raises(ValueError, match="pp_split"):
        stage_layers(_gpt_case(pp=2, layers=10, pp_split=[6, 5]))


def test_fits_for_the_planner() -> None:
    ok = RunConfig(model="gpt3-175b", layout={"tp": 8, "pp": 4, "sequence_parallel": True},
                   knobs={"global_batch": 128, "recompute": "full", "precision": "bf16"},
                   hardware={"nodes": 4, "devices_per_node": 8, "device": "h200"})
    fit, need, bd = fits(ok)
    assert fit and 0 < need < bd["capacity_bytes"]
    assert set(bd) >= {"weights", "gradients", "optimizer", "activations", "overhead", "total"}
    one = RunConfig(model="gpt3-175b", knobs={"global_batch": 8, "precision": "bf16"},
                    hardware={"device": "h100-sxm"})
    fit, need, bd = fits(one)
    assert not fit and need > 1e12


def test_least_recompute_that_fits() -> None:
    big = _gpt_case(tp=8, pp=8, micro_batch=4, global_batch=256, sequence_parallel=False)
    assert least_recompute_that_fits(big) in ("selective", "full")
    small = _gpt_case(layers=4, hidden=1024, ffn=4096, heads=8, kv_heads=8, tp=1, pp=1, dp=1)
    assert least_recompute_that_fits(small) == "none"


def test_the_gpu_context_allowance_is_for_gpus_only() -> None:
    """A CPU "device" has no CUDA context or NCCL buffers: the fixed overhead is not added to it
    (the tiny CPU model once showed 2.4 GiB per device, all of it the GPU allowance)."""
    from powertrain.hardware import HostProbe, cpu_device
    from powertrain.predict.calibration import Coefficients
    from powertrain.predict.case import case_from_run_config

    cfg = RunConfig(model="llama3-tiny", knobs={"global_batch": 8, "precision": "fp32"},
                    hardware={"nodes": 1, "devices_per_node": 2, "device": "cpu"})
    probe = HostProbe(matmul_flops=1e11, copy_bytes_per_s=1e10, threads=1, cores=2, method="fixture")
    cpu = case_from_run_config(cfg, host_probe=probe)
    assert cpu.device.is_host_cpu and cpu_device(probe, 2).is_host_cpu
    c = Coefficients()
    total, bd = memory_per_device(cpu, c)
    subtotal = total - bd["overhead"]
    assert bd["overhead"] == pytest.approx(subtotal * (c.mem_fragmentation - 1))
    assert total < 0.2 * 2**30  # a few MiB of weights, states and activations
    gpu = case_from_run_config(cfg.model_copy(update={"hardware": cfg.hardware.model_copy(update={"device": "h100-sxm"})}))
    _, gpu_bd = memory_per_device(gpu, c)
    assert gpu_bd["overhead"] == pytest.approx(c.mem_overhead_bytes + subtotal * (c.mem_fragmentation - 1))
