"""Every knob real or refused, between `run`, `plan` and `sweep`: settings one run would ignore are
refused by `powertrain run` (or by a spec rule), settings a sweep legitimately merges are a warning in
`plan`, and the spec a sweep hands each run holds only what that run applies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.launch import sweep as sweep_mod
from powertrain.launch.sweep import SweepOptions, SweepRunner
from powertrain.plan.planner import plan
from powertrain.plan.state import SweepState
from powertrain.plan.sweep_spec import SpecError, expand, parse_sweep_spec
from powertrain.spec.effective import as_single_run, sweep_protocol, unused_knobs
from powertrain.spec.run import RunConfig
from powertrain.spec.validate import TRAINER_ONLY_RULES, layout_violations, validate

TINY = "llama3-tiny"
README = Path(__file__).resolve().parent.parent / "README.md"
RUN = {"name": "tiny", "model": TINY, "hardware": {"devices_per_node": 1},
       "knobs": {"global_batch": 2}, "protocol": {"warmup_steps": 2, "measured_steps": 3}}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def cfg(**over: Any) -> RunConfig:
    return RunConfig.model_validate(_merge(RUN, over))


def rules(c: RunConfig) -> set[str]:
    return {v.rule for v in validate(c)}


@pytest.fixture
def wide_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan`'s table one row per run: its console may have fixed its width when first imported."""
    from powertrain.cli import plan as plan_cli

    monkeypatch.setattr(plan_cli.out, "_width", 250)


def _cli(*argv: str) -> tuple[int, list[str], str]:
    res = CliRunner().invoke(app, list(argv), env={"COLUMNS": "250"})
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in res.stderr + res.stdout
    return res.exit_code, lines, res.stdout


def _spec(tmp_path: Path, data: dict[str, Any], name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


# -- spec rules (B2, B4, B5, A6) --------------------------------------------------------------------------
@pytest.mark.parametrize(("over", "rule", "fix_word"), [
    ({"protocol": {"cooldown_until_temp_c": 40}}, "cooldown_temp_needs_time", "protocol.cooldown_s"),
    ({"data": {"path": "README.md"}}, "data_path_needs_text", "data.kind: text"),
    ({"profile": {"steps": [0]}}, "profile_needs_enabled", "profile.enabled: true"),
    ({"profile": {"ranks": [0]}}, "profile_needs_enabled", "drop profile.ranks"),
    ({"profile": {"in_measured": True}}, "profile_needs_enabled", "drop profile.in_measured"),
    ({"profile": {"enabled": True, "steps": [3]}}, "profile_measured_needs_in_measured",
     "profile.in_measured: true to trace measured step 3"),
    ({"profile": {"enabled": True}, "protocol": {"warmup_steps": 0}}, "profile_measured_needs_in_measured",
     "warmup_steps ≥ 1"),
    ({"profile": {"enabled": True, "steps": [5]}}, "profile_steps_in_run", "below 5"),
    ({"profile": {"enabled": True, "steps": [-1]}}, "profile_steps_in_run", "below 5"),
    ({"profile": {"enabled": True, "steps": []}}, "profile_steps_in_run", "list steps"),
    ({"profile": {"enabled": True, "in_measured": True}}, "in_measured_needs_measured_step",
     "drop profile.in_measured"),
    ({"profile": {"enabled": True, "ranks": [1]}}, "profile_ranks_in_world", "below 1"),
    ({"profile": {"enabled": True, "ranks": []}}, "profile_ranks_in_world", "per_stage"),
    ({"hardware": {"device": "h100-sxm", "devices_per_node": 16}, "knobs": {"global_batch": 16}},
     "devices_per_node_le_node", "nodes: 2, devices_per_node: 8"),
    ({"hardware": {"device": "h100-sxm", "devices_per_node": 12}, "knobs": {"global_batch": 12}},
     "devices_per_node_le_node", "hardware YAML"),
])
def test_settings_that_would_do_nothing_are_refused_by_a_rule_with_a_fix(over, rule, fix_word):
    found = [v for v in validate(cfg(**over)) if v.rule == rule]
    assert found, f"expected {rule}, got {validate(cfg(**over))}"
    assert fix_word in found[0].fix, found[0]
    assert "\n" not in str(found[0])


@pytest.mark.parametrize("over", [
    {"protocol": {"cooldown_s": 60, "cooldown_until_temp_c": 40}},
    {"data": {"kind": "text", "path": str(README)}, "model": {"name": "byte", "family": "llama", "layers": 2,
                                                               "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2,
                                                               "vocab": 256, "seq_len": 16}},
    {"profile": {"enabled": True}},
    {"profile": {"enabled": True, "steps": [0, 1], "ranks": [0]}},
    {"profile": {"enabled": True, "steps": [1, 4], "in_measured": True, "ranks": "all"}},
    {"hardware": {"device": "h100-sxm", "devices_per_node": 8, "nodes": 2}, "knobs": {"global_batch": 16}},
    {"hardware": {"device": "gb200", "devices_per_node": 72}, "knobs": {"global_batch": 72}},  # one NVL72 domain
    {"hardware": {"device": "cpu", "devices_per_node": 16}, "knobs": {"global_batch": 16}},  # no catalog node
])
def test_the_same_settings_where_they_apply_pass(over):
    assert validate(cfg(**over)) == []


def test_measurement_rules_are_not_refusals_for_the_predictor_but_the_node_size_is():
    measuring = {"cooldown_temp_needs_time", "data_path_needs_text", "profile_needs_enabled", "profile_steps_in_run",
                 "profile_measured_needs_in_measured", "in_measured_needs_measured_step", "profile_ranks_in_world"}
    assert measuring <= TRAINER_ONLY_RULES
    assert layout_violations(cfg(data={"path": "README.md"}, profile={"steps": [9]})) == []
    crowded = cfg(hardware={"device": "h100-sxm", "devices_per_node": 16}, knobs={"global_batch": 16})
    assert [v.rule for v in layout_violations(crowded)] == ["devices_per_node_le_node"]


# -- `powertrain run` (B1, B6) ----------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [{"repeats": 3}, {"cooldown_s": 20}, {"idle_baseline_s": 15},
                                      {"cooldown_s": 20, "cooldown_until_temp_c": 40, "repeats": 2}])
