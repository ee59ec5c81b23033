"""Bad configurations are rejected before any process starts, naming the rule and a fix."""

from __future__ import annotations

import pytest

from powertrain.spec.layout import Layout
from powertrain.spec.run import RunConfig
from powertrain.spec.validate import ConfigError, Violation, check, register_rule, validate


def cfg(model="llama3-tiny", world=2, **kw) -> RunConfig:
    layout = kw.pop("layout", {})
    knobs = kw.pop("knobs", {})
    return RunConfig(model=model, layout=layout, knobs=knobs,
                     hardware={"devices_per_node": world}, **kw)


def rules(c: RunConfig) -> set[str]:
    return {v.rule for v in validate(c)}


def test_valid_configs_pass():
    assert validate(cfg()) == []
    assert validate(cfg(world=4, layout={"tp": 2, "pp": 2}, knobs={"global_batch": 8})) == []
    assert validate(cfg("mixtral-8x7b-tiny", world=4, layout={"ep": 4}, knobs={"global_batch": 8})) == []


@pytest.mark.parametrize(("config", "rule", "fix_word"), [
    (cfg(world=3, layout={"tp": 2}), "world_size", "multiple of 2"),
    (cfg(world=4, layout={"dp": 1, "tp": 2}), "world_size", "omit layout.dp"),
    (cfg(world=4, layout={"tp": 4}), "kv_heads_divisible_by_tp", "divisors of 2"),
    (cfg("gpt3-tiny", world=3, layout={"tp": 3}), "heads_divisible_by_tp", "divisors of 8"),
    (cfg(world=8, layout={"pp": 8}, knobs={"global_batch": 8}), "layers_ge_stages", "≤ 4"),
    (cfg(world=2, layout={"pp": 2, "virtual_stages": 4, "pp_schedule": "interleaved_1f1b"}), "layers_ge_stages", "≤ 4"),
    (cfg("mixtral-8x7b-tiny", world=3, layout={"ep": 3}, knobs={"global_batch": 6}), "experts_divisible_by_ep", "divisors of 8"),
    (cfg("mixtral-8x7b-tiny", world=4, layout={"tp": 2, "ep": 4}), "ep_divides_dp", "divisors of 2"),
    (cfg("gpt3-tiny", layout={"ep": 2}), "ep_needs_moe", "ep: 1"),
    (cfg(knobs={"global_batch": 6, "micro_batch": 2}), "global_batch_divisible", "multiple of 4"),
    (cfg(world=2, layout={"pp": 2}, knobs={"global_batch": 2, "micro_batch": 2}), "pipeline_microbatches", "gpipe"),
    (cfg(world=2, layout={"pp": 2, "pp_schedule": "interleaved_1f1b", "virtual_stages": 2},
         knobs={"global_batch": 3}), "pipeline_microbatches", "multiple of 2"),
    (cfg(world=2, layout={"pp": 2, "virtual_stages": 2}), "virtual_stages_need_interleaved", "interleaved_1f1b"),
    (cfg(world=2, layout={"pp": 2, "pp_split": [1, 2]}), "stage_split", "pp_split"),
    (cfg(world=1, layout={"sequence_parallel": True}), "sequence_parallel_needs_tp", "tp > 1"),
    (cfg(world=2, layout={"cp": 2}), "context_parallel_unsupported", "cp: 1"),
    (cfg("mixtral-8x7b-tiny", layout={"ep": 2, "fsdp": True}), "fsdp_with_ep", "fsdp: false"),
    (cfg("mixtral-8x7b-tiny", world=4, layout={"tp": 2, "ep": 4, "etp": 2}), "ep_etp_divides_stage", "divisors of 4"),
    (cfg("mixtral-8x7b-tiny", world=4, layout={"tp": 2, "ep": 4, "etp": 1}), "expert_tp_unsupported", "drop layout.etp"),
    (cfg(layout={"etp": 1}), "ep_needs_moe", "drop layout.etp"),
    (cfg(knobs={"precision": "fp8"}), "low_precision_unsupported", "bf16"),
    (cfg(knobs={"precision": "bf16", "fp8_recipe": "mxfp8"}), "recipe_needs_fp8", "precision: fp8"),
])
def test_each_rule_names_itself_and_a_fix(config, rule, fix_word):
    found = [v for v in validate(config) if v.rule == rule]
    assert found, f"expected rule {rule}, got {validate(config)}"
    assert fix_word in found[0].fix
    with pytest.raises(ConfigError, match=rule):
        check(config)


def test_parallel_folding_lets_ep_span_tensor_parallel_ranks():
    # EP4 on TP2·DP2 fits no data-parallel group, but folded (etp 1) the 4 ranks of a stage hold it: a layout
    # Megatron-Core runs, so only the built-in trainer's own limit is left
    from powertrain.spec.validate import TRAINER_ONLY_RULES, layout_violations

    unfolded = cfg("mixtral-8x7b-tiny", world=4, layout={"tp": 2, "ep": 4})
    folded = cfg("mixtral-8x7b-tiny", world=4, layout={"tp": 2, "ep": 4, "etp": 1})
    assert "ep_divides_dp" in {v.rule for v in layout_violations(unfolded)}
    assert rules(folded) == {"expert_tp_unsupported"} and "expert_tp_unsupported" in TRAINER_ONLY_RULES
    assert layout_violations(folded) == []
    assert folded.layout.resolve(4).label() == "DP2·TP2·EP4·ETP1"


def test_several_violations_are_all_reported():
    c = cfg(world=3, layout={"tp": 4}, knobs={"global_batch": 5})
    assert {"world_size", "kv_heads_divisible_by_tp"} <= rules(c)


def test_stage_split_counts():
    assert Layout(pp=2).stage_layer_counts(5) == [3, 2]
    assert Layout(pp=4, pp_split="study_uneven").stage_layer_counts(8) == [3, 1, 3, 1]
    assert Layout(pp=2, virtual_stages=2, pp_schedule="interleaved_1f1b").stage_layer_counts(4) == [1, 1, 1, 1]
    assert Layout(pp=2, pp_split=[1, 3]).stage_layer_counts(4) == [1, 3]


def test_extra_rule_plugs_in():
    def too_big(c: RunConfig) -> list[Violation]:
        return [Violation("memory_fit", "does not fit", "shrink it")] if c.model.hidden > 200 else []

    register_rule(too_big)
    try:
        assert "memory_fit" in rules(cfg())
        assert "memory_fit" not in rules(cfg("mixtral-8x7b-tiny"))
    finally:
        from powertrain.spec import validate as v
        v._EXTRA_RULES.remove(too_big)


def test_example_run_specs_are_valid():
    from pathlib import Path

    from powertrain.spec.run import load_run_config

    specs = sorted(Path(__file__).parent.parent.glob("examples/run-*.yaml"))
    assert specs
    for spec in specs:
        assert validate(load_run_config(spec)) == [] or spec.name == "run-llama-text.yaml", spec


def test_explicit_split_is_checked_without_pipeline_too():
    # found by the planner fuzz test: an empty split passed validation and crashed the memory model
    from powertrain.spec.run import RunConfig
    from powertrain.spec.validate import validate

    cfg = RunConfig(model="gpt3-tiny", layout={"pp_split": []})
    assert [v.rule for v in validate(cfg)] == ["stage_split"]
    assert validate(RunConfig(model="gpt3-tiny", layout={"pp_split": [4]})) == []
