"""Fault tests of the one supervisor (issue 14): kill -9 of the monitor, of the ``powertrain run``
launcher and of a rank, and a disk filled by the command's own output.

Each asserts the *end state* after a bounded wait (never which process noticed first): ``run.json``
``failed`` with a reason, and no process of the run left (a scan of every process's command line and
environment for a marker unique to the test). Each test is bounded by :data:`LIMIT_S` (60 s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import yaml

pytestmark = pytest.mark.slow

LIMIT_S = 60.0


class Deadline:
    """One test's time budget: every wait below draws on it."""

    def __init__(self, seconds: float = LIMIT_S) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def wait_for(self, cond: Callable[[], object], what: str) -> None:
        while not cond():
            if time.monotonic() > self.end:
                raise AssertionError(f"{what}: not reached within the test's {LIMIT_S:.0f} s")
            time.sleep(0.1)


@dataclasses.dataclass(frozen=True)
class Seen:
    """A process as one scan saw it. Command line and environment are read once, inside the scan's
    guard: a process may exit between two reads, and a second read would then raise."""

    proc: psutil.Process
    cmdline: str
    environ: dict[str, str]


def _procs_with(marker: str) -> list[Seen]:
    """Live (non-zombie) processes whose command line or environment mentions ``marker``."""
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline, environ = " ".join(p.cmdline()), p.environ()
        except (psutil.Error, OSError):
            continue
        if marker in cmdline or any(marker in v for v in environ.values()):
            found.append(Seen(p, cmdline, environ))
    return found


def _status(out: Path) -> dict:
    try:
        return json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def _reaped(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _cli(*args: str, marker: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "powertrain.cli", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PT_TEST_MARKER": marker, **(env or {})})


def _assert_supervisor_killed(out: Path, marker: str, dl: Deadline) -> dict:
    def ended() -> bool:
        return _status(out).get("status") == "failed" and not _procs_with(marker)

    dl.wait_for(ended, "run.json failed and no process of the run left")
    info = _status(out)
    assert info["reason"].startswith("supervisor killed"), info["reason"]
    assert info["exit_code"] is None and info["exit_code_why_null"]
    assert not list(out.glob("logs/*.supervisor.json"))
    return info


def test_kill_9_of_the_monitor_stops_the_command_and_marks_the_run_failed(tmp_path):
    dl = Deadline()
    out, marker = tmp_path / "m", f"pt-fault-{uuid.uuid4().hex}"
    # a shell with a grandchild: PR_SET_PDEATHSIG reaches only the shell, the watchdog the rest
    script = f"import time  # {marker}\ntime.sleep(300)"
    cmd = ["sh", "-c", f"{sys.executable} -c '{script}' & wait"]
    with _reaped(_cli("monitor", "--out", str(out), "-q", "--", *cmd, marker=marker)) as mon:
        dl.wait_for(lambda: (out / "logs" / "command.supervisor.json").exists()
                    and any("time.sleep" in p.cmdline for p in _procs_with(marker)),
                    "the command running")
        time.sleep(1.0)  # some telemetry
        mon.send_signal(signal.SIGKILL)
        mon.wait(dl.left())
        info = _assert_supervisor_killed(out, marker, dl)
    assert "stopped by the sampler" in info["reason"]
    assert info["devices"]  # the sampler's meta was collected
    meta = json.loads(next(out.glob("telemetry/*.meta.json")).read_text())
    assert meta["finished"] and meta["stop_reason"] == "parent process disappeared"
    assert not list(out.glob("telemetry/*.parts"))  # compacted by the watchdog


MODEL = {"name": "llama-test", "family": "llama", "layers": 2, "hidden": 32, "ffn": 64, "heads": 4,
         "kv_heads": 2, "vocab": 128, "seq_len": 16}


def _spec(path: Path, steps: int) -> str:
    path.write_text(yaml.safe_dump({
        "name": "t", "model": MODEL, "layout": {}, "knobs": {"global_batch": 4, "micro_batch": 2},
        "hardware": {"devices_per_node": 2}, "protocol": {"warmup_steps": 1, "measured_steps": steps},
        "profile": {"enabled": False}}))
    return str(path)


def _ranks(marker: str) -> list[Seen]:
    return [p for p in _procs_with(marker) if "powertrain.workload.train" in p.cmdline
            and p.environ.get("LOCAL_RANK") is not None]


def test_kill_9_of_the_run_launcher_stops_torchrun_and_its_ranks(tmp_path):
    dl = Deadline()
    out, marker = tmp_path / "run", f"pt-fault-{uuid.uuid4().hex}"
    spec = _spec(tmp_path / "s.yaml", steps=100000)
    with _reaped(_cli("run", spec, "--out", str(out), "--rate", "10", marker=marker)) as launcher:
        dl.wait_for(lambda: len(_ranks(marker)) == 2, "both ranks started")
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(dl.left())
        info = _assert_supervisor_killed(out, marker, dl)
    assert info["kind"] == "run" and info["rank_map"]


def test_kill_9_of_a_rank_fails_the_run_and_leaves_no_process(tmp_path):
    dl = Deadline()
    out, marker = tmp_path / "run", f"pt-fault-{uuid.uuid4().hex}"
    spec = _spec(tmp_path / "s.yaml", steps=100000)
    with _reaped(_cli("run", spec, "--out", str(out), "--rate", "10", marker=marker)) as launcher:
        # as soon as both ranks run (reaching a training step takes ~20 s more on 2 busy cores; the
        # attribution of a rank killed mid-step is covered in test_workload_run)
        dl.wait_for(lambda: len(_ranks(marker)) == 2, "both ranks started")
        (victim,) = [p for p in _ranks(marker) if p.environ.get("RANK") == "1"]
        victim.proc.send_signal(signal.SIGKILL)
        assert launcher.wait(dl.left()) == 1
    dl.wait_for(lambda: not _procs_with(marker), "no process of the run left")
    info = _status(out)
    assert info["status"] == "failed" and "rank 1 killed by SIGKILL" in info["reason"]


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 4 MiB tmpfs (root only; skipped where mounting is not permitted)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or 'mount failed'}): needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


