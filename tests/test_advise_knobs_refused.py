"""advise: every knob changes what runs or is refused (the audit's A3, C, D2 and E findings).

A site power cap bounds clock-lock candidates; limits, objective inputs and rack sizes that nothing
reads are refused in one line; --json still writes --emit and --html; an emitted spec carries the
advised clock lock.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from powertrain.advise import Constraints, Objective, Request, advise, make_request
from powertrain.advise.emit import emit_flags, run_spec_dict
from powertrain.advise.space import Candidate, _power_points, enumerate_candidates
from powertrain.cli import app
from powertrain.predict import load_calibration
from powertrain.spec.run import RunConfig
from powertrain.spec.validate import validate

CAL = load_calibration()
SMALL = ("llama3-tiny", "h100", 4, 1, 8)  # a few thousand candidates: fast enough to search in a test
CLI_SMALL = ["advise", "-m", "llama3-tiny", "--hardware", "h100", "-g", "4", "-b", "8", "--max-vp", "2"]


def _req(**kw):
    return make_request(*SMALL, max_vp=2, **kw)


# --- A3: the site's --power-cap bounds clock-lock candidates -------------------------------------------------


def test_no_candidate_is_predicted_above_the_site_cap_with_clock_locks():
    """Every candidate, locked or not, runs under the site's cap: its governor holds the limiter's window at or under
    it (the instantaneous field may read above it for less than that window: docs/model.md §6)."""
    req = _req(constraints=Constraints(power_cap_w=350), clock_locks=[0.95, 0.9, 0.6])
    adv = advise(req, CAL, top_n=5)
    assert adv.points
    assert max(p.power_mean_w for p in adv.points) <= 350 + 1e-6
    for r in adv.top:
        for stage in r.prediction.breakdown["power"]["stages"].values():
            assert stage["limiter_window_w"] <= 350 * 1.002
    locks = {p.cand.clock_lock for p in adv.points}
    assert locks == {None, 0.95, 0.9, 0.6}
    st = adv.stats
    assert st.enumerated == st.rejected_rules + st.rejected_memory + st.same_as_uncapped + st.kept


def test_a_lock_under_a_cap_runs_at_the_lower_of_the_two_clocks():
    req = _req(constraints=Constraints(power_cap_w=80), clock_locks=[0.95, 0.3])
    pts = _power_points(req)
    assert pts == [(80, None, True), (80, 0.95, True), (80, 0.3, True)]
    by_key: dict = {}
    for cand in enumerate_candidates(req, CAL):
        key = (cand.case.tp, cand.case.pp, cand.case.micro_batch, cand.case.recompute, cand.case.overlap_tp)
        by_key.setdefault(key, {})[cand.clock_lock] = cand
    from powertrain.predict import predict

    # a candidate on which the 80 W cap binds, leaving a clock above the 0.3 lock's (this tiny job draws under
    # 100 W on Megatron's kernels: it is launch-bound)
    group, capped = next((g, p) for g in by_key.values() if {None, 0.95, 0.3} <= set(g)
                         if 0.3 < (p := predict(g[None].case, CAL)).breakdown["clock_factor_power_limit"] < 0.95)
    lock95, lock30 = (predict(group[k].case, CAL) for k in (0.95, 0.3))
    top = req.device.max_sm_clock_mhz
    assert group[0.3].case.sm_clock_mhz == pytest.approx(0.3 * top)
    cap_clock = capped.breakdown["clock_factor_power_limit"]
    # the lower of the two: the cap's clock under the 0.95 lock, the lock's own 0.3
    # (the governor solves the limit to 0.1 % of it, 0.08 W here: a few thousandths of the clock apart)
    assert lock95.breakdown["clock_factor_power_limit"] == pytest.approx(min(cap_clock, 0.95), abs=5e-3)
    assert lock30.breakdown["clock_factor_power_limit"] == pytest.approx(0.3)
    assert lock30.metrics["step_time_mean_s"] > capped.metrics["step_time_mean_s"]


def test_a_site_cap_at_or_below_idle_is_refused():
    with pytest.raises(ValueError, match=r"^--power-cap: 10 W is not above h100-sxm's idle draw"):
        _req(constraints=Constraints(power_cap_w=10))


# --- C: limits and inputs nothing reads are refused ---------------------------------------------------------------


@pytest.mark.parametrize(("limits", "option", "what"), [
    ({"max_temp_c": 30.0}, "--max-temp", "temperature"),
    ({"no_throttle": True}, "--no-throttle", "temperature"),
    ({"node_kw": 0.001}, "--node-kw", "power"),
    ({"rack_kw": 0.001}, "--rack-kw", "power"),
])
def test_power_and_thermal_limits_are_refused_on_a_cpu(limits, option, what):
    with pytest.raises(ValueError, match=rf"^{option}: cpu has no {what} sensor or model.*drop {option} for a CPU$"):
        make_request("llama3-tiny", "cpu", 2, 1, 8, constraints=Constraints(**limits))


@pytest.mark.parametrize(("objective", "message"), [
    (Objective("throughput", tokens=1e12), r"^--tokens is read by --objective time and cost only, not throughput"),
    (Objective("energy", tokens=1e12), r"^--tokens is read by --objective time and cost only, not energy"),
    (Objective("pareto", gpu_hour_price=2.0), r"^--gpu-hour-price is read by --objective cost only"),
    (Objective("time", tokens=1e12, kwh_price=0.1), r"^--kwh-price is read by --objective cost only, not time"),
    (Objective("time", tokens=-5.0), r"^--tokens -5: give a finite number above 0"),
    (Objective("cost", tokens=1e12, gpu_hour_price=-1.0, kwh_price=0.1), r"^--gpu-hour-price -1: give a finite"),
])
def test_objective_inputs_the_objective_does_not_read_are_refused(objective, message):
    with pytest.raises(ValueError, match=message):
        _req(objective=objective)


def test_objective_inputs_it_reads_are_accepted():
    assert _req(objective=Objective("time", tokens=1e12)).objective.tokens == 1e12
    assert _req(objective=Objective("cost", tokens=1e12, gpu_hour_price=2.0, kwh_price=0.1)).objective.kind == "cost"


def test_nodes_per_rack_needs_a_rack_budget():
    with pytest.raises(ValueError, match=r"^--nodes-per-rack 4: it sets how many nodes share --rack-kw; add --rack-kw"):
        _req(constraints=Constraints(nodes_per_rack=4))
    assert _req(constraints=Constraints(nodes_per_rack=4, rack_kw=100)).constraints.nodes_per_rack == 4


# --- D2: no catch-all fields ---------------------------------------------------------------------------------------


def test_request_and_candidate_have_no_unread_extra_field():
    assert "extra" not in {f.name for f in dataclasses.fields(Request)}
    assert "extra" not in {f.name for f in dataclasses.fields(Candidate)}


# --- E: an emitted spec carries the advised clock lock ------------------------------------------------------------


def _locked_candidate():
    req = _req(clock_locks=[0.6])
    return next(c for c in enumerate_candidates(req, CAL) if c.clock_lock == 0.6), req


def test_an_emitted_spec_carries_the_clock_lock_and_plans():
    cand, req = _locked_candidate()
    spec, notes = run_spec_dict(cand, req, max_sm_clock_mhz=1980)
    assert spec["knobs"]["sm_clock_mhz"] == [1188, 1188] and "power_limit_w" not in spec["knobs"]
    assert not any("clock" in n for n in notes)
    assert validate(RunConfig.model_validate(spec)) == []
    assert "nvidia-smi -lgc 1188,1188" in emit_flags(cand, req, "megatron", max_sm_clock_mhz=1980)


def test_without_the_maximum_clock_the_note_names_an_option_advise_has():
    cand, req = _locked_candidate()
    spec, notes = run_spec_dict(cand, req)
    assert "sm_clock_mhz" not in spec["knobs"]
    (note,) = [n for n in notes if "clock" in n]
    named = set(re.findall(r"--[a-z][a-z0-9-]+", note))
    assert named == {"--max-sm-clock-mhz"}
    helped = CliRunner().invoke(app, ["advise", "--help"], terminal_width=200)
    assert all(option in helped.stdout for option in named)


def test_cli_refuses_a_lock_that_would_be_emitted_without_its_clock(tmp_path):
    b200 = [*CLI_SMALL[:4], "b200", *CLI_SMALL[5:]]  # the catalog has no maximum SM clock for it
    res = CliRunner().invoke(app, [*b200, "--clock-locks", "0.6", "--emit", str(tmp_path / "top.yaml")])
    assert res.exit_code == 2 and "give --max-sm-clock-mhz" in res.stderr
    assert not (tmp_path / "top.yaml").exists()
    # where the catalog knows it (h100: 1980 MHz) the lock is written from it
    res = CliRunner().invoke(app, [*CLI_SMALL, "--clock-locks", "0.6", "-O", "energy", "--emit", str(tmp_path / "top.yaml")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, [*CLI_SMALL, "--max-sm-clock-mhz", "1980", "--emit", str(tmp_path / "top.yaml")])
    assert res.exit_code == 2 and "--max-sm-clock-mhz converts --clock-locks fractions" in res.stderr
    # without the catalog's maximum a lock is predicted at the fraction of the one given
    res = CliRunner().invoke(app, [*b200, "--clock-locks", "0.6", "--max-sm-clock-mhz", "1965", "-O", "energy",
                                   "--json", "--top", "50"])
    assert res.exit_code == 0, res.output
    locked = [r for r in json.loads(res.stdout)["top"] if r["label"].endswith("clk60%")]
    assert locked and all(abs(r["metrics"]["clock_sm_mean_mhz"] - 0.6 * 1965) < 2 for r in locked), locked[:1]


# --- C: --json honours --emit and --html -----------------------------------------------------------------------


def test_json_still_writes_emit_and_html_and_stdout_stays_one_object(tmp_path):
    spec = tmp_path / "out" / "top.yaml"
    res = CliRunner().invoke(app, [*CLI_SMALL, "--top", "2", "--json", "--clock-locks", "0.6", "-O", "energy",
                                   "--power-caps", "700,400", "--max-sm-clock-mhz", "1980",
                                   "--emit", str(spec), "--emit", "megatron", "--html", str(tmp_path / "report"),
                                   "--placement", "model"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)  # stdout holds the JSON only; what was written is said on stderr
    assert spec.is_file() and (tmp_path / "out" / "top-sweep.yaml").is_file()
    assert (tmp_path / "report" / "report.html").is_file() and d["html"] == str(tmp_path / "report")
    assert d["slot_profile"]["source"] and "placement" in d  # --placement model works with --json too
    files, flags = d["emitted"]
    assert files["spec"] == str(spec) and "wrote" in res.stderr
    assert flags["target"] == "megatron" and "--tensor-model-parallel-size" in flags["flags"]
    emitted = RunConfig.model_validate(yaml.safe_load(spec.read_text()))
    locked = d["top"][0]["label"].endswith("clk60%")  # whichever ranks first, the spec says the same
    assert emitted.knobs.sm_clock_mhz == ((1188, 1188) if locked else None)


@pytest.mark.parametrize(("args", "message"), [
    (["--hardware", "cpu", "--max-temp", "30"], "--max-temp: cpu has no temperature sensor or model"),
    (["--tokens", "1e12"], "--tokens is read by --objective time and cost only"),
    (["--nodes-per-rack", "2"], "--nodes-per-rack 2: it sets how many nodes share --rack-kw"),
])
def test_cli_refusals_are_one_line(args, message):
    base = [*CLI_SMALL]
    if "--hardware" in args:
        base[base.index("--hardware") + 1] = args[1]
        args = args[2:]
    res = CliRunner().invoke(app, [*base, *args])
    assert res.exit_code == 2
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and message in lines[0]


def test_more_gpus_per_node_than_the_catalogs_node_holds_is_refused_up_front_naming_the_node_count():
    with pytest.raises(ValueError, match=r"--gpus 16 over --nodes 1: 16 per node is more than one h100-sxm node holds "
                                         r"\(8\); use --nodes 2"):
        make_request("llama3-8b", "h100", 16, 1, 64)
    make_request("llama3-8b", "gb200", 64, 1, 64)  # an NVL72 rack: 64 GPUs share one NVLink domain


def test_an_emitted_spec_holds_only_knobs_its_layout_uses_so_run_accepts_it(tmp_path):
    """The advisor's candidate carries every overlap flag; written as a spec for a layout that cannot use one
    (FSDP prefetch without FSDP, DP knobs on one device), `powertrain run` would refuse it."""
    from powertrain.spec.effective import unused_knobs

    req = make_request("llama3-tiny", "cpu", 2, 1, 8)
    cands = [c for c in enumerate_candidates(req, CAL) if not c.layout.fsdp]
    assert cands
    for cand in cands[:3]:
        cand = dataclasses.replace(cand, case=dataclasses.replace(cand.case, overlap_fsdp=False))
        spec, _ = run_spec_dict(cand, req, name="x")
        assert "fsdp_prefetch" not in spec["knobs"]["overlap"]
        assert unused_knobs(RunConfig.model_validate(spec)) == []
