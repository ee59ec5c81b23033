"""Running a planned sweep: one run after another (local) or one Slurm job per run, resumable.

Every run is launched the same way, as ``powertrain run <resolved spec> --out <sweep>/<run-id>``
in its own process (locally) or inside its own Slurm job, so a crash of one run never takes the
sweep down and a run directory always has a single owner. The resolved spec holds what that run
applies (:func:`powertrain.spec.effective.as_single_run`); run.json's ``sweep`` entry records the
protocol settings the sweep applied around it and the knobs that changed nothing for its layout.
The sweep's state is :class:`powertrain.plan.state.SweepState`: ``sweep.json``, written when the sweep
starts and ends, and ``sweep.state.jsonl``, one line appended per change in between. Temporary files a
killed sweep left in its folder are removed when the next one takes the lock (:func:`_remove_leftovers`).

Before each run the protocol's gate is applied (wait ``cooldown_s``, or until the hottest device
is at or below ``cooldown_until_temp_c``), and an idle baseline is recorded once per sweep when the
protocol asks for one.

A Slurm job still pending after ``launch.pending_limit_min`` is cancelled and its run marked failed
saying so (:func:`_launch_slurm`); :class:`SlurmCommands` is the one place the sweep talks to Slurm.

Every file the sweep writes into its folder (``sweep.json``, ``.lock``, ``.specs/*.yaml``,
``.launch/*.sbatch|.jobid|.log``) takes the project's modes whatever the umask, and none is written
through a symbolic link: :func:`check_sweep_folder` refuses a folder with a link where the sweep keeps
its own files before anything is written, and every write refuses one again
(:func:`powertrain.store.rundir.write_text_atomic`, :func:`~powertrain.store.rundir.open_append`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from powertrain.plan.planner import Plan
from powertrain.plan.state import FINISHED, SpecChanged, SweepState, sweep_lock
from powertrain.spec.bounds import control_char
from powertrain.spec.effective import as_single_run, sweep_protocol, unused_knobs
from powertrain.spec.run import Protocol, RunConfig
from powertrain.spec.slurm import check_name, check_option, directive_word, job_name
from powertrain.store.leftovers import remove_stale
from powertrain.store.rundir import RunDir, current_umask, make_dir, open_append, write_text_atomic
from powertrain.store.sweep_log import LOG_FILE
from powertrain.store.tables import finalize_run_streams
from powertrain.store.targets import SWEEP_FILES, SWEEP_FOLDERS, WriteRefused, refuse_link

OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda out of memory", "oom-kill", "oom_kill", "memoryerror")
# squeue states after which a job does no more (it leaves squeue's list MinJobAge later)
JOB_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
             "PREEMPTED")
# bits a job never grants whatever the user's umask (sbatch passes its umask on to the job, which
# creates the job's output file and everything `powertrain run` writes): the project's 0640 / 0750
JOB_UMASK = 0o027


class SweepError(RuntimeError):
    """The sweep cannot start (folder holds another sweep, bad options); the message says what to do."""


@dataclass
class SweepOptions:
    backend: str = "local"
    resume: bool = False
    retry_failed: bool = False
    only: str | None = None
    interrupted: str = "rerun"  # what --resume does with a run that was running: "rerun" | "fail"
    time_limit_s: float | None = None
    python: str = sys.executable
    poll_s: float = 0.5
    allow_unapplied: bool = False  # passed to every `powertrain run`: device controls may stay unapplied
    rate_hz: float | None = None  # every run's sampling rate (--rate); the runner sets launch.sampler_rate_hz


def classify_failure(run_dir: Path) -> str:
    """``oom`` when the run died of memory exhaustion (its reason or a log tail says so), else ``failed``."""
    texts = []
    with contextlib.suppress(FileNotFoundError, ValueError):
        texts.append(str(RunDir(run_dir).read().get("reason") or ""))
    for log in sorted((run_dir / "logs").glob("*")) if (run_dir / "logs").is_dir() else []:
        try:
            with open(log, "rb") as f:
                f.seek(max(0, os.path.getsize(log) - 8192))
                texts.append(f.read().decode(errors="replace"))
        except OSError:
            continue
    blob = "\n".join(texts).lower()
    return "oom" if any(m in blob for m in OOM_MARKERS) else "failed"


def _max_device_temp() -> float | None:
    """Hottest device temperature on this node now, or None when no sensor exists."""
    from powertrain.telemetry.discover import open_backends

    backends, _ = open_backends("auto")
    temps = []
    try:
        for b in backends:
            temps += [r["temp_c"] for r in b.sample("gate") if r.get("temp_c") is not None]
    finally:
        for b in backends:
            b.close()
    return max(temps) if temps else None


def apply_gate(protocol: Protocol, read_temp: Callable[[], float | None] = _max_device_temp,
               sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Wait as the protocol says before a run; returns what happened (recorded in run.json)."""
    if protocol.cooldown_s <= 0:
        return {"waited_s": 0.0, "reason": "no cool-down asked"}
    t0 = time.monotonic()
    target = protocol.cooldown_until_temp_c
    temp = read_temp() if target is not None else None
    if target is not None and temp is None:
        sleep(protocol.cooldown_s)
        return {"waited_s": protocol.cooldown_s, "reason": "no temperature sensor: waited the full cool-down",
                "temp_c": None}
    while time.monotonic() - t0 < protocol.cooldown_s:
        if target is not None:
            temp = read_temp()
            if temp is not None and temp <= target:
                return {"waited_s": time.monotonic() - t0, "reason": f"temperature {temp:.1f} °C ≤ {target} °C",
                        "temp_c": temp}
        sleep(min(1.0, protocol.cooldown_s - (time.monotonic() - t0)))
    return {"waited_s": time.monotonic() - t0, "reason": "cool-down time passed", "temp_c": temp}


