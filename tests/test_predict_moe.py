"""Modern MoE and attention: folding, shared-expert width, dense layers, MLA, MTP, routing traffic."""

from __future__ import annotations

from dataclasses import replace

import pytest

from powertrain.core.flops import model_flops_per_token, parameter_counts
from powertrain.hardware import get_device
from powertrain.predict import Case, moe, predict
from powertrain.predict.calibration import Coefficients
from powertrain.spec.model import architecture_details

C = Coefficients()


def _dsv3(**kw: object) -> Case:
    base = dict(layers=61, hidden=7168, ffn=18432, heads=128, kv_heads=128, vocab=129280, seq_len=4096,
                experts=256, top_k=8, moe_ffn=2048, shared_experts=1, tp=2, pp=8, dp=64, ep=64, etp=1,
                micro_batch=1, global_batch=8192, sequence_parallel=True, precision="fp8", recipe="blockwise",
                device=get_device("h100-sxm"), devices_per_node=8)
    base.update(kw)
    return replace(Case(**base), **architecture_details("DeepSeek-V3"))  # type: ignore[arg-type]


def test_deepseek_v3_parameters_and_flops_match_its_published_size() -> None:
    case = _dsv3()
    p = parameter_counts(case)
    total = sum(p.values())
    # 671 B total parameters (incl. the 14 B MTP module), 37 B activated
    assert total == pytest.approx(671e9, rel=0.03)
    assert p["mlp"] < 0.05 * total  # shared experts at 2048, not the dense 18432
    flops = model_flops_per_token(case)
    # 6 × 37 B activated + the full-sequence attention core (heads × (192 + 128) per token per layer)
    assert flops == pytest.approx(6 * 37.5e9 + 3 * 2 * 4096 * 128 * 320 * 61, rel=0.05)


def test_folding_puts_ep_groups_on_consecutive_ranks() -> None:
    folded = _dsv3()
    legacy = replace(folded, etp=None)
    assert moe.ep_stride(folded) == 1
    assert moe.ep_stride(legacy) == 2
    # expert replicas: 2·64 ranks per stage ÷ (etp·ep) = 2 with folding
    assert moe.expert_dp(folded) == (64, 2)


def test_tokens_per_expert_grow_with_ep_and_etp() -> None:
    case = _dsv3()
    n = 4096
    assert moe.tokens_per_expert(case, n) == pytest.approx(n * 64 * 1 * 8 / (2 * 256))
    assert moe.tokens_per_expert(replace(case, etp=2), n) == 2 * moe.tokens_per_expert(case, n)


def test_capacity_factor_caps_the_load_and_dropless_uses_the_imbalance() -> None:
    case = _dsv3()
    assert moe.routed_load(case, C) == C.moe_imbalance
    assert moe.routed_load(replace(case, capacity_factor=1.0), C) == 1.0


def test_routing_traffic_scales_with_top_k_and_hidden() -> None:
    case = _dsv3()
    b8 = moe.routing_bytes(case, C, 2.0, 4096)
    b4 = moe.routing_bytes(replace(case, top_k=4), C, 2.0, 4096)
    assert 1.8 < b8 / b4 < 2.05


def test_dense_first_layers_and_mtp_change_the_step() -> None:
    case = _dsv3(global_batch=1024)
    base = predict(case).metrics["step_time_mean_s"]
    no_mtp = predict(replace(case, mtp_layers=0)).metrics["step_time_mean_s"]
    assert no_mtp < base
    no_dense = predict(replace(case, dense_layers=0)).metrics["step_time_mean_s"]
    assert no_dense != base


def test_published_records_get_the_architecture_by_name() -> None:
    from powertrain.predict.published import load_published

    runs = [r for r in load_published() if r.case is not None and "Qwen3-30B" in str(r.raw and r.raw["model"]["name"])]
    assert runs and all(r.case.head_dim == 128 for r in runs if r.case)
    assert {r.case.recipe for r in runs if r.case} >= {"mxfp8", "current"}


