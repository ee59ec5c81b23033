"""A sweep's Slurm jobs and its folder are the sweep's own (issue 29, part 1).

* ``launch.slurm_extra`` is an allow-list: every option that could run code (``--export`` with a
  ``BASH_ENV`` or ``PYTHONPATH``), write a file (``--error``, ``--output``, ``--chdir``) or hold a job
  without a bound (``--hold``, ``--begin``, ``--dependency``) — abbreviated, short, or split over two
  items — is refused by ``plan`` and ``sweep`` with exit 2 and one line naming the item, and nothing
  on disk changes; the options on the list reach the script as written.
* A job still pending after ``launch.pending_limit_min`` is cancelled and its run failed, saying so.
* Every file the sweep writes takes the project's modes under umask 000 and 002.
* A symbolic link planted where the sweep keeps its files is refused, naming it, its target untouched.

Slurm is replaced at its one boundary (:class:`powertrain.launch.sweep.SlurmCommands`) by
:class:`FakeSlurm`, whose clock moves only when the sweep reads it: nothing here depends on timing.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import stat
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import powertrain.launch.sweep as sweep_mod
from powertrain.cli import app
from powertrain.launch.sweep import SweepOptions, SweepRunner, _launch_local, _launch_slurm, sbatch_script
from powertrain.plan.planner import plan
from powertrain.plan.state import SweepState, sweep_lock
from powertrain.plan.sweep_spec import LaunchOptions, SpecError, parse_sweep_spec
from powertrain.predict.calibration import Calibration, save_calibration
from powertrain.spec.run import RunConfig
from powertrain.store import RunDir
from powertrain.store.rundir import open_append, write_text_atomic
from powertrain.store.targets import WriteRefused

runner = CliRunner()
BASE = {"model": "gpt3-tiny", "hardware": {"devices_per_node": 1}}
MARK = "PWNED"


def _spec(tmp_path: Path, **launch: object) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "safe", "base": BASE, "grid": [{"knobs.seed": [1, 2]}],
                                    "launch": {"backend": "slurm", **launch}}))
    return path


def _lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.strip()]


def _digests(root: Path) -> dict[str, str]:
    """sha256 of every regular file under ``root`` and the target text of every link, links not followed."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        for name in [*dirs, *files]:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link -> " + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


class FakeSlurm:
    """sbatch, squeue and scancel as :class:`~powertrain.launch.sweep.SlurmCommands` runs them: every job
    goes through ``states``, one per query, then leaves the queue; a job that reaches RUNNING writes its
    run as ``powertrain run`` would. The clock moves by ``tick`` seconds each time it is read."""

    def __init__(self, states: Iterable[str] = ("RUNNING",), tick: float = 1.0, why: str = "Resources") -> None:
        self.states, self.tick, self.why, self.t = list(states), tick, why, 0.0
        self.scripts: list[str] = []
        self.cancelled: list[tuple[str, bool]] = []
        self.queries = 0
        self._jobs: dict[str, tuple[Iterator[str], Path]] = {}

    def submit(self, script: Path) -> tuple[str | None, str]:
        text = script.read_text()
        self.scripts.append(text)
        words = shlex.split(text.splitlines()[-1])
        job = str(100 + len(self.scripts))
        self._jobs[job] = (iter(self.states), Path(words[words.index("--out") + 1]))
        return job, ""

    def query(self, job: str) -> tuple[str, str] | None:
        self.queries += 1
        assert self.queries < 10_000, "the sweep never stopped following its job"
        if any(j == job for j, _ in self.cancelled):
            return None
        states, run_dir = self._jobs[job]
        state = next(states, None)
        if state == "RUNNING" and not RunDir(run_dir).exists():
            RunDir(run_dir).create().write({"status": "ok"})
        return (state, self.why) if state else None

    def cancel(self, job: str, interrupt: bool = False) -> None:
        self.cancelled.append((job, interrupt))

    def now(self) -> float:
        self.t += self.tick
        return self.t

    def sleep(self, seconds: float) -> None:  # the clock moves with now(), never with real time
        pass


@pytest.fixture
def fake_slurm(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeSlurm]]:
    """Every SlurmCommands() the sweep makes is the FakeSlurm appended to the list (default: jobs that run)."""
    made: list[FakeSlurm] = []

    def factory() -> FakeSlurm:
        if not made:
            made.append(FakeSlurm())
        return made[0]

    monkeypatch.setattr(sweep_mod, "SlurmCommands", factory)
    yield made


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


# --- slurm_extra is an allow-list ------------------------------------------------------------------

