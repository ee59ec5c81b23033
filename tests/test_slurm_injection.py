"""No command injection through a sweep's generated Slurm batch script.

Hostile values (a newline followed by ``touch PWNED``, ``$(…)``, backticks, ``;``, NUL, spaces) in
``launch.partition``, ``account``, ``qos``, ``slurm_extra`` and the sweep name are refused when the spec
is read, naming the field; the results folder path, which may legitimately hold odd characters, is
quoted — and a script generated into such a folder is run through the local Slurm: nothing injected
runs (the marker file never appears), the command receives exactly its arguments, and every
``#SBATCH`` line is honoured (checked against ``scontrol show job`` from inside the job).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from powertrain.launch.sweep import SweepError, SweepOptions, _launch_slurm, sbatch_script
from powertrain.plan.sweep_spec import LaunchOptions, SpecError, parse_sweep_spec
from powertrain.spec.run import RunConfig

MARK = "PWNED"
INJECTIONS = [
    f"debug\ntouch {MARK}",
    f"debug\r\ntouch {MARK}",
    f"$(touch {MARK})",
    f"`touch {MARK}`",
    f"debug;touch {MARK}",
    "debug\x00x",
    f"debug touch {MARK}",
    f'debug"\ntouch {MARK}\n"',
    "debug#comment",
]
BASE = {"model": "gpt3-tiny", "hardware": {"devices_per_node": 1}}


def _spec(**launch: object) -> dict:
    return {"name": "inj", "base": BASE, "launch": {"backend": "slurm", **launch}}


@pytest.mark.parametrize("field", ["partition", "account", "qos"])
@pytest.mark.parametrize("value", INJECTIONS, ids=lambda v: repr(v)[:24])
def test_hostile_slurm_names_are_refused_naming_the_field(field: str, value: str) -> None:
    with pytest.raises(SpecError, match=rf"launch\.{field}") as info:
        parse_sweep_spec(_spec(**{field: value}))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("option", [
    *(f"--comment={v}" for v in INJECTIONS),
    f"--comment=x\ntouch {MARK}",  # the newline after a valid option
    "--exclusive --comment=x",  # two options in one item
    "-N 2",  # short form
    "#SBATCH --exclusive",
    "--wrap=id",  # the script's own options are refused: they come from fields
    "--output=/tmp/x",
    "--partition=debug",
    "--time=5",
    "--outp=/tmp/x",  # sbatch reads a unique prefix as the whole option
    "--parti=debug",
])
def test_hostile_slurm_extra_is_refused_naming_the_item(option: str) -> None:
    with pytest.raises(SpecError, match=r"launch\.slurm_extra") as info:
        parse_sweep_spec(_spec(slurm_extra=["--exclusive", option]))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("where", ["name", "description-nul", "base.name", "variants", "grid-key"])
def test_newlines_and_nuls_anywhere_are_refused_with_the_field(where: str) -> None:
    bad = f"x\ntouch {MARK}"
    raw: dict = {"name": "inj", "base": dict(BASE)}
    field = where
    if where == "name":
        raw["name"] = bad
    elif where == "description-nul":
        raw["description"], field = "a\x00b", "description"
    elif where == "base.name":
        raw["base"]["name"] = bad
    elif where == "variants":
        raw["variants"], field = {"v": {"knobs.recompute": bad}}, "variants.v.knobs.recompute"
    else:
        raw["grid"], field = [{f"knobs.seed\n{MARK}": [1]}], "grid[0]"
    with pytest.raises(SpecError, match=re.escape(field)) as info:
        parse_sweep_spec(raw)
    assert "\n" not in str(info.value)


def test_a_multi_line_description_is_free_text() -> None:
    spec = parse_sweep_spec({"name": "ok", "description": "line one\nline two", "base": BASE})
    assert spec.description == "line one\nline two"


def test_safe_values_pass_and_reach_the_script_as_written(tmp_path: Path) -> None:
    launch = LaunchOptions(backend="slurm", partition="gpu,debug", account="proj_1.a-b", qos="high",
                           slurm_extra=["--exclusive", "--gres=gpu:8", "--constraint=[a100|h100]&ib",
                                        "--mail-user=me@example.org"])
    script = sbatch_script(SweepOptions(python="/usr/bin/python3"), launch, RunConfig(model="gpt3-tiny"),
                           tmp_path / ".specs" / "r.yaml", tmp_path / "r", 600)
    for line in ("#SBATCH --partition=gpu,debug", "#SBATCH --account=proj_1.a-b", "#SBATCH --qos=high",
                 "#SBATCH --exclusive", "#SBATCH --gres=gpu:8", "#SBATCH --constraint=[a100|h100]&ib",
                 "#SBATCH --mail-user=me@example.org", "#SBATCH --time=10"):
        assert line in script.splitlines()


def test_the_script_checks_again_whatever_built_the_options(tmp_path: Path) -> None:
    """Options made without validation (model_construct) still cannot reach the script."""
    cfg, opts = RunConfig(model="gpt3-tiny"), SweepOptions(python="/usr/bin/python3")
    for bad in ({"partition": f"debug\ntouch {MARK}"}, {"account": "a;b"}, {"qos": "$(id)"},
                {"slurm_extra": [f"--comment=x\ntouch {MARK}"]}):
        launch = LaunchOptions.model_construct(**{**LaunchOptions().model_dump(), **bad})
        with pytest.raises(SweepError, match=r"launch\."):
            sbatch_script(opts, launch, cfg, tmp_path / "s.yaml", tmp_path / "r", 600)
    for run_dir in (tmp_path / f"res\ntouch {MARK}" / "r", tmp_path / "r\x00x"):
        with pytest.raises(SweepError, match="results folder"):
            sbatch_script(opts, LaunchOptions(), cfg, tmp_path / "s.yaml", run_dir, 600)
    with pytest.raises(SweepError, match="backslash"):
        sbatch_script(opts, LaunchOptions(), cfg, tmp_path / "s.yaml", tmp_path / "a\\b" / "r", 600)
    assert not list(tmp_path.rglob(MARK))


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", ["partition-newline", "extra-backtick", "out-newline", "name-nul"])
def test_plan_and_sweep_refuse_hostile_specs_in_one_line(case: str, tmp_path: Path) -> None:
    import yaml

    spec = tmp_path / "s.yaml"
    args = ["plan", str(spec)]
    field = {"partition-newline": "launch.partition", "extra-backtick": "launch.slurm_extra",
             "out-newline": "--out", "name-nul": "name"}[case]
    raw = _spec(partition="debug")
    if case == "partition-newline":
        raw["launch"]["partition"] = f"debug\ntouch {tmp_path}/{MARK}"
    elif case == "extra-backtick":
        raw["launch"]["slurm_extra"] = [f"--comment=`touch {tmp_path}/{MARK}`"]
    elif case == "name-nul":
        raw["name"] = "inj\x00x"
    else:
        args = ["sweep", str(spec), "--out", str(tmp_path / f"res\ntouch {MARK}")]
    spec.write_text(yaml.safe_dump(raw))
    before = _digests(tmp_path)
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", *args], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert _digests(tmp_path) == before  # nothing written, nothing changed
    assert not list(tmp_path.rglob(MARK))


FAKE_PYTHON = """#!{python}
# Stands in for `python -m powertrain.cli run SPEC --out RUN`: records its argv and the job as Slurm sees it.
import json, os, subprocess, sys
argv = sys.argv[1:]
out = argv[argv.index("--out") + 1]
job = subprocess.run(["scontrol", "show", "job", os.environ["SLURM_JOB_ID"]], capture_output=True,
                     text=True).stdout