def sweep_subdir(folder: Path, name: str) -> Path:
    """``folder/name`` (``.specs``, ``.launch``), created with the project's mode; a link there is refused."""
    return make_dir(refuse_link(folder / name))


def check_sweep_folder(folder: Path, run_ids: list[str]) -> None:
    """Refuse (:class:`WriteRefused`, one line naming the path) a sweep folder holding a symbolic link where
    the sweep keeps its own files — its state files and hidden folders, the files in ``.specs/`` and
    ``.launch/``, a run directory — before anything is written: a resume would write through it."""
    if not folder.is_dir():
        return
    for name in sorted(SWEEP_FILES | SWEEP_FOLDERS | {LOG_FILE}):
        refuse_link(folder / name)
    for name in (".specs", ".launch"):
        if (folder / name).is_dir():
            for entry in sorted((folder / name).iterdir()):
                refuse_link(entry)
    for run_id in run_ids:
        refuse_link(folder / run_id)


def _remove_leftovers(folder: Path) -> None:
    """Temporary files a killed sweep left (``.sweep.json.XXXXXXXX.tmp``, ``.specs/.RUN.yaml.XXXXXXXX.tmp``, …).

    Called under the sweep's lock, which every writer of these files holds: none is being written now,
    whatever its age (:func:`powertrain.store.leftovers.remove_stale` with ``max_age_s=0``)."""
    remove_stale(folder, [".sweep.json.*.tmp"], max_age_s=0)
    for sub, kinds in ((".specs", ("yaml",)), (".launch", ("sbatch", "jobid"))):
        if (folder / sub).is_dir() and not (folder / sub).is_symlink():
            remove_stale(folder / sub, [f".*.{kind}.*.tmp" for kind in kinds], max_age_s=0)


def _write_run_spec(folder: Path, run_id: str, config: dict[str, Any]) -> Path:
    return write_text_atomic(sweep_subdir(folder, ".specs") / f"{run_id}.yaml", yaml.safe_dump(config, sort_keys=False))


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the sweep process dies, even by SIGKILL (Linux prctl)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: an orphaned run finishes by itself
        pass


def _run_command(opts: SweepOptions, spec_path: Path, run_dir: Path) -> list[str]:
    return [opts.python, "-m", "powertrain.cli", "run", str(spec_path), "--out", str(run_dir),
            *(["--rate", f"{opts.rate_hz:g}"] if opts.rate_hz is not None else []),
            *(["--allow-unapplied"] if opts.allow_unapplied else [])]