# (items, the index of the refused one, the option its one line names)
REFUSED = [
    (["--exclusive", "--export=ALL,BASH_ENV={spec}"], 1, "--export"),  # bash sources the file: code
    (["--export=ALL,PYTHONPATH={tmp}"], 0, "--export"),  # a sitecustomize.py there runs in Python
    (["--export=NONE"], 0, "--export"),  # any --export
    (["--exp=ALL,BASH_ENV={spec}"], 0, "--export"),  # sbatch reads a prefix as the option
    (["--ex=ALL"], 0, "--export"),
    (["--export-file={spec}"], 0, "--export-file"),
    (["--get-user-env"], 0, "--get-user-env"),
    (["--propagate"], 0, "--propagate"),
    (["--prop=ALL"], 0, "--propagate"),
    (["--error={victim}"], 0, "--error"),  # overwrites any file the user can write
    (["--er={victim}"], 0, "--error"),
    (["--output={victim}"], 0, "--output"),
    (["--outp={victim}"], 0, "--output"),
    (["-o", "{victim}"], 0, "--output"),
    (["-o{victim}"], 0, "--output"),
    (["-e", "{victim}"], 0, "--error"),
    (["--input={victim}"], 0, "--input"),
    (["--open-mode=append"], 0, "--open-mode"),
    (["--chdir={tmp}"], 0, "--chdir"),
    (["-D", "{tmp}"], 0, "--chdir"),
    (["--hold"], 0, "--hold"),  # waits for ever
    (["-H"], 0, "--hold"),
    (["--ho"], 0, "--hold"),
    (["--begin=now+1day"], 0, "--begin"),
    (["--be=now+1day"], 0, "--begin"),
    (["-b", "now+1day"], 0, "--begin"),
    (["--dependency=afterok:1"], 0, "--dependency"),
    (["--dep=singleton"], 0, "--dependency"),
    (["-d", "afterok:1"], 0, "--dependency"),
    (["--deadline=now+1hour"], 0, "--deadline"),
    (["--wrap=id"], 0, "--wrap"),
    (["--array=1-3"], 0, "--array"),
    (["--requeue"], 0, "--requeue"),
    (["--clusters=other"], 0, "--clusters"),
    (["--uid=0"], 0, "--uid"),
    (["--gpu-freq=high"], 0, "--gpu-freq"),
    (["--partition=debug"], 0, "--partition"),  # the script's own: from their fields
    (["--time=5"], 0, "--time"),
    # `--option value` split across items: each item is one whole option
    (["--constraint", "a100"], 0, "--constraint"),
    (["--comment", "--hold"], 0, "--comment"),
    (["--exclusive", "a100"], 1, "a100"),
    # not on the allow-list, or a value outside its pattern
    (["--gpus=8"], 0, "--gpus"),
    (["--reboot"], 0, "--reboot"),
    (["--no-such-option=1"], 0, "--no-such-option"),
    (["--constr=a100"], 0, "--constraint"),  # an allowed one abbreviated: write it out
    (["-C", "a100"], 0, "--constraint"),
    (["--mem=1G,id"], 0, "--mem"),
    (["--nodelist={victim}"], 0, "--nodelist"),  # sbatch reads a path as a file of node names
    (["--comment=a b"], 0, "--comment"),
    (["--comment=$(touch PWNED)"], 0, "--comment"),
    (["--no-requeue=1"], 0, "--no-requeue"),
    (["--exclusive=all"], 0, "--exclusive"),
    (["--Export=ALL"], 0, "--Export"),
]


def _fill(items: list[str], tmp_path: Path) -> list[str]:
    return [i.format(spec=tmp_path / "s.yaml", tmp=tmp_path, victim=tmp_path / "victim.txt") for i in items]