FILL = """
import sys, time
line = b"x" * 1023 + b"\\n"
for _ in range(12 * 1024):  # 12 MiB of output on a 4 MiB disk
    sys.stdout.buffer.write(line)
sys.stdout.flush()
time.sleep(1.5)  # the sampler meets the full disk too
sys.exit(7)
"""


def test_a_disk_filled_by_the_commands_output_keeps_its_exit_code_and_never_hangs(small_disk):
    out = small_disk / "m"
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", "monitor", "--out", str(out), "-q", "--",
                          sys.executable, "-c", FILL], capture_output=True, text=True, timeout=LIMIT_S)
    assert res.returncode == 7, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    info = json.loads((out / "run.json").read_text())
    assert info["exit_code"] == 7 and info["status"] == "failed" and "exited with code 7" in info["reason"]
    lost = info["data_quality"]["logs_lost"]
    assert lost[0]["file"] == "logs/command.stdout" and "No space left" in lost[0]["first_error"]
    kept = (out / "logs" / "command.stdout").stat().st_size
    assert kept + lost[0]["bytes_lost"] == 12 * 1024 * 1024  # every byte either kept or counted
    if "sampling stopped early" in info["reason"]:  # the sampler met the full disk (it usually does)
        assert any("sampling stopped early" in n for n in info["telemetry_notes"])
    assert not list(out.rglob(".*.reserve")) and not list(out.rglob("*.tmp"))


def test_a_full_disk_at_start_is_one_line_and_leaves_nothing(small_disk):
    with contextlib.suppress(OSError), open(small_disk / "fill", "wb") as f:  # the disk is full
        while True:
            f.write(os.urandom(4096))
            f.flush()
    out = small_disk / "m"
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", "monitor", "--out", str(out), "-q", "--", "true"],
                         capture_output=True, text=True, timeout=LIMIT_S)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "Traceback" not in res.stderr
    assert not out.exists()  # nothing half-written: --out can be used again