def _launch_local(opts: SweepOptions, spec_path: Path, run_dir: Path, time_limit_s: float,
                  stop: Callable[[], bool]) -> str | None:
    """Run one run locally; returns a failure reason the run itself could not record, else None."""
    log = sweep_subdir(run_dir.parent, ".launch") / f"{run_dir.name}.log"
    try:
        f = open_append(log)
    except WriteRefused as exc:
        return f"no log opened: {exc}"
    with f:
        # Own process group (Ctrl-C is forwarded once, in order); dies with the sweep if it is killed.
        proc = subprocess.Popen(_run_command(opts, spec_path, run_dir), stdout=f, stderr=subprocess.STDOUT,
                                process_group=0, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + time_limit_s
        reason = None
        while proc.poll() is None:
            if stop():
                os.killpg(proc.pid, signal.SIGINT)
                reason = "interrupted"
            elif time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGTERM)
                reason = f"time limit of {time_limit_s / 60:g} min reached"
            if reason:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                break
            time.sleep(opts.poll_s)
    if reason is None and proc.returncode != 0 and not RunDir(run_dir).exists():
        tail = log.read_text(errors="replace")[-1500:]
        reason = f"`powertrain run` exited with {proc.returncode} before creating the run: {tail.strip()}"
    return reason


def _directives(plan_launch: Any, config: RunConfig, run_dir: Path, time_limit_s: float) -> list[str]:
    """The ``#SBATCH`` lines, every value checked again (:mod:`powertrain.spec.slurm`) whatever built
    ``plan_launch``: a value Slurm would not accept as one word raises ``SweepError`` naming the field."""
    folder = run_dir.parent
    if not math.isfinite(time_limit_s) or time_limit_s <= 0:
        raise SweepError(f"time limit {time_limit_s!r} s is not a positive number of seconds")
    try:
        lines = [
            f"#SBATCH --job-name={job_name(f'pt-{folder.name}-{run_dir.name}')}",
            f"#SBATCH --nodes={int(config.hardware.nodes)}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --time={max(1, int(time_limit_s // 60))}",
            f"#SBATCH --output={directive_word('results folder', str(folder / '.launch' / run_dir.name), '-%j.out')}",
        ]
        for field, value, allow_list in (("launch.partition", plan_launch.partition, True),
                                         ("launch.account", plan_launch.account, False),
                                         ("launch.qos", getattr(plan_launch, "qos", None), True)):
            if value:
                lines.append(f"#SBATCH --{field.split('.')[1]}={check_name(field, str(value), allow_list)}")
        lines += [f"#SBATCH {check_option(f'launch.slurm_extra[{i}]', str(d))}"
                  for i, d in enumerate(plan_launch.slurm_extra)]
    except ValueError as exc:
        raise SweepError(str(exc)) from None
    return lines


def sbatch_script(opts: SweepOptions, plan_launch: Any, config: RunConfig, spec_path: Path, run_dir: Path,
                  time_limit_s: float) -> str:
    """The batch script for one run: one task per node, each running ``powertrain run`` for its node
    (``srun`` when ``hardware.nodes > 1``); every node's launcher starts that node's one sampler.

    Nothing from the spec or the command line reaches it unchecked: ``#SBATCH`` values match Slurm's
    patterns (:func:`_directives`), the one shell line quotes every word with ``shlex.quote``, and a
    newline or NUL anywhere is refused (``SweepError``)."""
    for what, word in (("results folder", str(run_dir)), ("spec path", str(spec_path)), ("python", opts.python)):
        if control_char(word):
            raise SweepError(f"{what} {word!r} holds {control_char(word)}; choose a path without one")
    lines = ["#!/bin/bash", *_directives(plan_launch, config, run_dir, time_limit_s)]
    cmd = " ".join(shlex.quote(c) for c in _run_command(opts, spec_path, run_dir))
    if config.hardware.nodes > 1:
        # One `powertrain run` per node; each reads its node options from Slurm (run directory on a
        # shared filesystem). A node that fails ends the job step on every node.
        cmd = f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 {cmd}"
    lines += ["set -euo pipefail", f"exec {cmd}"]
    return "\n".join(lines) + "\n"