from powertrain.store import RunDir
run = RunDir(out).create()
run.write({{"status": "ok"}})
with open(os.path.join(out, "record.json"), "w") as f:
    json.dump({{"argv": argv, "job": job, "cwd": os.getcwd()}}, f)
"""

# Folder names that a shell would run something from, were the path not quoted (no newline: refused).
HOSTILE_FOLDERS = [
    f"res $(touch {MARK}) x",
    f"b`touch {MARK}`;touch {MARK}; echo 'q' \"dq\" #h %j 100%",
    f"${{IFS}}touch${{IFS}}{MARK}&&x|y>z<w",
]


def _scontrol(job: str, key: str) -> str:
    m = re.search(rf"(?:^|\s){re.escape(key)}=(.*?)(?=\s+\w[\w:/]*=|\s*$)", job, re.M)
    assert m, f"{key} not in {job}"
    return m.group(1)


@pytest.mark.slow
@pytest.mark.slurm
def test_scripts_in_hostile_folders_run_through_slurm_without_side_effects(slurm_conf, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    monkeypatch.chdir(tmp_path)  # a relative `touch PWNED` would land here
    bindir = tmp_path / f"bin $(touch {MARK})"
    bindir.mkdir()
    fake = bindir / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    launch = LaunchOptions(backend="slurm", partition="debug", account="acct_1",
                           slurm_extra=["--comment=pt-injection-test", "--nice=7"])
    cfg = RunConfig(model="gpt3-tiny")
    for name in HOSTILE_FOLDERS:
        folder = tmp_path / name
        folder.mkdir()
        spec_path = folder / ".specs" / "r1.yaml"
        spec_path.parent.mkdir()
        spec_path.write_text("model: gpt3-tiny\n")
        run_dir = folder / "r1"
        opts = SweepOptions(backend="slurm", python=str(fake), poll_s=0.2)
        reason = _launch_slurm(opts, launch, cfg, spec_path, run_dir, 180, lambda: False)
        outs = list((folder / ".launch").glob("r1-*.out"))
        assert reason is None, (reason, [o.read_text() for o in outs])
        rec = json.loads((run_dir / "record.json").read_text())
        # the command got exactly its words, hostile characters included
        assert rec["argv"] == ["-m", "powertrain.cli", "run", str(spec_path), "--out", str(run_dir)]
        job, job_id = rec["job"], (folder / ".launch" / "r1.jobid").read_text().strip()
        script = (folder / ".launch" / "r1.sbatch").read_text()
        directives = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
        assert len(directives) == 9, script
        # every #SBATCH line honoured
        assert _scontrol(job, "JobName").startswith("pt-") and _scontrol(job, "Partition") == "debug"
        assert _scontrol(job, "Account") == "acct_1" and _scontrol(job, "Comment") == "pt-injection-test"
        assert _scontrol(job, "Nice") == "7" and _scontrol(job, "TimeLimit") == "00:03:00"
        assert _scontrol(job, "NumNodes") == "1"
        # --output: the job's output file is where the directive says, `%` in the folder kept literally
        # (scontrol's own display of StdOut re-expands `%%`, so the file itself is the evidence)
        assert outs == [folder / ".launch" / f"r1-{job_id}.out"]
    assert not list(tmp_path.rglob(MARK)), "an injected command ran"
    assert not Path(MARK).exists() and not os.path.exists(f"/tmp/{MARK}")
