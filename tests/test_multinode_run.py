"""`powertrain run` across several nodes, simulated as two "nodes" on localhost: one run directory,
one sampler per node, every rank's events, a rank map with each node's host, the same losses as the
same ranks on one node; bad node options refused before anything starts; the multi-node sbatch script."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from powertrain.launch.local import slurm_nodes
from powertrain.launch.sweep import SweepOptions, sbatch_script
from powertrain.plan.sweep_spec import LaunchOptions
from powertrain.spec.run import RunConfig
from powertrain.store import read_events, read_telemetry
from powertrain.workload.equivalence import max_rel_diff

SPEC = {"name": "mn", "model": "llama3-tiny", "layout": {},  # dp = world = 2 (DDP)
        "knobs": {"micro_batch": 2, "global_batch": 4}, "hardware": {"nodes": 2, "devices_per_node": 1},
        "protocol": {"warmup_steps": 1, "measured_steps": 2}}


def _env(**extra: str) -> dict[str, str]:
    # Not under a Slurm job here, whatever the test runner's environment says; one thread per rank.
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "OMP_NUM_THREADS": "1", **extra}


def _start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "powertrain.cli", "run", *args, "--rate", "10", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(**(env or {})))


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """(exit code, stderr) of a started `powertrain run`."""
    _, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stderr


def _free_port() -> int:
    """A free port in the range ``slurm_nodes`` derives ports from (29500–39499), below the kernel's
    ephemeral range: no port the kernel hands out (torchrun --standalone, any client socket of a
    parallel test worker) can take it between this check and node 0's bind."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    ports = range(29500, min(39500, low))
    for port in random.sample(ports, min(200, len(ports))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip(f"no free port in 29500–{min(39500, low) - 1}")


def _write(path: Path, spec: dict) -> str:
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _losses(run_dir: Path) -> dict[int, list[float]]:
    ev = sorted((e for e in read_events(run_dir).to_pylist() if e["kind"] == "step"), key=lambda e: e["step"])
    return {r: [e["loss"] for e in ev if e["rank"] == r] for r in (0, 1)}


@pytest.mark.slow
def test_two_nodes_on_localhost_make_one_run_with_one_sampler_per_node(tmp_path):
    two = _write(tmp_path / "two.yaml", SPEC)
    one = _write(tmp_path / "one.yaml", {**SPEC, "hardware": {"nodes": 1, "devices_per_node": 2}})
    out, ref = tmp_path / "run", tmp_path / "ref"
    port = _free_port()
    # node 1 starts first and takes its node options from Slurm's environment, as under srun (the
    # port is derived from the job id); node 0 gets them on the command line.
    slurm = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_ID": str(port - 29500 + 10000),
             "SLURM_JOB_NODELIST": "127.0.0.1"}
    procs = [_start(two, "--out", str(out), "--host", "node1", env=slurm),
             _start(two, "--out", str(out), "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
                    "--master-port", str(port), "--host", "node0")]
    procs.append(_start(one, "--out", str(ref)))  # the same two ranks on one node, for the losses
    results = [_finish(p, 240) for p in procs]
    for code, stderr in results:
        assert code == 0, stderr[-3000:]
    assert "node 1 of run" in results[0][1]

    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "ok" and info["world"] == 2 and info["hosts"] == ["node0", "node1"]
    assert [(r["rank"], r["node"], r["host"], r["local_rank"], r["coords"]["dp"]) for r in info["rank_map"]] == \
        [(0, 0, "node0", 0, 0), (1, 1, "node1", 0, 1)]
    assert info["nodes"]["exits"]["1"]["status"] == "ok"
    # one sampler per node, each its own telemetry file, both closed cleanly
    assert sorted(p.name for p in (out / "telemetry").glob("*.meta.json")) == ["node0.meta.json", "node1.meta.json"]
    assert set(info["sampler_hosts"]) == {"node0", "node1"}
    assert all(s["finished"] for s in info["sampler_hosts"].values())
    assert set(read_telemetry(out).column("host").to_pylist()) == {"node0", "node1"}
    # every rank's events in the one run directory, and the losses of the same ranks on one node
    assert sorted(p.name for p in (out / "events").glob("*.parquet")) == ["rank-0.parquet", "rank-1.parquet"]
    got, want = _losses(out), _losses(ref)
    for r in (0, 1):
        assert len(got[r]) == 3 and all(x is not None for x in got[r])
        assert max_rel_diff(got[r], want[r]) < 1e-5, (r, got[r], want[r])