def test_model_names_match_as_people_write_them() -> None:
    assert architecture_details("DeepSeek V3 (671B)")["kv_lora_rank"] == 512
    assert architecture_details("deepseek_v2_lite")["dense_layers"] == 1
    assert architecture_details("Qwen3 30B-A3B") == {"head_dim": 128}
    assert architecture_details("Llama-3.1 405B") == {}


def test_memory_places_experts_as_the_step_time_does() -> None:
    # one placement for both: experts split over etp·ep ranks, replicated over the expert-data-parallel rest
    from powertrain.predict.memory import memory_per_device
    from powertrain.predict.steptime import local_parameters

    folded, split, older = _dsv3(etp=1, ep=32), _dsv3(etp=2, ep=32), _dsv3(etp=None, ep=32)
    assert memory_per_device(split)[0] == memory_per_device(older)[0]  # etp = tp is the older placement
    w_folded, w_split = memory_per_device(folded)[1]["weights"], memory_per_device(split)[1]["weights"]
    assert w_folded > w_split  # EP32 over 128 stage ranks at etp 1 holds each expert on 32 ranks, not 64
    assert local_parameters(folded, folded).expert == pytest.approx(2 * local_parameters(split, split).expert)


def test_a_spec_states_parallel_folding_and_an_ep_that_fits_no_group_is_refused() -> None:
    # EP8 on TP8·DP2: no data-parallel group holds 8 ranks; folded (etp 1) the 16 ranks of the stage do
    from powertrain.spec.run import RunConfig

    base = dict(model="mixtral-8x22b", knobs={"micro_batch": 1, "global_batch": 256},
                hardware={"nodes": 2, "devices_per_node": 8, "device": "h100"})
    with pytest.raises(ValueError, match="ep_divides_dp"):
        predict(RunConfig(layout={"tp": 8, "ep": 8}, **base))
    folded = predict(RunConfig(layout={"tp": 8, "ep": 8, "etp": 1}, **base))
    split = predict(RunConfig(layout={"tp": 8, "ep": 8, "etp": 2}, **base))
    assert folded.breakdown["layout"]["etp"] == 1 and split.breakdown["layout"]["etp"] == 2
    assert folded.metrics["mem_per_device_bytes"] > split.metrics["mem_per_device_bytes"]  # each expert on 8 ranks, not 16


def test_public_models_plan_from_a_spec_as_their_published_runs_read() -> None:
    # the spec catalog's DeepSeek-V3 is the model the published-run reader builds: MLA, 1 shared expert of
    # 2048, 3 dense layers of 18432, 1 MTP module — predicted, and refused only by the built-in trainer
    from powertrain.predict.case import case_from_run_config
    from powertrain.spec.run import RunConfig
    from powertrain.spec.validate import layout_violations, validate

    cfg = RunConfig(model="deepseek-v3", layout={"tp": 2, "pp": 8, "ep": 64, "etp": 1},
                    knobs={"micro_batch": 1, "global_batch": 8192},
                    hardware={"nodes": 128, "devices_per_node": 8, "device": "h100"})
    spec, published = case_from_run_config(cfg), _dsv3()
    for f in ("layers", "hidden", "ffn", "expert_ffn", "heads", "kv_heads", "vocab", "experts", "top_k", "head_dim",
              "shared_width", "dense_layers", "q_lora_rank", "kv_lora_rank", "qk_rope_dim", "v_head_dim", "mtp_layers"):
        assert getattr(spec, f) == getattr(published, f), f
    assert sum(parameter_counts(spec).values()) == pytest.approx(671e9, rel=0.03)
    assert {"model_architecture_unsupported", "expert_tp_unsupported"} <= {v.rule for v in validate(cfg)}
    assert layout_violations(cfg) == [] and predict(cfg).metrics["tokens_per_s"] > 0
    qwen = RunConfig(model="qwen3-30b-a3b", layout={"ep": 8}, knobs={"micro_batch": 1, "global_batch": 64},
                     hardware={"devices_per_node": 8, "device": "h100"})
    p = parameter_counts(case_from_run_config(qwen))
    assert sum(p.values()) == pytest.approx(30.5e9, rel=0.03)  # Qwen3-30B-A3B: 30.5 B total
