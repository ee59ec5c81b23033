"""Audit 2, H1/H5/L3: `predict --hardware` adds to $POWERTRAIN_HARDWARE, `sweep --resume` refuses an edited
spec that finished runs did not run with, and sweep options that would do nothing are refused."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.hardware.catalog import _default_catalog
from powertrain.launch.sweep import SweepError, SweepOptions, SweepRunner
from powertrain.plan.planner import plan
from powertrain.plan.state import SpecChanged, SweepState
from powertrain.plan.sweep_spec import SweepSpec
from powertrain.store.sweep_log import read_sweep

runner = CliRunner()

DEVICE = {"vendor": "nvidia", "peak_tflops": {"fp32": 60, "bf16": 900}, "memory_gb": 80, "memory_bw_gb_s": 3000,
          "tdp_w": 700, "node": {"devices_per_node": 8, "intra_node_bw_gb_s": 450, "nic_count": 8, "nic_gbit_s": 400}}

SWEEP = {
    "name": "resume-edit",
    "base": {
        "model": "llama3-tiny",
        "hardware": {"devices_per_node": 1, "device": "cpu"},
        "knobs": {"global_batch": 8, "micro_batch": 1},
        "protocol": {"warmup_steps": 1, "measured_steps": 2},
    },
    "grid": [{"knobs.micro_batch": [1, 2]}],
    "launch": {"backend": "local", "time_limit_min": 5},
}


def _one_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    return lines[0]


# --- H1 ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_catalog():
    _default_catalog.cache_clear()
    yield
    _default_catalog.cache_clear()  # the catalog read under this test's $POWERTRAIN_HARDWARE must not leak


def test_predict_hardware_files_add_to_the_environment_files(tmp_path, monkeypatch, fresh_catalog):
    env_file, cli_file = tmp_path / "site.yaml", tmp_path / "mine.yaml"
    env_file.write_text(yaml.safe_dump({"devices": {"envgpu": DEVICE}}))
    cli_file.write_text(yaml.safe_dump({"devices": {"cligpu": DEVICE}}))
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "envgpu", "model": "llama3-8b", "layout": {"tp": 1, "pp": 1, "fsdp": True},
        "knobs": {"micro_batch": 1, "global_batch": 16, "recompute": "full", "precision": "bf16"},
        "hardware": {"nodes": 1, "devices_per_node": 8, "device": "envgpu"}}))
    monkeypatch.setenv("POWERTRAIN_HARDWARE", str(env_file))  # also restores the variable the command extends
    res = runner.invoke(app, ["predict", str(spec), "--hardware", str(cli_file), "--json"])
    assert res.exit_code == 0, res.output  # the device only the environment's file defines still resolves
    assert os.environ["POWERTRAIN_HARDWARE"].split(":") == [str(env_file), str(cli_file)]  # env first: later wins


def test_predict_hardware_file_overrides_an_environment_entry_of_the_same_name(tmp_path, monkeypatch,
                                                                              fresh_catalog):
    site, mine = tmp_path / "site.yaml", tmp_path / "mine.yaml"
    site.write_text(yaml.safe_dump({"devices": {"gpux": {**DEVICE, "tdp_w": 500}}}))
    mine.write_text(yaml.safe_dump({"devices": {"gpux": {**DEVICE, "tdp_w": 900}}}))
    monkeypatch.setenv("POWERTRAIN_HARDWARE", str(site))
    from powertrain.cli.predict import _use_hardware_files

    _use_hardware_files([mine])
    assert _default_catalog()["gpux"].tdp_w == 900


# --- H5 ---------------------------------------------------------------------------------------------------------


def _spec(global_batch: int = 8) -> SweepSpec:
    raw = copy.deepcopy(SWEEP)
    raw["base"]["knobs"]["global_batch"] = global_batch
    return SweepSpec.model_validate(raw)


def _finished(folder: Path, statuses: dict[str, str]) -> dict:
    """A sweep folder whose runs ended with ``statuses`` (by position) under the original spec."""
    state = SweepState.create_or_merge(folder, plan(_spec()))
    for r, status in zip(state.runs, statuses.values(), strict=False):
        state.set(r["id"], status=status)
    return read_sweep(folder)  # sweep.json and the changes logged since


def test_resume_with_an_edited_spec_is_refused_naming_the_runs(tmp_path):
    before = _finished(tmp_path, {"a": "ok", "b": "ok"})
    with pytest.raises(SpecChanged) as exc:
        SweepState.create_or_merge(tmp_path, plan(_spec(16)))
    msg = str(exc.value)
    assert "\n" not in msg and "knobs.global_batch 8, the spec now says 16" in msg
    ids = [r["id"] for r in before["runs"]]
    assert f"run {ids[0]} " in msg and f"{ids[1]} differs too" in msg and "new --out" in msg
    after = read_sweep(tmp_path)
    assert after["runs"] == before["runs"]  # the record of what ran is not rewritten


def test_resume_with_the_same_spec_keeps_the_finished_runs(tmp_path):
    _finished(tmp_path, {"a": "ok", "b": "failed"})
    state = SweepState.create_or_merge(tmp_path, plan(_spec()))
    assert [r["status"] for r in state.runs] == ["ok", "failed"]


def test_runs_the_resume_runs_again_may_take_the_edited_configuration(tmp_path):
    data = _finished(tmp_path, {"a": "failed", "b": "running"})
    state = SweepState.create_or_merge(tmp_path, plan(_spec(16)), rerun=("failed", "oom", "running"))
    assert all(r["config"]["knobs"]["global_batch"] == 16 for r in state.runs)
    # the same failures kept as they are (no --retry-failed) would be recorded under a config they did not run
    (tmp_path / "sweep.json").write_text(json.dumps(data))
    with pytest.raises(SpecChanged, match="global_batch"):
        SweepState.create_or_merge(tmp_path, plan(_spec(16)), rerun=("running",))


def test_runner_and_command_refuse_an_edited_spec_before_running_anything(tmp_path):
    _finished(tmp_path, {"a": "ok", "b": "planned"})
    opts = SweepOptions(resume=True)
    with pytest.raises(SweepError, match="resume with the spec the sweep started with"):
        SweepRunner(plan(_spec(16)), tmp_path, opts).run()
    edited = tmp_path / "edited.yaml"
    raw = copy.deepcopy(SWEEP)
    raw["base"]["knobs"]["global_batch"] = 16
    edited.write_text(yaml.safe_dump(raw))
    res = runner.invoke(app, ["sweep", str(edited), "--out", str(tmp_path), "--resume"])
    assert res.exit_code == 2, res.output
    assert "the spec now says 16" in res.output
    assert not [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]  # nothing ran


# --- L3 ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "named"), [
    (["--retry-failed"], "--retry-failed applies with --resume"),
    (["--interrupted", "fail"], "--interrupted applies with --resume"),
    (["--retry-failed", "--interrupted", "rerun"], "--retry-failed and --interrupted apply with --resume"),
    (["--resume", "--interrupted", "later"], "--interrupted: 'later' is not rerun or fail"),
    (["--only", "*tp2*"], "--only '*tp2*' matches none of the 2 run id(s)"),
])
def test_sweep_options_that_would_do_nothing_are_refused(tmp_path, args, named):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SWEEP))
    out = tmp_path / "out"
    res = runner.invoke(app, ["sweep", str(spec), "--out", str(out), *args])
    assert res.exit_code == 2, res.output
    assert named in _one_line(res.output)
    assert not out.exists()  # refused before the results folder is created
