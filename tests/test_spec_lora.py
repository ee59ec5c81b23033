"""The spec's ``task:`` section: LoRA's fields, their defaults and refusals, sweeps over them, and what
``powertrain plan`` / ``run --check`` show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from rich.console import Console
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.cli.plan import load_and_plan, print_plan
from powertrain.plan.planner import plan
from powertrain.plan.sweep_spec import SweepSpec, expand
from powertrain.spec.run import RunConfig, Task, load_run_config
from powertrain.spec.validate import layout_violations, validate

EXAMPLE = Path(__file__).parents[1] / "examples" / "run-llama-lora-dp2.yaml"
TINY = {"family": "llama", "layers": 2, "hidden": 32, "ffn": 64, "heads": 4, "kv_heads": 2, "vocab": 128, "seq_len": 16}
MOE = {**TINY, "family": "mixtral", "experts": 4, "top_k": 2}


def rules(**over: object) -> set[str]:
    return {v.rule for v in validate(RunConfig.model_validate({"model": TINY, **over}))}


def test_pretrain_is_the_default_and_lora_fills_its_fields():
    assert RunConfig(model="llama3-tiny").task == Task() and not Task().is_lora and Task().lora() is None
    t = Task(kind="lora")
    assert (t.rank, t.alpha, t.targets) == (16, 32.0, ["q_proj", "k_proj", "v_proj", "o_proj"])
    assert t.label() == "LoRA r16 α32 q_proj,k_proj,v_proj,o_proj"
    again = RunConfig.model_validate_json(RunConfig(model="llama3-tiny", task=t).model_dump_json())
    assert again.task == t  # run.json records what ran, and reads back the same


@pytest.mark.parametrize(("task", "message"), [
    ({"rank": 8}, "task.rank set but task.kind is pretrain, which trains every weight and reads no LoRA field: set "
                  "task.kind: lora, or drop rank"),
    ({"kind": "lora", "targets": []}, "LoRA targets are empty: list at least one of q_proj"),
    ({"kind": "lora", "targets": ["wq"]}, "unknown LoRA target 'wq': use q_proj, k_proj"),
    ({"kind": "lora", "targets": ["q_proj", "q_proj"]}, "name a layer twice"),
    ({"kind": "lora", "targets": ["qkv_proj", "v_proj"]}, "qkv_proj (one adapter on the fused Q/K/V projection) "
                                                         "overlaps v_proj"),
    ({"kind": "lora", "rank": 0}, "greater than or equal to 1"),
    ({"kind": "lora", "alpha": 0}, "greater than 0"),
    ({"kind": "qlora"}, "'pretrain' or 'lora'"),
])
def test_bad_task_fields_are_refused_naming_the_fix(task, message):
    with pytest.raises(ValidationError, match=None) as err:
        Task.model_validate(task)
    assert message in str(err.value)


def test_rules_keep_the_rank_low_splittable_and_the_targets_real():
    assert rules(task={"kind": "lora", "rank": 17}) == {"lora_rank_le_dim"}  # k_proj is 2 heads × 8 = 16 wide
    assert rules(task={"kind": "lora", "rank": 17, "targets": ["q_proj"]}) == set()
    two = {"layout": {"tp": 2}, "hardware": {"devices_per_node": 2}}
    assert rules(task={"kind": "lora", "rank": 3}, **two) == {"lora_divisible_by_tp"}
    assert rules(task={"kind": "lora", "rank": 3, "targets": ["o_proj", "down_proj"]}, **two) == set()  # A row-split
    gpt = {**TINY, "family": "gpt", "kv_heads": 4}
    assert rules(model=gpt, task={"kind": "lora", "targets": ["gate_proj"], "rank": 4}) == {"lora_target_in_model"}
    mla = RunConfig(model="deepseek-v3", task={"kind": "lora"})
    assert "lora_target_in_model" in {v.rule for v in layout_violations(mla)}


def test_what_only_the_built_in_trainer_cannot_run_is_left_to_predict():
    fused = RunConfig.model_validate({"model": TINY, "task": {"kind": "lora", "rank": 4, "targets": ["qkv_proj"]}})
    experts = RunConfig.model_validate({"model": MOE, "task": {"kind": "lora", "rank": 4, "targets": ["up_proj"]}})
    assert [v.rule for v in validate(fused)] == ["lora_fused_qkv_unsupported"]
    assert [v.rule for v in validate(experts)] == ["lora_expert_targets_unsupported"]
    assert layout_violations(fused) == layout_violations(experts) == []
    assert validate(RunConfig.model_validate({"model": MOE, "task": {"kind": "lora", "rank": 4}})) == []


def test_a_sweep_grids_over_the_task_and_plans_each_point():
    spec = SweepSpec.model_validate({
        "name": "lora", "base": {"model": TINY, "knobs": {"global_batch": 4}, "task": {"kind": "lora"}},
        "grid": [{"task.rank": [4, 8]}, {"variant": ["attn", "all", "experts"]}],
        "variants": {"attn": {}, "all": {"task": {"targets": ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]}},
                     "experts": {"model": MOE, "task": {"targets": ["up_proj"]}}}})
    runs = expand(spec)
    assert [r.config.task.rank for r in runs if r.config] == [4, 4, 4, 8, 8, 8]
    assert runs[1].config is not None and runs[1].config.task.targets == ["q_proj", "v_proj", "gate_proj", "up_proj",
                                                                           "down_proj"]
    p = plan(spec)
    assert [r.status for r in p.runs] == ["planned", "planned", "unsupported"] * 2
    assert "lora_expert_targets_unsupported" in p.runs[2].reasons[0]
    full = SweepSpec.model_validate({"name": "x", "base": {"model": TINY, "task": {"rank": 8}}})
    assert "task.rank set but task.kind is pretrain" in str(expand(full)[0].error)


def test_run_check_and_plan_show_the_task(tmp_path):
    assert validate(load_run_config(EXAMPLE)) == []
    res = CliRunner().invoke(app, ["run", str(EXAMPLE), "--check"])
    assert res.exit_code == 0, res.output
    assert "LoRA r16 α32 q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["plan", str(EXAMPLE), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["runs"][0]["config"]["task"]["rank"] == 16
    table = Console(width=250, record=True)  # a row on one line
    print_plan(load_and_plan(EXAMPLE, 10), console=table)
    shown = table.export_text()
    assert " task " in shown and "LoRA r16 α32 q_proj," in shown
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**yaml.safe_load(EXAMPLE.read_text()), "task": {"kind": "lora", "rank": 3,
                                                                                   "targets": ["qkv_proj"]}}))
    res = CliRunner().invoke(app, ["run", str(bad), "--check"])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "lora_fused_qkv_unsupported" in out and "use q_proj, k_proj, v_proj" in out
