"""Several tasks per node: ``srun -n N powertrain monitor --out DIR -- CMD`` makes one run with one
sampler per node. Task 0 owns the run; the first task of every other node attaches its node's sampler;
every task runs the command and leaves an exit record (a filesystem every node shares is assumed)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from powertrain.monitor import Monitor, MonitorError, wait_for_shared_file
from powertrain.shared_fs import wait_for_records, wait_node_samplers
from powertrain.store.rundir import RunDir, default_host, write_json_atomic
from powertrain.supervise import Supervised, supervise
from powertrain.telemetry.clock import DEFAULT_RATE_HZ

log = logging.getLogger(__name__)

TASK_WAIT_S = 300.0


def slurm_task(environ: Mapping[str, str] | None = None) -> dict[str, int] | None:
    """This process's place in a Slurm job step with more than one task, or ``None``.

    Read from ``SLURM_STEP_NUM_TASKS`` (set by ``srun`` for its tasks, not in a batch script),
    ``SLURM_PROCID``, ``SLURM_LOCALID`` and ``SLURM_STEP_NUM_NODES``.
    """
    e = os.environ if environ is None else environ
    try:
        ntasks = int(e["SLURM_STEP_NUM_TASKS"])
        task = {"ntasks": ntasks, "procid": int(e["SLURM_PROCID"]), "localid": int(e["SLURM_LOCALID"]),
                "nnodes": int(e.get("SLURM_STEP_NUM_NODES") or e.get("SLURM_NNODES") or 1)}
    except (KeyError, ValueError):
        return None
    return task if ntasks > 1 else None


def task_marker(run: RunDir, procid: int) -> Path:
    """``logs/task-<i>.exit.json``: the exit record every task leaves."""
    return run.logs_dir / f"task-{procid}.exit.json"


def run_task_command(
    argv: Sequence[str],
    out: str | os.PathLike[str],
    task: Mapping[str, int],
    *,
    rate_hz: float = DEFAULT_RATE_HZ,
    backends: Sequence[str] | str = "auto",
    echo: bool = True,
    on_output: Callable[[bytes, str], None] | None = None,
    prometheus: str | None = None,
    task_wait_s: float = TASK_WAIT_S,
    on_exit: Callable[[], None] | None = None,
    warmup_steps: int = 0,
    power_buffer: bool = True,
) -> tuple[int, dict[str, Any]]:
    """One task of ``srun -n N powertrain monitor --out DIR -- CMD``: one run, one sampler per node.

    Task 0 (``SLURM_PROCID=0``) creates the run and samples its node; the first task of every other
    node (``SLURM_LOCALID=0``) only starts its node's sampler (:meth:`Monitor.attach`); the remaining
    tasks only run the command. Every task runs ``CMD`` with ``$POWERTRAIN_RUN_DIR`` and, where
    unset, ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` from Slurm, logs to ``logs/task-<i>.std*``
    and leaves ``logs/task-<i>.exit.json``; samplers run until every task has ended. DIR must be on
    a filesystem every node shares. Returns this task's exit code and (task 0) the final ``run.json``.
    ``warmup_steps`` is recorded by task 0 (see :func:`powertrain.monitor.run_command`).
    """
    if not argv:
        raise MonitorError("no command given: put it after `--`, e.g. powertrain monitor -- python train.py")
    procid, localid, ntasks = task["procid"], task["localid"], task["ntasks"]
    env = {k: str(v) for k, v in (("RANK", procid), ("LOCAL_RANK", localid), ("WORLD_SIZE", ntasks))
           if k not in os.environ}
    mon: Monitor | None = None
    run = RunDir(out)
    if procid == 0:
        mon = Monitor(out, rate_hz=rate_hz, backends=backends, command=list(argv), prometheus=prometheus,
                      warmup_steps=warmup_steps, power_buffer=power_buffer)
        mon.start()
        mon.info["slurm"] = {"tasks": ntasks, "nodes": task.get("nnodes", 1),
                             "job_id": os.environ.get("SLURM_JOB_ID")}
        mon.run.write(mon.info)
    elif localid == 0:
        mon = Monitor(out, rate_hz=rate_hz, backends=backends, prometheus=prometheus,
                      power_buffer=power_buffer).attach(task_wait_s)
    else:
        wait_for_shared_file(run.run_json, task_wait_s, "the run.json of task 0")
    try:
        res = supervise(argv, run, f"task-{procid}", echo=echo, on_output=on_output, env=env,
                        on_tick=mon.warn_if_sampler_died if mon is not None else None)
    except OSError as exc:
        log.error("powertrain: task %s could not start the command: %s", procid, exc)
        res = Supervised(code=127, received=[])
    code = res.code
    if on_exit is not None:
        on_exit()
    write_json_atomic(task_marker(run, procid), {"procid": procid, "localid": localid, "host": default_host(),
                                                  "exit_code": code, "end_ns": time.time_ns(),
                                                  "logs_lost": res.log_loss})
    if mon is None:
        return code, {}
    done, missing = wait_for_records([task_marker(run, i) for i in range(ntasks)], task_wait_s)
    if procid != 0:
        mon.detach()
        return code, {}
    if task.get("nnodes", 1) > 1:
        wait_node_samplers(run, task["nnodes"])
    mon.log_loss = [x for d in done.values() for x in d.get("logs_lost") or []]
    status, reason = res.outcome()
    failed = [f"task {i} exited with code {d.get('exit_code')}" for i, d in sorted(done.items())
              if d.get("exit_code") not in (0, None) and i != 0]
    if missing:
        failed.append(f"tasks {missing} left no exit record within {task_wait_s:.0f} s")
    if failed:
        status, reason = "failed", "; ".join(filter(None, [reason, *failed]))
    return code, mon.stop(status, reason, exit_code=code)
