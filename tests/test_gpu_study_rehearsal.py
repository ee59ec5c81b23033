"""``scripts/gpu_study.sh`` and ``scripts/gpu_check.sh`` rehearsed on this GPU-less machine.

``gpu_study.sh --rehearse`` goes through every step of the one-GPU study — specs, predictions first,
runs under the sampler, summaries, one report, the predicted-vs-measured table — on a CPU spec
(examples/rehearsal-llama-cpu.yaml) with the NVML stand-in (tests/standins/nvml_shim) as ``pynvml``
of every process, so the NVIDIA backend sees one stand-in GPU. The table must label the stand-in's
figures as such: nothing in it may read as measured on a GPU.

``gpu_check.sh --rehearse`` runs its checks and its training step the same way: the stand-in GPU's
power follows the load of the program that samples it (``cpu_load``) and its temperatures and SM
clock follow that power, so the burn on this CPU (``gpu_check --cpu``) must make every check pass,
and its report must say REHEARSAL. Without ``--rehearse`` and without a CUDA torch, both scripts
refuse in one place (exit 2; they share the Python selection of scripts/gpu_common.sh).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from powertrain.control.ledger import LEDGER_ENV
from standins.nvml_state import read_state

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
MICRO_BATCHES = ("1", "2")
METRICS = ("step time (ms)", "tokens/s", "mean power (W)", "peak power (W)", "energy per token (J)", "SM clock (MHz)")
STANDIN = "stand-in (rehearsal)"


def _study(folder: Path) -> dict:
    """The rehearsal as a user runs it: the script writes its own stand-in state under OUT_DIR."""
    env = {**os.environ, "PYTHON": sys.executable, LEDGER_ENV: str(folder / "ledger.json")}
    for var in ("POWERTRAIN_GPU_STUDY_REHEARSE", "FAKE_NVML_STATE"):
        env.pop(var, None)
    res = subprocess.run(["bash", str(SCRIPTS / "gpu_study.sh"), str(folder / "out"), "--rehearse"],
                         env=env, capture_output=True, text=True, timeout=600)
    return {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr, "out": str(folder / "out"),
            "state": str(folder / "out" / "stand-in-gpus.json")}


@pytest.fixture(scope="session")
def study(build_once: Callable[[str, Callable[[Path], object]], object]) -> dict:
    result = build_once("gpu-study-rehearsal", _study)
    assert isinstance(result, dict)
    return result


def _table(md: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert len(lines) >= 3, md
    split = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    assert set("".join(split[1])) <= {"-"}  # the separator row
    return split[0], split[2:]


def _legs(out: Path) -> list[str]:
    return sorted(p.name.split("-", 1)[1] for p in (out / "runs").iterdir() if p.name.startswith("mb1-"))


@pytest.mark.slow
def test_rehearsal_runs_every_step_and_exits_0(study):
    assert study["rc"] == 0, study["stdout"][-3000:] + study["stderr"][-3000:]
    assert "REHEARSAL on the NVML stand-in" in study["stdout"]
    out = Path(study["out"])
    for mb in MICRO_BATCHES:
        spec = (out / "specs" / f"mb{mb}.yaml").read_text()
        assert f"micro_batch: {mb}" in spec and "global_batch: 2" in spec  # the largest micro-batch
    assert (out / "runs" / "report" / "report.html").is_file()
    assert (out / "runs" / "summary.parquet").is_file()
    # the study sets no device control: the stand-in GPU's settings were never touched
    (gpu,) = read_state(Path(study["state"]))
    assert gpu.history == [] and gpu.power_limit_mw == gpu.power_default_mw and gpu.sm_lock is None


@pytest.mark.slow
def test_predictions_are_made_before_the_runs(study):
    out = Path(study["out"])
    starts = []
    for mb in MICRO_BATCHES:
        for leg in _legs(out):
            starts.append(json.loads((out / "runs" / f"mb{mb}-{leg}" / "run.json").read_text())["start_ns"])
    assert len(starts) >= len(MICRO_BATCHES)
    for mb in MICRO_BATCHES:
        pred = out / "predicted" / f"mb{mb}"
        assert json.loads((pred / "run.json").read_text())["kind"] == "prediction"
        for f in ("run.json", "summary.json"):
            assert (pred / f).stat().st_mtime_ns < min(starts), f"mb{mb}/{f} written after a run started"


@pytest.mark.slow
def test_each_run_has_its_run_json_telemetry_and_summary(study):
    out = Path(study["out"])
    legs = _legs(out)
    assert "20hz" in legs
    for mb in MICRO_BATCHES:
        for leg in legs:
            run = out / "runs" / f"mb{mb}-{leg}"
            info = json.loads((run / "run.json").read_text())
            assert info["kind"] == "run" and info["status"] == "ok"
            assert info["stand_in"] == {"device": "h200", "ran_on": "cpu"}
            assert info["sampler"]["rate_hz"] == 20.0
            assert info["config"]["knobs"]["micro_batch"] == int(mb)
            assert any(d["vendor"] == "nvidia" for d in info["devices"])  # the NVIDIA backend saw the stand-in
            assert list((run / "telemetry").glob("*.parquet"))
            assert json.loads((run / "summary.json").read_text())["status"] == "ok"


@pytest.mark.slow
def test_the_table_has_predicted_and_stand_in_columns_per_micro_batch(study):
    out = Path(study["out"])
    md = (out / "gpu_study.md").read_text()
    head, rows = _table(md)
    assert head[:3] == ["micro-batch", "power path", "status"]
    for m in METRICS:
        assert f"{m}, predicted" in head and f"{m}, {STANDIN}" in head
    legs = _legs(out)
    assert sorted(r[0] for r in rows) == sorted(MICRO_BATCHES * len(legs))  # a row per micro-batch and leg
    assert all(r[2] == "ok" for r in rows)
    col = {name: i for i, name in enumerate(head)}
    for r in rows:
        pred = json.loads((out / "predicted" / f"mb{r[0]}" / "summary.json").read_text())["metrics"]
        assert r[col["tokens/s, predicted"]] == f"{pred['tokens_per_s']:,.0f}"
        assert r[col["step time (ms), predicted"]] == f"{pred['step_time_mean_s'] * 1e3:.1f}"


@pytest.mark.slow
def test_no_figure_in_the_table_reads_as_measured_on_a_gpu(study):
    """The stand-in's figures are labelled stand-in (rehearsal) and are exactly the stand-in's own
    device entry in the run's summary: nothing is made up, nothing claims a GPU."""
    out = Path(study["out"])
    md = (out / "gpu_study.md").read_text()
    head, rows = _table(md)
    assert not any("measured" in h for h in head)
    assert "Rehearsal, not a measurement" in md and "No GPU was read" in md
    col = {name: i for i, name in enumerate(head)}
    legs = {"polled 20 Hz": "20hz", "20 Hz + NVML buffer": "buffer"}
    for r in rows:
        summ = json.loads((out / "runs" / f"mb{r[0]}-{legs[r[1]]}" / "summary.json").read_text())
        (gpu,) = [d for d in summ["per_device"] if d["kind"] == "gpu"]
        assert gpu["ranks"] == []  # the ranks ran on the CPU: the stand-in GPU is attributed to none
        assert r[col[f"mean power (W), {STANDIN}"]] == f"{gpu['power_mean_w']:.1f}"
        assert r[col[f"peak power (W), {STANDIN}"]] == f"{gpu['power_peak_w']:.1f}"
        assert r[col[f"SM clock (MHz), {STANDIN}"]] == f"{gpu['clock_sm_mean_mhz']:.0f}"
        assert r[col[f"tokens/s, {STANDIN}"]] == f"{summ['metrics']['tokens_per_s']:,.0f}"
    assert re.search(r"every prediction before every run", md)