def test_run_refuses_protocol_settings_only_a_sweep_applies_and_sweep_takes_the_spec(tmp_path, protocol):
    spec = _spec(tmp_path, _merge(RUN, {"protocol": protocol}))
    code, lines, _ = _cli("run", str(spec), "--check")
    assert code == 2 and len(lines) == 1, lines
    assert all(f"protocol.{k}" in lines[0] for k in protocol) and f"powertrain sweep {spec}" in lines[0]
    assert not (tmp_path / "runs").exists()
    # the named way works: a run spec is a sweep of one, its repeats become runs
    p = plan(parse_sweep_spec(yaml.safe_load(spec.read_text())))
    assert [r.status for r in p.runs] == ["planned"] * protocol.get("repeats", 1)


def test_run_refuses_knobs_that_change_nothing_for_the_layout(tmp_path):
    noop = {"layout": {"pp_schedule": "gpipe", "distributed_optimizer": True},
            "knobs": {"overlap": {"async_tp": True, "fsdp_prefetch": False, "fsdp_reshard_after_forward": False,
                                  "ddp_bucket_mb": 1, "grad_reduce_in_backward": False}}}
    spec = _spec(tmp_path, _merge(RUN, noop))
    code, lines, _ = _cli("run", str(spec), "--check")
    assert code == 2 and len(lines) == 1, lines
    for knob in ("knobs.overlap.async_tp (TP=1)", "layout.pp_schedule (PP=1)", "knobs.overlap.fsdp_prefetch (no FSDP)",
                 "knobs.overlap.fsdp_reshard_after_forward (no FSDP)", "knobs.overlap.ddp_bucket_mb",
                 "knobs.overlap.grad_reduce_in_backward", "layout.distributed_optimizer (no data parallelism)"):
        assert knob in lines[0]
    assert "drop them" in lines[0]
    # the planner's own list (one copy of the logic): a sweep of this spec plans it with the same seven
    (planned,) = plan(parse_sweep_spec(_merge(RUN, noop))).runs
    assert planned.status == "planned" and planned.unused_knobs == unused_knobs(cfg(**noop))
    assert len(planned.unused_knobs) == 7


def test_run_accepts_dp_knobs_when_dp_is_derived_from_the_world(tmp_path):
    # dp is not written: it follows from 2 ranks, so the DP knobs apply and nothing is refused
    spec = _spec(tmp_path, _merge(RUN, {"hardware": {"devices_per_node": 2}, "knobs": {
        "global_batch": 4, "overlap": {"ddp_bucket_mb": 1, "grad_reduce_in_backward": False}}}))
    code, lines, _ = _cli("run", str(spec), "--check")
    assert code == 0, lines
    fsdp = _spec(tmp_path, _merge(RUN, {"hardware": {"devices_per_node": 2}, "layout": {"fsdp": True},
                                        "knobs": {"global_batch": 4, "overlap": {"fsdp_prefetch": False}}}), "f.yaml")
    assert _cli("run", str(fsdp), "--check")[0] == 0