@pytest.mark.parametrize(("nodes", "args", "message"), [
    (1, ["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", "29999"],
     "asks for 1 node(s) but this launch has 2"),
    (2, [], "asks for 2 node(s) but this launch has 1"),  # not under Slurm: no node options to take
    (2, ["--nnodes", "2", "--node-rank", "0"], "--master-addr"),
    (2, ["--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "1"], "node rank 2 outside"),
])
def test_node_options_that_do_not_fit_the_spec_fail_before_anything_starts(tmp_path, nodes, args, message):
    spec = _write(tmp_path / "s.yaml", {**SPEC, "hardware": {"nodes": nodes, "devices_per_node": 1}})
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", "run", spec, "--out", str(out), *args],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert res.returncode == 2
    assert message in " ".join(res.stderr.split())
    assert not out.exists()


def test_multi_node_sbatch_script_runs_one_launcher_per_node_through_srun(tmp_path):
    run_dir = tmp_path / "sweep" / "r1"
    opts = SweepOptions(backend="slurm", python="python")
    two = RunConfig.model_validate({**SPEC, "hardware": {"nodes": 2, "devices_per_node": 4}})
    script = sbatch_script(opts, LaunchOptions(), two, tmp_path / "s.yaml", run_dir, 600)
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --ntasks-per-node=1\n" in script
    assert script.splitlines()[-1] == (f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 python -m powertrain.cli "
                                       f"run {tmp_path / 's.yaml'} --out {run_dir}")
    one = RunConfig.model_validate({**SPEC, "hardware": {"nodes": 1, "devices_per_node": 4}})
    script = sbatch_script(opts, LaunchOptions(), one, tmp_path / "s.yaml", run_dir, 600)
    assert script.splitlines()[-1].startswith("exec python -m powertrain.cli run ") and "srun" not in script


def test_node_options_from_a_slurm_job_step():
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_ID": "4321", "SLURM_JOB_NODELIST": "gpu7,gpu9"}
    assert slurm_nodes(env) == {"nnodes": 2, "node_rank": 1, "master_addr": "gpu7", "master_port": 29500 + 4321}
    step = {**env, "SLURM_NNODES": "4", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "gpu9,gpu7"}
    assert slurm_nodes(step)["nnodes"] == 2 and slurm_nodes(step)["master_addr"] == "gpu9"  # the step's nodes
    assert slurm_nodes({"SLURM_JOB_ID": "1"}) is None  # not inside a job step


@pytest.mark.slow
def test_a_failing_rank_on_another_node_fails_the_run(tmp_path):
    spec = _write(tmp_path / "s.yaml", SPEC)
    out, port = tmp_path / "run", str(_free_port())
    procs = [_start(spec, "--out", str(out), "--nnodes", "2", "--node-rank", str(r), "--master-addr", "127.0.0.1",
                    "--master-port", port, "--host", f"node{r}", env={"POWERTRAIN_FAULT": "1:1"}) for r in (0, 1)]
    codes = [_finish(p, 180)[0] for p in procs]
    assert codes == [1, 1]  # node 1's rank raised; node 0's torchrun was stopped with it
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and info["failed_rank"] == 1
    assert "injected fault (POWERTRAIN_FAULT) on rank 1 at step 1" in info["reason"]
    # node 0's rank failed on the closed connection: a consequence, not a second cause
    assert info["failure_cause"]["how"] == "error"
    assert [(c["rank"], c["how"]) for c in info["consequences"]] == [(0, "failed after rank 1")]
    assert info["nodes"]["exits"]["1"]["status"] == "failed"
    assert set(info["sampler_hosts"]) == {"node0", "node1"}  # both samplers closed, data kept
