"""`srun -n 2 powertrain monitor -- CMD` on one node: one sampler, one run directory, both tasks' events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

import powertrain

REPO = Path(__file__).resolve().parents[1]

USER_SCRIPT = """
import os, time
import powertrain
for i in range(3):
    with powertrain.step(i, samples=2):
        t = time.time()
        while time.time() - t < 0.2:
            pass
print("task", os.environ["SLURM_PROCID"], "rank", os.environ["RANK"], "done")
"""


@pytest.mark.slow
@pytest.mark.slurm
def test_two_tasks_on_one_node_share_one_sampler_and_one_run(slurm_conf, tmp_path):
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    out = tmp_path / "srun-run"
    res = subprocess.run(["srun", "-N1", "-n2", "--time=2", sys.executable, "-m", "powertrain.cli.__main__", "monitor",
                          "--out", str(out), "-q", "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "SLURM_CONF": slurm_conf})
    assert res.returncode == 0, res.stderr[-3000:]
    # one run directory with one node's sampler …
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["srun-run"]
    assert len(list((out / "telemetry").glob("*.meta.json"))) == 1
    assert len(list((out / "logs").glob("sampler-*.stderr"))) == 1
    log = next((out / "logs").glob("sampler-*.log")).read_text()
    assert log.count("sampling ") == 1  # started once, by task 0
    run = powertrain.load(out)
    assert run.status == "ok" and run.info["slurm"]["tasks"] == 2
    assert len(run.info["sampler_hosts"]) == 1 and run.telemetry.num_rows > 0
    # … and both tasks' work in it: their output, exit records and step events (RANK from Slurm)
    for task in (0, 1):
        assert f"task {task} rank {task} done" in (out / "logs" / f"task-{task}.stdout").read_text()
        assert json.loads((out / "logs" / f"task-{task}.exit.json").read_text())["exit_code"] == 0
        steps = run.steps.filter(pc.equal(run.steps["rank"], task))
        assert steps["step"].to_pylist() == [0, 1, 2]
    assert pc.max(run.steps["t_end_ns"]).as_py() <= run.info["end_ns"]  # the run closed after both tasks


@pytest.mark.slow
@pytest.mark.slurm
def test_a_failing_task_fails_the_run(slurm_conf, tmp_path):
    out = tmp_path / "fail-run"
    cmd = "import os, sys; sys.exit(3 if os.environ['SLURM_PROCID'] == '1' else 0)"
    res = subprocess.run(["srun", "-N1", "-n2", "--time=2", sys.executable, "-m", "powertrain.cli.__main__", "monitor",
                          "--out", str(out), "-q", "--", sys.executable, "-c", cmd],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "SLURM_CONF": slurm_conf})
    assert res.returncode != 0
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and "task 1 exited with code 3" in info["reason"]


def test_only_a_multi_task_srun_step_counts_as_tasks():
    from powertrain.slurm_tasks import slurm_task

    assert slurm_task({}) is None
    assert slurm_task({"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "8"}) is None  # batch script
    assert slurm_task({"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}) is None
    assert slurm_task({"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
                       "SLURM_STEP_NUM_NODES": "2"}) == {"ntasks": 4, "procid": 3, "localid": 1, "nnodes": 2}