# -- `plan` and `sweep`: a warning, and what each run is handed (B6, C) -----------------------------------------
STUDY = {"name": "noop", "base": _merge(RUN, {"hardware": {"devices_per_node": 2}, "knobs": {"global_batch": 4}}),
         "grid": [{"layout.tp": [1, 2]}, {"variant": ["nosync", "base"]}],
         "variants": {"base": {}, "nosync": {"knobs.overlap.grad_reduce_in_backward": False}}}


def test_plan_shows_knobs_that_change_nothing_as_a_warning_not_a_refusal(tmp_path, wide_table):
    p = plan(parse_sweep_spec(STUDY))
    by_id = {r.id: r for r in p.runs}
    assert by_id["tp2.nosync"].status == "planned"  # DP1·TP2: the gradient-sync knob has no DP to act on
    assert by_id["tp2.nosync"].unused_knobs == ["knobs.overlap.grad_reduce_in_backward (no data parallelism)"]
    assert by_id["tp2.base"].status == "duplicate"
    assert by_id["tp1.nosync"].unused_knobs == [] and by_id["tp1.nosync"].status == "planned"
    code, _, out = _cli("plan", str(_spec(tmp_path, STUDY)))
    assert code == 0
    row = next(ln for ln in out.splitlines() if "tp2.nosync" in ln)
    assert "warning: knobs.overlap.grad_reduce_in_backward" in row and "planned" in row
    assert "1 launched with knobs that change nothing for their layout" in out
    # `sweep` and `plan --problems` show the problems only; the count below the table still names it
    _, _, problems = _cli("plan", str(_spec(tmp_path, STUDY)), "--problems")
    assert "│ tp2.nosync " not in problems and "│ tp2.base " in problems  # the duplicate is listed
    assert "1 launched with knobs that change nothing" in problems


def test_plan_json_problems_lists_the_same_runs_as_the_table(tmp_path, wide_table):
    spec = _spec(tmp_path, {**STUDY, "grid": [*STUDY["grid"], {"knobs.micro_batch": [1, 3]}]})
    code, _, out = _cli("plan", str(spec), "--json", "--problems")
    assert code == 0
    data = json.loads(out)
    problems = {"tp2.mb3.nosync", "tp2.mb1.base", "tp2.mb3.base", "tp1.mb3.nosync", "tp1.mb3.base"}
    assert {r["id"] for r in data["runs"]} == problems  # global batch 4 does not split in 3s; one duplicate
    assert all(r["status"] != "planned" for r in data["runs"])
    assert data["counts"] == {"planned": 3, "rejected": 4, "unsupported": 0, "duplicate": 1}  # of every run
    _, _, table = _cli("plan", str(spec), "--problems")
    assert {rid for rid in problems | {"tp1.mb1.nosync", "tp1.mb1.base", "tp2.mb1.nosync"}
            if f"│ {rid} " in table} == problems
    assert len(json.loads(_cli("plan", str(spec), "--json")[2])["runs"]) == 8


def test_each_sweep_run_is_handed_only_what_it_applies(tmp_path, monkeypatch):
    spec = parse_sweep_spec(_merge(STUDY, {"base": {"protocol": {"repeats": 2, "cooldown_s": 0.01}}}))
    p = plan(spec)
    runner = SweepRunner(p, tmp_path / "s", SweepOptions())
    runner.state = SweepState.create_or_merge(tmp_path / "s", p)
    handed: dict[str, dict[str, Any]] = {}

    def fake_launch(opts, spec_path, run_dir, time_limit_s, stop):
        handed[run_dir.name] = yaml.safe_load(spec_path.read_text())
        return "not launched in this test"

    monkeypatch.setattr(sweep_mod, "_launch_local", fake_launch)
    runner._one(runner.state.run("tp2.nosync.r1"))
    child = handed["tp2.nosync.r1"]
    assert child["knobs"]["overlap"]["grad_reduce_in_backward"] is True  # what the DP1 run does
    assert {k: child["protocol"][k] for k in ("repeats", "cooldown_s", "cooldown_until_temp_c", "idle_baseline_s")} \
        == {"repeats": 1, "cooldown_s": 0.0, "cooldown_until_temp_c": None, "idle_baseline_s": 0.0}
    # the spec it is handed passes `powertrain run`'s own checks
    path = _spec(tmp_path, child, "child.yaml")
    code, lines, _ = _cli("run", str(path), "--check")
    assert code == 0, lines
    planned = RunConfig.model_validate(runner.state.run("tp2.nosync.r1")["config"])
    assert sweep_protocol(planned) == {"repeats": 2, "cooldown_s": 0.01}  # sweep.json keeps what was asked
    assert sweep_protocol(as_single_run(planned)) == {} and unused_knobs(as_single_run(planned)) == []