class SlurmCommands:
    """The Slurm client commands a sweep runs (``sbatch``, ``squeue``, ``scancel``) and the clock it waits
    by: the one boundary between the sweep and Slurm, which tests replace."""

    def submit(self, script: Path) -> tuple[str | None, str]:
        """(job id, "") for a submitted ``script``, or (None, why it was not)."""
        try:
            res = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60,
                                 umask=current_umask() | JOB_UMASK)
        except FileNotFoundError:
            return None, "sbatch not found: install Slurm's client tools or use --backend local"
        if res.returncode != 0:
            return None, f"sbatch refused the job: {res.stderr.strip()}"
        return res.stdout.strip().split(";")[0], ""

    def query(self, job: str) -> tuple[str, str] | None:
        """(state, reason) of ``job`` as squeue shows them (``PENDING``, ``Resources``); None once it is gone."""
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T|%r"], capture_output=True, text=True)
        state, _, reason = q.stdout.strip().partition("|")
        return (state, reason) if q.returncode == 0 and state else None

    def cancel(self, job: str, interrupt: bool = False) -> None:
        """Cancel ``job``; ``interrupt``: send SIGINT to all its processes first (a run then records its end)."""
        args = ["--signal=INT", "--full"] if interrupt else []
        subprocess.run(["scancel", *args, job], capture_output=True)

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def pending_reason(job: str, waited_min: float, why: str, started_before: bool) -> str:
    """The failure reason of a run whose job was cancelled after pending ``waited_min`` minutes."""
    queue = f" (Slurm's reason: {why})" if why and why != "None" else ""
    never = "was requeued and did not start again" if started_before else "never started"
    return (f"Slurm job {job} {never}: still pending after {waited_min:g} min{queue}, so it was cancelled; "
            "raise launch.pending_limit_min if the queue is that slow, or ask for fewer resources")


def _launch_slurm(opts: SweepOptions, plan_launch: Any, config: RunConfig, spec_path: Path, run_dir: Path,
                  time_limit_s: float, stop: Callable[[], bool], slurm: SlurmCommands | None = None) -> str | None:
    """Run one run as a Slurm job and follow it; returns a failure reason the run itself could not record.

    A job still ``PENDING`` ``launch.pending_limit_min`` after it was submitted (or requeued) is
    cancelled: a held job, one waiting on a dependency or a begin time, or a queue that never frees
    resources would otherwise keep the sweep waiting for ever."""
    slurm = slurm or SlurmCommands()
    folder = run_dir.parent
    launch_dir = sweep_subdir(folder, ".launch")
    try:
        text = sbatch_script(opts, plan_launch, config, spec_path, run_dir, time_limit_s)
        script = write_text_atomic(launch_dir / f"{run_dir.name}.sbatch", text)
    except (SweepError, WriteRefused) as exc:
        return f"no batch script written: {exc}"
    job, refused = slurm.submit(script)
    if job is None:
        return refused
    try:
        write_text_atomic(launch_dir / f"{run_dir.name}.jobid", job + "\n")
    except WriteRefused as exc:
        slurm.cancel(job)
        return f"Slurm job {job} cancelled: its job id could not be recorded: {exc}"
    limit_min = float(getattr(plan_launch, "pending_limit_min", 60.0))
    pending_since: float | None = slurm.now()  # the job waits from its submission
    started, state = False, ""
    while True:
        seen = slurm.query(job)
        state = seen[0] if seen else ""
        if seen is None or state in JOB_ENDED:
            break
        if state == "PENDING":
            if pending_since is None:  # requeued after it ran: a new wait, bounded as the first
                pending_since = slurm.now()
            elif slurm.now() - pending_since > limit_min * 60:
                slurm.cancel(job)
                return pending_reason(job, limit_min, seen[1], started)
        else:
            pending_since, started = None, True
        if stop():
            slurm.cancel(job, interrupt=True)
            slurm.sleep(2)
            slurm.cancel(job)
            return "interrupted"
        slurm.sleep(opts.poll_s)
    if not RunDir(run_dir).exists():
        outs = sorted((folder / ".launch").glob(f"{run_dir.name}-*.out"))
        tail = outs[-1].read_text(errors="replace")[-1500:] if outs else "(no job output)"
        return f"Slurm job {job} ended ({state or 'gone'}) without creating the run: {tail.strip()}"
    return None