@pytest.mark.parametrize("command", ["plan", "sweep"])
@pytest.mark.parametrize(("items", "index", "option"), REFUSED, ids=[" ".join(r[0]) for r in REFUSED])
def test_slurm_extra_outside_the_allow_list_is_refused_in_one_line(tmp_path, command, items, index, option):
    (tmp_path / "victim.txt").write_text("precious\n")
    # the spec itself is the file a BASH_ENV would source
    spec = _spec(tmp_path, slurm_extra=_fill(items, tmp_path))
    spec.write_text(spec.read_text() + f"description: x; touch {tmp_path / MARK}\n")
    before = _digests(tmp_path)
    out = tmp_path / "out"
    args = ["plan", str(spec)] if command == "plan" else ["sweep", str(spec), "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = _lines(res.output)
    assert len(lines) == 1, res.output
    assert f"launch.slurm_extra[{index}]" in lines[0] and option in lines[0], lines[0]
    assert "Traceback" not in res.output
    assert _digests(tmp_path) == before and not out.exists()
    assert not (tmp_path / MARK).exists()


@pytest.mark.parametrize(("items", "index", "option"), [r for r in REFUSED if r[2] != "--Export"][:20],
                         ids=[" ".join(r[0]) for r in REFUSED if r[2] != "--Export"][:20])
def test_each_refusal_says_what_the_option_does_or_what_to_do(tmp_path, items, index, option):
    with pytest.raises(SpecError) as info:
        parse_sweep_spec({"name": "s", "base": BASE, "launch": {"backend": "slurm",
                                                               "slurm_extra": _fill(items, tmp_path)}})
    msg = str(info.value)
    assert "\n" not in msg and any(w in msg for w in ("drop it", "set ", "use ", "write ", "inherits")), msg


ALLOWED = ["--exclusive", "--exclusive=user", "--constraint=[a100|h100]&ib", "--gres=gpu:a100:4",
           "--gpus-per-node=h100:8", "--cpus-per-task=16", "--mem=64G", "--mem=0", "--mem-per-cpu=4G",
           "--mem-per-gpu=80G", "--nodelist=gpu[01-04,07]", "--exclude=gpu05", "--reservation=maint_1",
           "--mail-type=END,FAIL", "--mail-user=me@example.org", "--comment=pt-study.v2", "--switches=1@10:00",
           "--nice=7", "--licenses=scratch:1", "--wckey=proj", "--no-requeue"]


def test_allowed_options_reach_the_script_as_written(tmp_path):
    launch = LaunchOptions(backend="slurm", slurm_extra=ALLOWED)
    script = sbatch_script(SweepOptions(python="/usr/bin/python3"), launch, RunConfig(model="gpt3-tiny"),
                           tmp_path / ".specs" / "r.yaml", tmp_path / "r", 600)
    directives = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert directives[-len(ALLOWED):] == [f"#SBATCH {o}" for o in ALLOWED]


def test_allowed_options_reach_the_submitted_script_through_the_cli(tmp_path, fake_slurm):
    spec = _spec(tmp_path, slurm_extra=["--exclusive", "--gres=gpu:8", "--comment=study"])
    res = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    (slurm,) = fake_slurm
    assert len(slurm.scripts) == 2
    for script in slurm.scripts:
        assert {"#SBATCH --exclusive", "#SBATCH --gres=gpu:8", "#SBATCH --comment=study"} <= set(script.splitlines())


# --- a pending job has a bound ----------------------------------------------------------------------


def test_a_job_pending_past_the_bound_is_cancelled_and_its_run_failed(tmp_path, fake_slurm):
    """A job that never leaves PENDING (held, waiting on a begin time, a queue that never frees) is cancelled
    after launch.pending_limit_min; the run is failed with that reason, in sweep.json and the sweep's output."""
    fake_slurm.append(FakeSlurm(states=["PENDING"] * 5000, tick=60.0, why="BeginTime"))
    spec = _spec(tmp_path, pending_limit_min=30)
    out = tmp_path / "out"
    res = runner.invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert res.exit_code == 1, res.output
    slurm = fake_slurm[0]
    assert [c for c in slurm.cancelled] == [("101", False), ("102", False)]
    assert slurm.queries < 100  # ~30 one-minute polls each, not the 5000 states it had
    state = SweepState.load(out)
    assert state is not None
    for run in state.runs:
        assert run["status"] == "failed"
        assert "never started" in run["reason"] and "30 min" in run["reason"]
        assert "BeginTime" in run["reason"] and "launch.pending_limit_min" in run["reason"]
    failed = [ln for ln in _lines(res.output) if ln.startswith("failed ")]
    assert len(failed) == 2 and all("raise launch.pending_limit_min" in ln for ln in failed), res.output


@pytest.mark.parametrize(("states", "cancelled", "word"), [
    (["PENDING"] * 59 + ["RUNNING", "RUNNING"], False, None),  # started within the hour: not cancelled
    (["PENDING"] * 200, True, "never started"),
    (["PENDING", "RUNNING", *["PENDING"] * 200], True, "was requeued"),  # each wait is bounded alike
])
def test_the_bound_counts_only_time_spent_pending(tmp_path, states, cancelled, word):
    slurm = FakeSlurm(states=states, tick=60.0)
    run_dir = tmp_path / "r1"
    spec_path = write_text_atomic(tmp_path / ".specs" / "r1.yaml", "model: gpt3-tiny\n")
    reason = _launch_slurm(SweepOptions(backend="slurm"), LaunchOptions(backend="slurm"), RunConfig(model="gpt3-tiny"),
                           spec_path, run_dir, 600, lambda: False, slurm)
    assert bool(slurm.cancelled) is cancelled
    if word is None:
        assert reason is None and RunDir(run_dir).exists()
    else:
        assert reason is not None and word in reason and "60 min" in reason


def test_pending_limit_is_checked_and_refused_where_the_sweep_runs_locally(tmp_path):
    for bad in (0, -1, float("nan")):
        with pytest.raises(SpecError, match=r"launch\.pending_limit_min"):
            parse_sweep_spec({"name": "s", "base": BASE, "launch": {"backend": "slurm", "pending_limit_min": bad}})
    spec = _spec(tmp_path, pending_limit_min=30)
    res = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "out"), "--backend", "local"])
    assert res.exit_code == 2 and "launch.pending_limit_min" in _lines(res.output)[0], res.output
    assert not (tmp_path / "out").exists()