# -- the shell paths that need no GPU ----------------------------------------------------------------------


def _hermetic_copy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The two scripts and their common part in a folder of their own (no .venv, no .venv-gpu), with
    this session's CPU-torch Python as $PYTHON and as the only python3 on PATH."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this Python's torch sees a CUDA GPU: the scripts would run, not refuse")
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for name in ("gpu_check.sh", "gpu_study.sh", "gpu_common.sh"):
        shutil.copy2(SCRIPTS / name, root / "scripts" / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PYTHON": sys.executable, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("POWERTRAIN_GPU_STUDY_REHEARSE", None)
    return root, env


def _header(script: Path) -> str:
    lines = script.read_text().splitlines()
    end = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    return "\n".join(re.sub(r"^# ?", "", ln) for ln in lines[1:end]) + "\n"


@pytest.mark.parametrize("name", ["gpu_check.sh", "gpu_study.sh"])
def test_help_is_the_header_comment(name):
    res = subprocess.run(["bash", str(SCRIPTS / name), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip()
    assert res.stdout == _header(SCRIPTS / name)
    assert "Exit 0" in res.stdout and "--install-torch" in res.stdout and "OUT_DIR" in res.stdout


@pytest.mark.slow
def test_gpu_check_rehearsal_passes_every_check_and_says_it_is_a_rehearsal(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, LEDGER_ENV: str(tmp_path / "ledger.json")}
    env.pop("FAKE_NVML_STATE", None)
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh"), str(out), "--rehearse"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["rehearsal"] is True and report["passed"] is True
    names = {c["name"] for c in report["checks"] if c["passed"]}
    assert {"power rises", "energy agrees with power", "temp_c moves", "clock_sm_mhz moves",
            "throttle reasons read", "sampling keeps up"} <= names
    assert report["burn"]["on"].startswith("this CPU")
    md = (out / "gpu_check.md").read_text()
    assert md.startswith("# GPU check — REHEARSAL, burn on this CPU") and "ALL CHECKS PASSED" in md
    assert "device-controls step not rehearsed" in res.stdout
    train = json.loads((out / "train" / "run.json").read_text())
    assert train["status"] == "ok" and train["stand_in"] == {"device": "h200", "ran_on": "cpu"}
    assert any(d["vendor"] == "nvidia" for d in train["devices"])
    for run in ("run", "train"):
        assert (out / run / "report" / "report.html").is_file()
    (gpu,) = read_state(out / "stand-in-gpus.json")
    assert gpu.history == [] and gpu.power_limit_mw == gpu.power_default_mw  # no setting was touched


def test_gpu_check_without_a_cuda_gpu_says_so_and_exits_2(tmp_path):
    root, env = _hermetic_copy(tmp_path)
    res = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.splitlines() == [
        f"gpu_check: no Python here has a torch that sees a CUDA GPU (tried {sys.executable}, .venv, .venv-gpu, "
        "python3).",
        "gpu_check: rerun with --install-torch to put the CUDA build of torch==2.13.0 into .venv, or set "
        "PYTHON=/path/to/python."]
    assert res.stdout.startswith("gpu_check: nvidia-smi")
    assert not (tmp_path / "out").exists()


def test_gpu_study_without_a_cuda_gpu_says_so_in_one_line_and_exits_2(tmp_path):
    root, env = _hermetic_copy(tmp_path)
    res = subprocess.run(["bash", str(root / "scripts" / "gpu_study.sh"), str(tmp_path / "out")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith("gpu_study: cannot run here: no Python has a torch that sees a CUDA GPU")
    assert res.stdout == "" and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "says"), [
    (["--bogus"], "unknown option --bogus"), (["a", "b"], "one OUT_DIR only"), (["--steps"], "--steps needs a value"),
    (["--steps", "0"], "--steps wants a whole number"), (["--micro-batches", "1,,2"], "--micro-batches wants"),
])
def test_gpu_study_refuses_bad_options_with_exit_2(tmp_path, args, says):
    res = subprocess.run(["bash", str(SCRIPTS / "gpu_study.sh"), *args], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert res.returncode == 2 and says in res.stderr


@pytest.mark.slow
def test_a_configuration_the_spec_rules_refuse_stops_the_study_before_any_prediction(tmp_path):
    """Micro-batch 2 and 3 at global batch 3: 3 is not a multiple of 2, refused by `run --check`: exit 1."""
    env = {**os.environ, "PYTHON": sys.executable, LEDGER_ENV: str(tmp_path / "ledger.json")}
    env.pop("FAKE_NVML_STATE", None)
    res = subprocess.run(["bash", str(SCRIPTS / "gpu_study.sh"), str(tmp_path / "out"), "--rehearse",
                          "--micro-batches", "2,3"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "mb2.yaml is refused" in res.stderr and "global_batch" in res.stderr
    assert not list((tmp_path / "out" / "predicted").iterdir()) and not list((tmp_path / "out" / "runs").iterdir())


def test_gpu_study_refuses_an_out_dir_that_holds_a_study(tmp_path):
    (tmp_path / "out" / "runs").mkdir(parents=True)
    res = subprocess.run(["bash", str(SCRIPTS / "gpu_study.sh"), str(tmp_path / "out"), "--rehearse"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "already holds a study" in res.stderr
