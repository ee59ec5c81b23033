"""advise: enumeration with plan's rules, memory pruning, ranking, limits, emission, power caps, placement."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from powertrain.advise import Constraints, NoFeasibleLayout, Objective, advise, make_request
from powertrain.advise.emit import emit_flags, emit_spec, emit_sweep
from powertrain.advise.placement import place_stages, placement_gain, slot_profile, synthetic_profile
from powertrain.advise.powercap import best_under_node_budget, cap_sweep, knee
from powertrain.advise.space import (
    SpaceStats,
    count_space,
    enumerate_candidates,
    rule_failures,
    structures,
    validation_config,
)
from powertrain.plan.sweep_spec import expand, load_sweep_spec
from powertrain.predict import load_calibration, memory_per_device
from powertrain.spec.run import load_run_config
from powertrain.spec.validate import validate

REAL = Path(os.environ.get("POWERTRAIN_REAL_DATA", "/work/shared/data/real"))
CAL = load_calibration()


def _mixtral(**kw):
    """A small request (a few thousand candidates) with an MoE model, so EP is in the space."""
    return make_request("mixtral-8x7b-tiny", "h100", 4, 1, 8, max_vp=2, **kw)


def test_every_candidate_passes_plans_rules_and_fits_and_counts_add_up():
    req = _mixtral(constraints=Constraints(mem_headroom=0.1))
    st = SpaceStats()
    cands = list(enumerate_candidates(req, CAL, st))
    assert cands, "some layout fits"
    assert st.enumerated == count_space(req, CAL.coefficients)
    assert st.enumerated == st.rejected_rules + st.rejected_memory + st.same_as_uncapped + st.kept
    assert st.kept == len(cands)
    assert st.rejected_rules > 0 and "kv_heads_divisible_by_tp" in st.rule_counts  # tp 4 > kv_heads 2: plan's rule
    cap = req.device.memory_bytes * 0.9
    seen = set()
    for c in cands[:: max(1, len(cands) // 200)]:
        assert memory_per_device(c.case, CAL.coefficients)[0] <= cap
        key = (c.case.tp, c.case.pp, c.case.cp, c.case.ep, c.case.etp, c.case.fsdp, c.case.sequence_parallel,
               c.case.pp_schedule, c.case.vp, c.case.micro_batch)
        if key in seen:
            continue
        seen.add(key)
        lay = {"tp": c.case.tp, "pp": c.case.pp, "cp": c.case.cp, "dp": c.case.dp, "ep": c.case.ep,
               "etp": c.case.etp, "fsdp": c.case.fsdp, "sequence_parallel": c.case.sequence_parallel,
               "pp_schedule": c.case.pp_schedule, "virtual_stages": c.case.vp}
        assert rule_failures(req, validation_config(req, lay, c.case.micro_batch)) == []


def test_megatron_engine_also_searches_parallel_folding_and_emits_it():
    # EP spanning TP ranks (etp 1) is a Megatron-Core layout: searched for megatron, never for the built-in trainer
    from powertrain.advise.emit import emit_flags, run_spec_dict

    mega = [s for s in structures(_mixtral(engine="megatron")) if s["etp"] == 1]
    assert mega and all(s["tp"] > 1 for s in mega)
    assert any((s["dp"] * s["cp"]) % s["ep"] for s in mega)  # EP larger than any data-parallel group
    assert not [s for s in structures(_mixtral(engine="builtin")) if s["etp"] is not None]
    req = _mixtral(engine="megatron")
    folded = next(c for c in enumerate_candidates(req, CAL) if c.case.etp == 1)
    assert "ETP1" in folded.label() and "--expert-tensor-parallel-size 1" in emit_flags(folded, req, "megatron")
    spec, notes = run_spec_dict(folded, req, name="folded")
    assert spec["layout"]["etp"] == 1 and any("parallel folding" in n for n in notes)


def test_builtin_engine_keeps_the_trainers_limits_megatron_does_not():
    lay = next(s for s in structures(_mixtral()) if s["cp"] == 2 and s["pp"] == 1 and s["tp"] == 1 and s["ep"] == 1)
    mega, builtin = _mixtral(engine="megatron"), _mixtral(engine="builtin")
    cfg = validation_config(mega, lay, 1)
    assert "context_parallel_unsupported" in [v.rule for v in validate(cfg)]  # plan's own rule set
    assert rule_failures(mega, cfg) == []
    assert "context_parallel_unsupported" in rule_failures(builtin, cfg)


def test_candidates_are_predicted_for_the_requested_engine():
    # a RunConfig's case is powertrain's own trainer's; the advice for Megatron must cost Megatron's kernels and
    # fixed step time, not the built-in trainer's
    for engine, attention in (("megatron", "fused"), ("builtin", "flash2")):
        cands = list(enumerate_candidates(_mixtral(engine=engine), CAL))
        assert cands and {(c.case.engine, c.case.attention_kernel) for c in cands} == {(engine, attention)}


def test_ranking_follows_the_objective_and_top1_is_the_best_point():
    adv = advise(_mixtral(), CAL, top_n=3)
    best = max(adv.points, key=lambda p: p.tokens_per_s)
    assert adv.top[0].point.tokens_per_s == pytest.approx(best.tokens_per_s)
    assert [r.point.score for r in adv.top] == sorted(r.point.score for r in adv.top)
    lo, hi, how = adv.top[0].interval
    assert lo < adv.top[0].point.tokens_per_s < hi and how
    assert adv.explanation[0].startswith("#1 ")
    energy = advise(_mixtral(objective=Objective("energy"), power_caps=[700, 400]), CAL, top_n=3)
    assert energy.top[0].point.j_per_token == pytest.approx(min(p.j_per_token for p in energy.points))
    # the Pareto front: no point is both faster and more efficient than a front point
    for f in energy.pareto:
        assert not any(p.tokens_per_s > f.tokens_per_s and p.j_per_token < f.j_per_token for p in energy.points)


def test_limits_are_kept_and_power_caps_enter_the_search():
    free = advise(_mixtral(objective=Objective("energy"), power_caps=[700, 300]), CAL, top_n=1)
    peaks = sorted(p.node_peak_w for p in free.points)
    budget = (peaks[0] + peaks[-1]) / 2 / 1000
    hot = sorted(p.temp_peak_c for p in free.points)
    limit = (hot[0] + hot[-1]) / 2
    adv = advise(_mixtral(objective=Objective("energy"), power_caps=[700, 300],
                          constraints=Constraints(node_kw=budget, max_temp_c=limit)), CAL, top_n=3)
    assert all(p.node_peak_w <= budget * 1000 and p.temp_peak_c <= limit for p in adv.points)
    assert len(adv.points) < len(free.points)
    assert any(p.cand.case.power_limit_w == 300 for p in adv.points)
    got = best_under_node_budget(free, budget)
    assert got is not None and got.node_peak_w <= budget * 1000
    with pytest.raises(NoFeasibleLayout, match=r"raise --max-temp to \d+"):
        advise(_mixtral(power_caps=[700, 300], constraints=Constraints(max_temp_c=hot[0] - 0.5)), CAL)


def test_impossible_requests_say_why_and_the_nearest_change():
    with pytest.raises(NoFeasibleLayout, match=r"--node-kw 1: below one node's idle draw .* raise it above"):
        advise(_mixtral(constraints=Constraints(node_kw=1)), CAL)
    with pytest.raises(NoFeasibleLayout, match=r"no layout fits in memory.*use about \d+ GPUs") as exc:
        advise(make_request("gpt3-175b", "h100", 8, 1, 8), CAL)
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="--objective cost needs"):
        _mixtral(objective=Objective("cost"))
    with pytest.raises(ValueError, match="--model: unknown model"):
        make_request("gpt-5", "h100", 8, 1, 8)
    # the built-in trainer trains fp32/bf16: an fp8 plan for it is refused up front, never written as bf16
    with pytest.raises(ValueError, match="--engine builtin: the built-in trainer trains fp32 or bf16"):
        make_request("llama3-tiny", "h100", 4, 1, 8, engine="builtin", precision="fp8")


def test_emitted_spec_and_sweep_load_and_plan(tmp_path):
    req = make_request("llama3-tiny", "h100", 4, 1, 8, engine="builtin")
    adv = advise(req, CAL, top_n=3)
    spec = tmp_path / "top.yaml"
    emit_spec(adv.top[0].point.cand, req, spec)
    cfg = load_run_config(spec)
    assert validate(cfg) == [] and cfg.layout.tp == adv.top[0].point.cand.case.tp
    sweep = tmp_path / "top-sweep.yaml"
    emit_sweep([r.point.cand for r in adv.top], req, sweep)
    runs = [e.config for e in expand(load_sweep_spec(sweep))]
    assert [(c.layout.tp, c.layout.pp, c.knobs.micro_batch, c.knobs.recompute) for c in runs] == \
        [(r.point.cand.case.tp, r.point.cand.case.pp, r.point.cand.case.micro_batch, r.point.cand.case.recompute)
         for r in adv.top]
    flags = emit_flags(adv.top[0].point.cand, req, "megatron")
    assert f"--tensor-model-parallel-size {adv.top[0].point.cand.case.tp}" in flags
    assert "--global-batch-size 8" in emit_flags(adv.top[0].point.cand, req, "nemo").replace("data.global_batch_size=", "--global-batch-size ")
    with pytest.raises(ValueError, match="--emit 'deepspeed'"):
        emit_flags(adv.top[0].point.cand, req, "deepspeed")


def test_power_knee_is_the_lowest_energy_cap_and_caps_lower_clocks():
    pts = cap_sweep(_pp8_case(), CAL, [None, 600, 450, 300])  # compute-bound: a cap slows it
    k = knee(pts)
    assert k.j_per_token == min(p.j_per_token for p in pts)
    assert pts[-1].clock_factor < 1.0 and pts[-1].tokens_per_s < pts[0].tokens_per_s
    assert all(p.throttle_share is not None for p in pts)


def _pp8_case():
    from powertrain.predict import case_from_run_config
    from powertrain.spec.run import RunConfig

    cfg = RunConfig.model_validate({"model": "llama3-70b", "layout": {"pp": 8},
                                    "knobs": {"global_batch": 64, "recompute": "full", "precision": "bf16"},
                                    "hardware": {"nodes": 1, "devices_per_node": 8, "device": "h200"}})
    return case_from_run_config(cfg)


def test_slow_slots_get_the_lightest_stages_and_the_step_improves():
    case = _pp8_case()
    speeds = {f"gpu{i}": 1.0 for i in range(8)}
    speeds["gpu2"] = speeds["gpu5"] = 0.9
    pl = place_stages(case, synthetic_profile(speeds), CAL)
    slow_stages = [s for s, slots in pl.stage_slots.items() if set(slots) & {2, 5}]
    assert len(slow_stages) == 2
    light = sorted(range(8), key=lambda s: pl.pp_split[s])[:2]
    assert sorted(slow_stages) == sorted(light)
    assert sum(pl.pp_split) == case.layers
    assert pl.step_after_s < pl.step_before_s and placement_gain(pl) < 0
    assert sorted(pl.device_order) == list(range(8))
    for r, slot in enumerate(pl.device_order):  # rank r (stage r) sits on a slot its stage was given
        assert slot in pl.stage_slots[r]


def _smi_with_clocks(path: Path, slow: set[int]) -> None:
    lines = ["timestamp, index, power.draw [W], temperature.gpu, clocks.current.sm [MHz], utilization.gpu [%], "
             "clocks_event_reasons.active"]
    for t in range(20):
        for g in range(8):
            hot = g in slow
            lines.append(f"2024/05/01 10:00:{t:02d}.000, {g}, {600 if hot else 650}.0 W, {86 if hot else 70}, "
                         f"{1782 if hot else 1980} MHz, 100 %, {'0x0000000000000020' if hot else '0x0000000000000000'}")
    path.write_text("\n".join(lines) + "\n")


def test_profile_from_a_run_directory_and_placement_from_it(tmp_path):
    from powertrain.importers.nvsmi import import_nvsmi

    smi = tmp_path / "smi.csv"
    _smi_with_clocks(smi, {3, 6})
    run = import_nvsmi([smi], tz="UTC").write(tmp_path / "run")
    prof = slot_profile(run)
    assert [s.slot for s in prof.slots] == [f"gpu{i}" for i in range(8)]
    assert prof.speed["gpu3"] == pytest.approx(0.9) and prof.speed["gpu0"] == pytest.approx(1.0)
    assert prof.slots[3].temp_mean_c == pytest.approx(86)
    pl = place_stages(_pp8_case(), prof, CAL)
    assert pl.step_after_s < pl.step_before_s


def test_real_h100_logs_build_a_profile(tmp_path):
    from powertrain.importers.nvsmi import import_nvsmi

    src = REAL / "wilkins-nvsmi-h100x8-titanx2" / "h100x8_gpt8b_ddp" / "ckpt10.csv.gz"
    if not src.exists():
        pytest.skip(f"real data not found at {src} (set POWERTRAIN_REAL_DATA)")
    run = import_nvsmi([src], tz="UTC").write(tmp_path / "h100")
    prof = slot_profile(run)
    assert len(prof.slots) == 8
    powers = [s.power_mean_w for s in prof.slots]
    assert all(p is not None and 100 < p < 750 for p in powers)  # busy H100s (W), per slot
    assert max(powers) > min(powers)  # the slots differ: the spread the logs hold
    assert prof.speed_from == "unknown" and not prof.speeds_known()  # power and utilisation only: said so
    assert any("relative speeds unknown" in n for n in prof.notes)


def test_cli_table_emit_html_and_one_line_refusal(tmp_path):
    from typer.testing import CliRunner

    from powertrain.cli import app

    base = ["advise", "-m", "mixtral-8x7b-tiny", "--hardware", "h100", "-g", "4", "-b", "8", "--max-vp", "2"]
    res = CliRunner().invoke(app, [*base, "--top", "3", "--emit", str(tmp_path / "top.yaml"), "--emit", "megatron",
                                   "--html", str(tmp_path / "report")])
    assert res.exit_code == 0, res.output
    assert "top configurations" in res.output and "why #1 beats #2" in res.output
    assert "--tensor-model-parallel-size" in res.output and "power caps for #1" in res.output
    assert load_run_config(tmp_path / "top.yaml").model.name == "mixtral-8x7b-tiny"
    assert (tmp_path / "top-sweep.yaml").is_file()
    page = (tmp_path / "report" / "report.html").read_text()
    assert "fig-advice-throughput-energy" in page and "Pareto" in page
    res = CliRunner().invoke(app, [*base, "--node-kw", "0.5"])
    assert res.exit_code == 1
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "--node-kw 0.5: below one node's idle draw" in lines[0]


def test_a_placement_goes_into_the_emitted_spec(tmp_path):
    from powertrain.advise.space import Candidate
    from powertrain.spec.layout import Layout

    case = _pp8_case()
    speeds = {f"gpu{i}": 1.0 for i in range(8)}
    speeds["gpu0"] = speeds["gpu1"] = 0.9
    pl = place_stages(case, synthetic_profile(speeds), CAL)
    req = make_request("llama3-70b", "h200", 8, 1, 64)
    cand = Candidate(case, Layout(pp=8).resolve(8))
    emit_spec(cand, req, tmp_path / "placed.yaml", device_order=pl.device_order, pp_split=pl.pp_split)
    cfg = load_run_config(tmp_path / "placed.yaml")
    assert cfg.launch.device_order == pl.device_order and cfg.layout.pp_split == pl.pp_split
    assert cfg.layout.pp_split != [10] * 8 and validate(cfg) == []


def test_cli_json_is_one_object_with_the_top_and_the_space():
    import json

    from typer.testing import CliRunner

    from powertrain.cli import app

    res = CliRunner().invoke(app, ["advise", "-m", "llama3-tiny", "--hardware", "h100", "-g", "4", "-b", "8",
                                   "--max-vp", "2", "--top", "2", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert [t["rank"] for t in d["top"]] == [1, 2] and d["space"]["enumerated"] >= d["space"]["predicted"] > 0
    lo, hi = d["top"][0]["tokens_per_s_interval"]
    assert lo < d["top"][0]["metrics"]["tokens_per_s"] < hi