# -- sweep specs (B3, B7, B8) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("where", [
    {"grid": [{"protocol.idle_baseline_s": [30, 60]}]},
    {"grid": [{"cases": [{"protocol": {"idle_baseline_s": 30}}]}]},
    {"grid": [{"zip": {"protocol.idle_baseline_s": [30], "knobs.seed": [1]}}]},
    {"grid": [{"variant": ["v"]}], "variants": {"v": {"protocol": {"idle_baseline_s": 30}}}},
    {"grid": [{"variant": ["w"]}], "variants": {"v": {"protocol.idle_baseline_s": 30}, "w": ["v"]}},
])
def test_an_idle_baseline_is_refused_outside_base(where):
    with pytest.raises(SpecError, match=r"protocol\.idle_baseline_s.*set it under base\.protocol"):
        parse_sweep_spec({"name": "b", "base": RUN, **where})
    base = parse_sweep_spec({"name": "b", "base": _merge(RUN, {"protocol": {"idle_baseline_s": 30}})})
    assert len(expand(base)) == 1


def test_variants_no_axis_lists_are_refused():
    with pytest.raises(SpecError, match=r"variants overlap, rc are defined but no grid group names `variant:`; "
                                        r"add `- variant: \[overlap, rc\]`"):
        parse_sweep_spec({"name": "v", "base": RUN, "grid": [{"knobs.micro_batch": [1, 2]}],
                          "variants": {"overlap": {"knobs.overlap.async_tp": True}, "rc": {"knobs.recompute": "full"}}})
    with pytest.raises(SpecError, match="no grid group names `variant:`"):
        parse_sweep_spec({"name": "v", "base": RUN, "variants": {"rc": {"knobs.recompute": "full"}}})
    with pytest.raises(SpecError, match=r"variant spare is defined but no `variant:` axis lists it"):
        parse_sweep_spec({"name": "v", "base": RUN, "grid": [{"variant": ["rc"]}],
                          "variants": {"rc": {"knobs.recompute": "full"}, "spare": {"knobs.seed": 1}}})
    # composed into a listed variant counts as used; listed in cases or zip too
    composed = {"a": {"knobs.recompute": "full"}, "b": {"knobs.seed": 1}, "both": ["a", "b"]}
    assert len(expand(parse_sweep_spec({"name": "v", "base": RUN, "grid": [{"variant": ["both"]}],
                                        "variants": composed}))) == 1
    assert len(expand(parse_sweep_spec({"name": "v", "base": RUN, "variants": composed,
                                        "grid": [{"cases": [{"variant": "both"}, {"variant": "a"}]}]}))) == 2


@pytest.mark.parametrize(("launch", "backend"), [
    ({"partition": "gpu"}, []), ({"account": "proj1", "qos": "high"}, []), ({"slurm_extra": ["--exclusive"]}, []),
    ({"backend": "slurm", "partition": "gpu"}, ["--backend", "local"]),
])
def test_slurm_options_with_the_local_backend_are_refused(tmp_path, launch, backend):
    spec = _spec(tmp_path, {**STUDY, "launch": launch})
    out = tmp_path / "out"
    code, lines, _ = _cli("sweep", str(spec), "--out", str(out), *backend)
    assert code == 2 and len(lines) == 1, lines
    assert all(f"launch.{k}" in lines[0] for k in launch if k != "backend")
    assert "--backend slurm" in lines[0] and not out.exists()


def test_a_sweep_asking_for_more_samples_per_second_than_the_sampler_takes_is_refused_before_planning() -> None:
    """The sampler refuses above 1 kHz; the spec used to allow 10 kHz and every run then failed after its retries."""
    from powertrain.core.sampling import MAX_RATE_HZ
    from powertrain.plan.sweep_spec import parse_sweep_spec

    with pytest.raises(Exception, match=r"launch\.sampler_rate_hz: Input should be less than or equal to 1000"):
        parse_sweep_spec({"name": "s", "base": {"model": "llama3-tiny"}, "launch": {"sampler_rate_hz": 5000}})
    assert parse_sweep_spec({"name": "s", "base": {"model": "llama3-tiny"},
                             "launch": {"sampler_rate_hz": MAX_RATE_HZ}}).launch.sampler_rate_hz == MAX_RATE_HZ