# --- the project's modes whatever the umask ----------------------------------------------------------


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


@pytest.mark.parametrize("mask", [0o000, 0o002])
def test_every_file_the_sweep_writes_has_the_projects_modes(tmp_path, fake_slurm, umask, mask):
    os.umask(mask)
    spec = _spec(tmp_path)
    out = tmp_path / "out"
    res = runner.invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert {_mode(d) for d in (out, out / ".specs", out / ".launch")} == {0o750}
    files = [out / "sweep.json", out / ".lock", *(out / ".specs").iterdir(), *(out / ".launch").iterdir()]
    assert {p.name.rpartition(".")[2] for p in files} == {"json", "lock", "yaml", "sbatch", "jobid"}
    assert {str(p.relative_to(out)): _mode(p) for p in files} == {str(p.relative_to(out)): 0o640 for p in files}
    # the local backend's log, and a calibration profile (`calibrate --output` writes it through save_calibration)
    log_run = tmp_path / "local" / "r1"
    log_run.parent.mkdir()
    reason = _launch_local(SweepOptions(python="/bin/true", poll_s=0.01), tmp_path / "x.yaml", log_run, 60,
                           lambda: False)
    assert reason is None and _mode(tmp_path / "local" / ".launch" / "r1.log") == 0o640
    assert _mode(tmp_path / "local" / ".launch") == 0o750
    assert _mode(save_calibration(Calibration(name="p"), tmp_path / "p.yaml")) == 0o640


def test_the_job_is_submitted_with_a_umask_that_keeps_the_modes(tmp_path, monkeypatch, umask):
    """sbatch hands its umask to the job: the job's output file and its run directory follow the policy."""
    import subprocess

    seen: dict[str, int] = {}

    def fake_run(args, **kw):
        seen["umask"] = kw["umask"]
        return subprocess.CompletedProcess(args, 0, "7\n", "")

    monkeypatch.setattr(sweep_mod.subprocess, "run", fake_run)
    for mask, want in ((0o000, 0o027), (0o002, 0o027), (0o077, 0o077)):
        os.umask(mask)
        assert sweep_mod.SlurmCommands().submit(tmp_path / "x.sbatch") == ("7", "")
        assert seen["umask"] == want


# --- nothing is written through a link ---------------------------------------------------------------


def _swept(tmp_path: Path, fake_slurm: list[FakeSlurm]) -> tuple[Path, Path]:
    """A finished two-run Slurm sweep in tmp_path/out (its spec at tmp_path/s.yaml) and a folder outside it."""
    spec, out = _spec(tmp_path), tmp_path / "out"
    res = runner.invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert res.exit_code == 0, res.output
    fake_slurm.clear()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious\n")
    return spec, out


PLANTED = [".specs/seed1.yaml", ".launch/seed1.sbatch", ".launch/seed1.jobid", ".launch/seed2.log", ".specs",
           ".launch", "sweep.json", "sweep.state.jsonl", ".lock", ".attempts", "seed1"]


@pytest.mark.parametrize("planted", PLANTED)
def test_resume_refuses_a_link_planted_in_the_sweep_folder(tmp_path, fake_slurm, planted):
    spec, out = _swept(tmp_path, fake_slurm)
    link = out / planted
    outside = tmp_path / "outside"
    if link.is_dir():
        shutil.rmtree(link)
    else:
        link.unlink(missing_ok=True)
    link.symlink_to(outside if planted in (".specs", ".launch") else outside / "victim.txt")
    before = _digests(tmp_path)
    res = runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--resume", "--retry-failed"])
    assert res.exit_code == 2, res.output
    lines = _lines(res.output)
    assert len(lines) == 1 and str(link) in lines[0] and "symbolic link" in lines[0], res.output
    assert _digests(tmp_path) == before
    assert (tmp_path / "outside" / "victim.txt").read_text() == "precious\n"
    assert not fake_slurm or not fake_slurm[0].scripts  # nothing was submitted


