"""Values checked at the door (issue 29, item 4): content that would flow into a wrong number is refused.

* a YAML mapping that writes one key twice — in a spec, a hardware file, a calibration profile, a
  published-run table — is refused naming the file, the key and its line (PyYAML keeps the last one);
* a boolean where a number goes (``tp: true``, ``micro_batch: yes``: YAML 1.1 reads both as True, which
  pydantic would take as 1) is refused naming the field;
* two grid groups that set one axis (the later one would override the earlier) are refused naming both;
* a run directory written by a newer powertrain (``run.json`` ``schema`` powertrain.run/N > this one's)
  is refused, and skipped with its line by the lenient sweep-level readers;
* ``calibrate`` writes no profile that predicts its runs worse than its base, unless ``--allow-worse``;
* ``advise`` shows no cap above ``--power-cap``: neither a ranked configuration nor the knee of #1.

Every CLI case asserts the exit code, one line naming the file / field (and line), and that every file
that was there before is byte-identical (sha256) afterwards.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from powertrain.advise import Constraints, advise, make_request
from powertrain.advise.powercap import cap_sweep, default_caps, knee
from powertrain.analyze.synthetic import write_run, write_sweep
from powertrain.cli import app
from powertrain.core.yamlfile import DuplicateKeyError, load_yaml
from powertrain.plan.sweep_spec import SpecError, parse_sweep_spec
from powertrain.predict import load_calibration
from powertrain.predict.published import read_published
from powertrain.schema import EVENTS_SCHEMA
from powertrain.spec.run import RunConfig
from powertrain.store.validate import RUN_SCHEMA, DamagedRun, check_run

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(argv: list[str], root: Path, words: list[str], exit_code: int) -> str:
    """Run ``argv``: exit ``exit_code``, one line on stderr holding every one of ``words``, no traceback, and
    every file under ``root`` as it was."""
    before = _digests(root)
    res = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == exit_code, (res.exit_code, res.stdout, res.stderr)
    assert "Traceback" not in res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert _digests(root) == before
    return lines[0]


# --- spec files ------------------------------------------------------------------------------------------

RUN = "name: door\nmodel: gpt3-tiny\n"
SWEEP = "name: door\nbase: {model: gpt3-tiny}\n"
COMMANDS = {
    "plan": lambda spec: ["plan", str(spec)],
    "predict": lambda spec: ["predict", str(spec), "--out", str(spec.parent / "results")],
    "sweep": lambda spec: ["sweep", str(spec), "--out", str(spec.parent / "results")],
    "run-check": lambda spec: ["run", str(spec), "--check"],
}
DUP = "duplicate key"
BOOL = "is a boolean"
# (id, spec text, words of the one line besides the file name, {command: exit code}). A duplicate key or an
# overlap is refused as the file is read (2); a boolean value makes the configuration invalid, and a sweep
# whose every run is invalid has nothing to launch or predict (1); `run` takes no sweep spec.
ALL2 = {"plan": 2, "predict": 2, "sweep": 2, "run-check": 2}
SWEEP2 = {"plan": 2, "predict": 2, "sweep": 2}
INVALID = {"plan": 1, "predict": 1, "sweep": 1, "run-check": 2}
SPEC_CASES: list[tuple[str, str, list[str], dict[str, int]]] = [
    ("dup-key-flow", RUN + "layout: {tp: 1, pp: 1, tp: 2}\n", ["line 3", DUP, "'tp'", "first on line 3"], ALL2),
    ("two-model-keys", RUN + "model: llama3-tiny\n", ["line 3", DUP, "'model'", "first on line 2"], ALL2),
    ("dup-key-nested-block", RUN + "knobs:\n  micro_batch: 1\n  global_batch: 8\n  micro_batch: 2\n",
     ["line 6", DUP, "'micro_batch'"], ALL2),
    ("dup-key-in-grid", SWEEP + "grid:\n  - {layout.tp: [1, 2], layout.tp: [4]}\n", ["line 4", DUP, "'layout.tp'"],
     SWEEP2),
    ("dup-variant", SWEEP + "grid: [{variant: [a]}]\nvariants:\n  a: {knobs.seed: 1}\n  a: {knobs.seed: 2}\n",
     ["line 6", DUP, "'a'"], SWEEP2),
    ("tp-true", RUN + "layout: {tp: true}\n", ["layout.tp", BOOL], INVALID),
    ("micro-batch-yes", RUN + "knobs: {micro_batch: yes}\n", ["knobs.micro_batch", BOOL], INVALID),
    ("nodes-on", RUN + "hardware: {nodes: on}\n", ["hardware.nodes", BOOL], INVALID),
    ("lr-true", RUN + "knobs: {lr: true}\n", ["knobs.lr", BOOL], INVALID),
    ("bool-in-int-list", RUN + "profile: {steps: [1, false]}\n", ["profile.steps", "item 1 (false)", BOOL], INVALID),
    ("model-layers-true", "name: door\nmodel: {family: gpt, layers: true, hidden: 64, ffn: 256, heads: 4, "
     "kv_heads: 4, vocab: 256, seq_len: 64}\n", ["model.layers", BOOL], INVALID),
    ("launch-retries-yes", SWEEP + "launch: {retries: yes}\n", ["launch.retries", BOOL], SWEEP2),
    ("grid-groups-overlap", SWEEP + "grid:\n  - layout.tp: [1, 2]\n  - knobs.seed: [1]\n  - layout.tp: [4]\n",
     ["grid[0] and grid[2] both set layout.tp", "set each axis in one group"], SWEEP2),
    ("grid-zip-overlaps-axis", SWEEP + "grid:\n  - layout.tp: [1, 2]\n  - zip: {layout.pp: [1], layout.tp: [2]}\n",
     ["grid[0] and grid[1] both set layout.tp"], SWEEP2),
    ("grid-section-mapping-overlaps", SWEEP + "grid:\n  - cases: [{layout: {tp: 2}}]\n  - layout.tp: [1]\n",
     ["grid[0] and grid[1] both set layout.tp"], SWEEP2),
]


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(("case", "text", "words", "codes"), SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_a_spec_value_the_door_refuses(case, text, words, codes, command, tmp_path) -> None:
    if command not in codes:
        pytest.skip("`run` takes one configuration, not a sweep spec")
    spec = tmp_path / f"{case}.yaml"
    spec.write_text(text)
    _refused(COMMANDS[command](spec), tmp_path, [spec.name, *words], codes[command])
    assert not (tmp_path / "results").exists()


def test_what_the_door_lets_through() -> None:
    # a key that overrides one a `<<` merge brought in is what merging is for, not a duplicate
    raw = load_yaml("a: &a {tp: 1, pp: 2}\nb: {<<: *a, tp: 4}\n", "m.yaml")
    assert raw["b"] == {"tp": 4, "pp": 2}
    # booleans where the field takes one; numbers where it takes a number
    cfg = RunConfig.model_validate({"model": "gpt3-tiny", "layout": {"tp": 1, "sequence_parallel": True},
                                    "knobs": {"micro_batch": 2, "lr": 1, "overlap": {"async_tp": False}}})
    assert cfg.knobs.micro_batch == 2 and cfg.layout.sequence_parallel is True
    # two groups on different axes, and mappings under one section on different keys, are a product
    spec = parse_sweep_spec({"name": "s", "base": {"model": "gpt3-tiny"},
                             "grid": [{"layout": {"tp": 1}}, {"layout": {"pp": 1}}, {"layout.cp": [1]}]})
    assert len(spec.grid) == 3
    with pytest.raises(SpecError, match=r"grid\[0\] and grid\[1\] set model and model\.layers"):
        parse_sweep_spec({"name": "s", "base": {"model": "gpt3-tiny"},
                          "grid": [{"model": ["gpt3-tiny"]}, {"model.layers": [2]}]})


def test_every_example_spec_and_packaged_yaml_still_reads() -> None:
    data = [*(REPO / "src/powertrain/predict/data").glob("*.yaml"), REPO / "src/powertrain/hardware/catalog.yaml",
            *(REPO / "src/powertrain/predict/calibrations").glob("*.yaml"), *(REPO / "examples").glob("*.yaml")]
    for f in data:
        text = f.read_text()
        got = load_yaml(text, f)  # no duplicate key anywhere the project ships
        assert json.dumps(got, default=str) == json.dumps(yaml.safe_load(text), default=str), f


# --- the other YAML the project reads --------------------------------------------------------------------

def test_a_hardware_file_with_a_repeated_key_is_refused_with_its_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POWERTRAIN_HARDWARE", "")  # `predict --hardware` appends to it
    hw = tmp_path / "hw.yaml"
    hw.write_text("devices:\n  my-gpu:\n    tdp_w: 700\n    tdp_w: 500\n")
    spec = tmp_path / "run.yaml"
    spec.write_text(RUN + "hardware: {device: h100}\n")
    _refused(["predict", str(spec), "--hardware", str(hw), "--out", str(tmp_path / "results")], tmp_path,
             ["hw.yaml, line 4", DUP, "'tdp_w'", "first on line 3"], 1)
    assert not (tmp_path / "results").exists()


def test_a_profile_with_a_repeated_key_is_refused_with_its_line(tmp_path) -> None:
    prof = tmp_path / "prof.yaml"
    prof.write_text("name: p\ncoefficients:\n  gemm_eff_16: 0.7\n  gemm_eff_16: 0.8\n")
    spec = tmp_path / "run.yaml"
    spec.write_text(RUN)
    _refused(["predict", str(spec), "--profile", str(prof), "--out", str(tmp_path / "results")], tmp_path,
             [f"{prof}, line 4", DUP, "'gemm_eff_16'"], 2)
    with pytest.raises(DuplicateKeyError, match=r"prof\.yaml, line 4, column 3: duplicate key 'gemm_eff_16'"):
        load_calibration(prof)


def test_a_published_run_table_with_a_repeated_key_is_refused_with_its_line(tmp_path) -> None:
    table = tmp_path / "runs.yaml"
    table.write_text("meta: {source: x}\nruns:\n  - {model: llama3-8b, gpus: 8, gpus: 16}\n")
    with pytest.raises(DuplicateKeyError, match=r"runs\.yaml, line 3, column 33: duplicate key 'gpus'") as info:
        read_published(table)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


# --- a run directory from a newer powertrain ---------------------------------------------------------------

@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("runs") / "good", hosts=1, devices_per_host=2, steps=3)


def _with_schema(run: Path, schema: object) -> None:
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "schema": schema}))


@pytest.mark.parametrize("command", ["summarize", "report", "trace", "compare"])
def test_a_run_from_a_newer_powertrain_is_refused(command, pristine, tmp_path) -> None:
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    _with_schema(run, "powertrain.run/2")
    args = {"summarize": ["summarize", str(run)], "report": ["report", str(run), "--formats", "png"],
            "trace": ["trace", str(run), "-o", str(tmp_path / "t.json")],
            "compare": ["compare", str(pristine), str(run)]}[command]
    before = _digests(tmp_path)
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{run}: run.json: schema powertrain.run/2 is newer" in lines[0], res.output
    assert RUN_SCHEMA in lines[0] and "upgrade" in lines[0]
    assert _digests(tmp_path) == before


def test_the_schema_versions_this_code_reads(pristine, tmp_path) -> None:
    for schema, ok in ((RUN_SCHEMA, True), ("powertrain.run/0", True), ("someone.else/7", True),
                       ("powertrain.run/10", False), ("powertrain.run/x", False), (3, False)):
        run = tmp_path / str(schema).replace("/", "-")
        shutil.copytree(pristine, run)
        _with_schema(run, schema)
        if ok:
            check_run(run)
        else:
            with pytest.raises(DamagedRun, match="schema"):
                check_run(run)


def test_a_sweep_skips_a_newer_run_with_its_line(tmp_path) -> None:
    sweep = write_sweep(tmp_path / "sweep")
    _with_schema(sweep / "tp2pp1", "powertrain.run/9")
    res = runner.invoke(app, ["summarize", str(sweep), "-q"])
    assert res.exit_code == 1, res.output
    skipped = [ln for ln in res.output.splitlines() if ln.startswith("skipped damaged run: ")]
    assert len(skipped) == 1 and f"{sweep / 'tp2pp1'}: run.json: schema powertrain.run/9 is newer" in skipped[0]
    assert "tp2pp1" not in pq.read_table(sweep / "summary.parquet").column("id").to_pylist()


# --- calibrate: no profile worse than its base -------------------------------------------------------------

PROBE = {"matmul_flops": 1.5e11, "copy_bytes_per_s": 2.0e10, "threads": 1, "cores": 2, "method": "fixture"}


def _measured(root: Path, name: str, step_s: float) -> Path:
    from powertrain.store import RunDir

    cfg = RunConfig(name=name, model="llama3-tiny", knobs={"global_batch": 8, "micro_batch": 1},
                    hardware={"nodes": 1, "devices_per_node": 1, "device": "cpu"})
    rd = RunDir(root / name).create()
    rd.write({"kind": "run", "status": "ok", "name": name, "config": cfg.model_dump(mode="json"), "host_probe": PROBE})
    rows = [{"rank": 0, "kind": "step", "name": "step", "step": s, "t_start_ns": int(s * 10e9),
             "t_end_ns": int(s * 10e9 + step_s * 1e9), "window": "warmup" if s < 2 else "measured"} for s in range(6)]
    pq.write_table(pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA), rd.events_file(0))
    return rd.path


def test_calibrate_refuses_a_fit_worse_than_its_base_unless_told(tmp_path, monkeypatch) -> None:
    import powertrain.predict.calibrate as calibrate

    profiles = tmp_path / "profiles"
    monkeypatch.setenv("POWERTRAIN_PROFILES", str(profiles))
    runs = [str(_measured(tmp_path, n, t)) for n, t in (("a", 1.0), ("b", 1.3))]
    real = calibrate.fit_calibration

    def worse(*args, **kw):  # the real fit, with the errors of the audit's case: 13,333 % against its base's 12.7 %
        cal = real(*args, **kw)
        return replace(cal, error={**cal.error, "step_time_mape": 133.33, "step_time_mape_before": 0.127})

    monkeypatch.setattr(calibrate, "fit_calibration", worse)
    line = _refused(["calibrate", *runs, "--name", "bad"], tmp_path,
                    ["worse than the base profile 'default'", "13333.00%", "12.70%", "--allow-worse"], 2)
    assert "nothing was written" in line and not profiles.exists()
    res = runner.invoke(app, ["calibrate", *runs, "--name", "bad", "--allow-worse"])
    assert res.exit_code == 0, res.output
    assert (profiles / "bad.yaml").is_file()


def test_calibrate_writes_a_fit_no_worse_than_its_base(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POWERTRAIN_PROFILES", str(tmp_path / "profiles"))
    runs = [str(_measured(tmp_path, n, t)) for n, t in (("a", 1.0), ("b", 1.3))]
    res = runner.invoke(app, ["calibrate", *runs, "--name", "good"])
    assert res.exit_code == 0, res.output
    err = load_calibration("good").error
    assert err["step_time_mape"] <= err["step_time_mape_before"]


# --- advise: nothing above --power-cap ---------------------------------------------------------------------

SITE_W = 400.0


def test_advise_ranks_no_cap_above_the_site_cap_and_its_knee_stays_under_it() -> None:
    req = make_request("mixtral-8x7b-tiny", "h100", 4, 1, 8, max_vp=2, power_caps=[300, 500, 700, None],
                       constraints=Constraints(power_cap_w=SITE_W))
    tdp = req.device.tdp_w
    assert tdp > SITE_W and all(c is not None and c <= SITE_W for c in req.power_caps)
    adv = advise(req, load_calibration(), top_n=5)
    caps = [p.cand.case.power_limit_w for p in adv.points]
    assert caps and all(c is not None and c <= SITE_W for c in caps)  # None would be the default limit, the TDP
    assert {300, SITE_W} <= set(caps)  # 500 and 700 became the site's cap; 300 stays
    assert all(r.point.cand.case.power_limit_w <= SITE_W for r in adv.top)
    # the knee of #1 is swept under the site cap only
    pts = cap_sweep(replace(adv.top[0].point.cand.case, power_limit_w=None), load_calibration(),
                    default_caps(adv.top[0].point.cand.case, site_cap=SITE_W))
    assert all(p.cap_w is not None and p.cap_w <= SITE_W for p in pts) and pts[0].cap_w == SITE_W
    assert knee(pts).cap_w <= SITE_W
    assert default_caps(adv.top[0].point.cand.case, site_cap=tdp + 100)[0] is None  # no bind: the default limit


def test_advise_prints_no_knee_above_the_site_cap() -> None:
    res = runner.invoke(app, ["advise", "-m", "mixtral-8x7b-tiny", "--hardware", "h100", "-g", "4", "-b", "8",
                              "--max-vp", "2", "--top", "3", "--power-cap", f"{SITE_W:g}", "--power-caps", "300,700"],
                        env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    (knee_line,) = [ln for ln in res.output.splitlines() if ln.startswith("power caps for #1")]
    watts = float(knee_line.split("lowest J/token at ")[1].split(" W")[0])
    assert watts <= SITE_W, knee_line
    assert "default limit" not in res.output