def _close_orphaned_run(run_dir: Path) -> None:
    """Mark a run whose owner died without recording its end (e.g. killed with the sweep) failed."""
    run = RunDir(run_dir)
    if run.exists() and run.read().get("status") == "running" and run.effective_status() == "failed":
        finalize_run_streams(run_dir)
        run.update(status="failed", reason="interrupted: its launcher process was gone (sweep stopped)")


class SweepRunner:
    """Runs the planned runs of a sweep into ``folder``, persisting state after every change."""

    def __init__(self, plan: Plan, folder: Path, opts: SweepOptions,
                 on_change: Callable[[SweepState, str | None], None] | None = None,
                 sleep: Callable[[float], None] | None = None, slurm: SlurmCommands | None = None) -> None:
        self.plan = plan
        self.slurm = slurm  # None: the real Slurm commands (SlurmCommands)
        if opts.rate_hz is None:  # launch.sampler_rate_hz: the sampling rate of every run, not only the baseline
            opts = dataclasses.replace(opts, rate_hz=plan.spec.launch.sampler_rate_hz)
        self._sleep = sleep or self._wait  # the retry back-off's wait (tests pass one that records it)
        self.folder = folder
        self.opts = opts
        self.on_change = on_change or (lambda state, current: None)
        self.state: SweepState | None = None
        self._stop = False

    def request_stop(self) -> None:
        self._stop = True

    def _wait(self, seconds: float) -> None:
        """Sleep ``seconds``, cut short by :meth:`request_stop` (Ctrl-C during a back-off stops at once)."""
        end = time.monotonic() + seconds
        while not self._stop and (left := end - time.monotonic()) > 0:
            time.sleep(min(0.2, left))

    def _prepare(self) -> SweepState:
        existing = SweepState.load(self.folder)
        if existing and not self.opts.resume and existing.data.get("name") != self.plan.spec.name:
            raise SweepError(f"{self.folder} holds sweep {existing.data.get('name')!r}; use another results folder")
        if existing and not self.opts.resume and any(r.get("status") in (*FINISHED, "running") for r in existing.runs):
            raise SweepError(f"{self.folder} already holds runs of sweep {existing.data.get('name')!r}; "
                             "continue it with --resume (add --retry-failed to re-run failures), "
                             "or use another results folder")
        # the statuses _prepare runs again below: those runs may take an edited spec's configuration
        rerun = [*(("failed", "oom") if self.opts.retry_failed else ()),
                 *(("running",) if self.opts.interrupted == "rerun" else ())]
        try:
            state = SweepState.create_or_merge(self.folder, self.plan, rerun=rerun)
        except SpecChanged as exc:
            raise SweepError(str(exc)) from None
        for r in state.runs:
            if r.get("status") == "running":  # left by a sweep that was killed or interrupted
                _close_orphaned_run(self.folder / r["id"])
                if self.opts.interrupted == "fail":
                    state.set(r["id"], status="failed", reason="interrupted (sweep stopped while running)")
                else:
                    state.archive_attempt(r["id"])
                    state.set(r["id"], status="planned", reason=None)
            elif self.opts.retry_failed and r.get("status") in ("failed", "oom"):
                state.archive_attempt(r["id"])
                state.set(r["id"], status="planned", reason=None)
        return state

    def todo(self) -> list[dict[str, Any]]:
        assert self.state is not None
        return [r for r in self.state.runs if r.get("status") == "planned"
                and (self.opts.only is None or fnmatch.fnmatch(r["id"], self.opts.only))]

    def run(self) -> SweepState:
        # before the lock or sweep.json is touched: a link planted in the folder is never written through
        check_sweep_folder(self.folder, [r.id for r in self.plan.runs])
        with sweep_lock(self.folder):
            _remove_leftovers(self.folder)
            self.state = self._prepare()
            try:
                self._baseline()
                for entry in self.todo():
                    if self._stop:
                        break
                    self._with_retries(entry["id"])
            finally:  # the changes logged since the start folded into sweep.json (a crash keeps the log)
                self.state.save()
            self.on_change(self.state, None)
            return self.state

    def _with_retries(self, run_id: str) -> None:
        """Run ``run_id``; while it fails (not OOM: it would fail again) and ``launch.retries`` allows,
        wait the back-off (``retry_backoff_s``, doubled each time) and run it again. Each failed attempt
        is kept: its directory under ``.attempts/`` and ``{attempt, reason, backoff_s}`` in the run's
        ``retries`` list in sweep.json."""
        assert self.state is not None
        launch = self.plan.spec.launch
        for k in range(launch.retries + 1):
            self._one(self.state.run(run_id))
            entry = self.state.run(run_id)
            if entry.get("status") != "failed" or k == launch.retries or self._stop:
                return
            wait = launch.retry_backoff_s * 2**k
            history = [*entry.get("retries", []), {"attempt": entry.get("attempts"), "reason": entry.get("reason"),
                                                   "backoff_s": wait, "t": time.time()}]
            self.state.set(run_id, retries=history, status="planned")
            self.on_change(self.state, None)
            self._sleep(wait)
    def _baseline(self) -> None:
        assert self.state is not None
        seconds = Protocol.model_validate(self.plan.spec.base.get("protocol", {})).idle_baseline_s
        if seconds <= 0 or (self.folder / ".baseline" / "run.json").exists():
            return
        from powertrain.monitor import Monitor

        with Monitor(out=self.folder / ".baseline", name="idle-baseline",
                     rate_hz=self.plan.spec.launch.sampler_rate_hz):
            end = time.monotonic() + seconds
            while time.monotonic() < end and not self._stop:
                time.sleep(0.2)
        self.state.note(idle_baseline={"run_dir": ".baseline", "seconds": seconds})

    def _one(self, entry: dict[str, Any]) -> None:
        assert self.state is not None
        run_id = entry["id"]
        config = RunConfig.model_validate(entry["config"])
        run_dir = self.folder / run_id
        if run_dir.exists():  # a partial directory from an earlier attempt that never got marked
            self.state.archive_attempt(run_id)
        gate = apply_gate(config.protocol)
        # `powertrain run` refuses what it would not apply: the gate, repeats and baseline are applied
        # here, and knobs that change nothing for the layout were shown as a warning by the plan
        single = as_single_run(config)
        spec_path = _write_run_spec(self.folder, run_id, single.model_dump(mode="json"))
        time_limit_s = self.opts.time_limit_s or self.plan.spec.launch.time_limit_min * 60
        self.state.set(run_id, status="running", started=time.time(), attempts=entry.get("attempts", 0) + 1,
                       reason=None)
        self.on_change(self.state, run_id)
        if self.opts.backend == "slurm":
            reason = _launch_slurm(self.opts, self.plan.spec.launch, config, spec_path, run_dir, time_limit_s,
                                   lambda: self._stop, self.slurm)
        else:
            reason = _launch_local(self.opts, spec_path, run_dir, time_limit_s, lambda: self._stop)
        if reason == "interrupted":
            return  # stays "running": --resume decides (re-run or mark failed)
        status = "failed"
        if RunDir(run_dir).exists():
            info = RunDir(run_dir).read()
            ok = RunDir(run_dir).effective_status() == "ok" and reason is None
            status = "ok" if ok else classify_failure(run_dir)
            reason = reason or info.get("reason")
            RunDir(run_dir).update(sweep={"name": self.plan.spec.name, "id": run_id, "gate": gate,
                                          "protocol": sweep_protocol(config),
                                          "unused_knobs": unused_knobs(config)})
        self.state.set(run_id, status=status, reason=reason, ended=time.time())
        self.on_change(self.state, None)