def test_every_write_refuses_a_link_planted_after_the_check(tmp_path):
    """The check before a sweep is not the only guard: each write refuses a link on its own."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    folder = tmp_path / "out"
    (folder / ".launch").mkdir(parents=True)
    (folder / ".specs").mkdir()
    for name in (".specs/r1.yaml", ".launch/r1.sbatch", ".launch/r1.log", "sweep.json", ".lock"):
        (folder / name).symlink_to(victim)
    with pytest.raises(WriteRefused, match=r"r1\.yaml is a symbolic link"):
        write_text_atomic(folder / ".specs" / "r1.yaml", "x")
    with pytest.raises(WriteRefused, match=r"r1\.log is a symbolic link"):
        open_append(folder / ".launch" / "r1.log")
    with pytest.raises(WriteRefused, match=r"\.lock is a symbolic link"), sweep_lock(folder):
        pass
    with pytest.raises(WriteRefused, match=r"sweep\.json is a symbolic link"):
        SweepState(folder, {"runs": []}).save()
    slurm = FakeSlurm()
    reason = _launch_slurm(SweepOptions(backend="slurm"), LaunchOptions(backend="slurm"), RunConfig(model="gpt3-tiny"),
                           folder / ".specs" / "r1.yaml", folder / "r1", 600, lambda: False, slurm)
    assert reason is not None and "r1.sbatch is a symbolic link" in reason and not slurm.scripts
    reason = _launch_local(SweepOptions(python="/bin/true"), folder / ".specs" / "r1.yaml", folder / "r1", 60,
                           lambda: False)
    assert reason is not None and "r1.log is a symbolic link" in reason
    assert victim.read_text() == "precious\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_where_a_log_goes_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "r1.log")
    with pytest.raises(WriteRefused, match="not a regular file"):
        open_append(tmp_path / "r1.log")


def test_the_runner_checks_the_folder_itself(tmp_path):
    """Called without the CLI, the runner refuses the planted link before it takes the lock."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    folder = tmp_path / "out"
    (folder / ".specs").mkdir(parents=True)
    (folder / ".specs" / "seed1.yaml").symlink_to(victim)
    p = plan(parse_sweep_spec({"name": "safe", "base": BASE, "grid": [{"knobs.seed": [1, 2]}],
                               "launch": {"backend": "slurm"}}))
    with pytest.raises(WriteRefused, match=r"seed1\.yaml"):
        SweepRunner(p, folder, SweepOptions(backend="slurm", python=sys.executable), slurm=FakeSlurm()).run()
    assert not (folder / ".lock").exists() and not (folder / "sweep.json").exists()
    assert victim.read_text() == "precious\n"


class HeldSlurm(sweep_mod.SlurmCommands):
    """The real sbatch, squeue and scancel, the job submitted held (so it stays PENDING for certain) and a
    clock that moves ten minutes each time it is read."""

    def __init__(self) -> None:
        self.t = 0.0
        self.job = ""

    def submit(self, script: Path) -> tuple[str | None, str]:
        import subprocess

        res = subprocess.run(["sbatch", "--parsable", "--hold", str(script)], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0, res.stderr
        self.job = res.stdout.strip().split(";")[0]
        return self.job, ""

    def now(self) -> float:
        self.t += 600.0
        return self.t

    def sleep(self, seconds: float) -> None:
        pass


@pytest.mark.slurm
def test_a_held_job_in_the_local_slurm_is_cancelled_at_the_bound(slurm_conf, tmp_path, monkeypatch):
    """squeue's state and reason are read as Slurm writes them, and scancel really cancels."""
    import subprocess

    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    spec_path = write_text_atomic(tmp_path / ".specs" / "r1.yaml", "model: gpt3-tiny\n")
    slurm = HeldSlurm()
    reason = _launch_slurm(SweepOptions(backend="slurm", python="/bin/true"),
                           LaunchOptions(backend="slurm", partition="debug", pending_limit_min=30),
                           RunConfig(model="gpt3-tiny"), spec_path, tmp_path / "r1", 600, lambda: False, slurm)
    assert reason is not None and "never started" in reason and "JobHeld" in reason, reason
    res = subprocess.run(["scontrol", "show", "job", slurm.job], capture_output=True, text=True)
    assert "JobState=CANCELLED" in res.stdout, res.stdout
