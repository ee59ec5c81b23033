"""The one supervisor (:mod:`powertrain.supervise`), fast: a log that cannot be written never blocks
the command, leftovers are stopped, the watchdog finds a dead supervisor's command by its record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from powertrain.store import RunDir
from powertrain.store.rundir import default_host
from powertrain.supervise import LogCopy, Supervised, pump, stop_orphans, supervise

MIB = 1024 * 1024


def test_a_log_that_cannot_be_written_is_drained_and_its_loss_counted():
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    # /dev/full fails every write with ENOSPC: the command must still run to its end
    child = subprocess.Popen([sys.executable, "-c", f"import sys; sys.stdout.buffer.write(b'x' * {MIB}); sys.exit(5)"],
                             stdout=subprocess.PIPE)
    copy = LogCopy(Path("/dev/full"))
    pump(child.stdout, copy, None)
    assert child.wait(30) == 5
    loss = copy.loss()
    assert loss is not None and loss["bytes_lost"] == MIB and "No space left" in loss["first_error"]


def test_an_unopenable_log_counts_everything_as_lost(tmp_path):
    copy = LogCopy(tmp_path / "missing-folder" / "x.log")
    copy.write(b"abc")
    assert copy.loss()["bytes_lost"] == 3


def test_supervise_records_exit_code_and_stops_what_the_command_left_behind(tmp_path):
    run = RunDir(tmp_path / "r").create()
    marker = f"pt-leftover-{os.getpid()}-{time.time_ns()}"
    res = supervise(["sh", "-c", f"{sys.executable} -c 'import time  # {marker}\ntime.sleep(300)' & exit 4"],
                    run, "command", echo=False, on_output=None, env=None)
    assert isinstance(res, Supervised) and res.code == 4 and res.outcome() == ("failed", "command exited with code 4")
    assert res.leftovers == 1 and not res.log_loss
    # status is read with the scan: a second read would raise for a process that exits in between
    assert not [p for p in psutil.process_iter(["cmdline", "status"]) if marker in " ".join(p.info["cmdline"] or [])
                and p.info["status"] != psutil.STATUS_ZOMBIE]
    assert not list(run.logs_dir.glob("*.supervisor.json"))  # the watchdog record is gone once reaped


def test_the_watchdog_stops_the_command_of_a_dead_supervisor(tmp_path):
    run = RunDir(tmp_path / "r").create()
    token = f"pt-token-{time.time_ns()}"
    cmd = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], process_group=0,
                           env={**os.environ, "POWERTRAIN_SUPERVISOR": token})
    try:
        (run.logs_dir / "command.supervisor.json").write_text(json.dumps({
            "host": default_host(), "supervisor_pid": 4242,
            "pid": cmd.pid, "pgid": cmd.pid, "token": token, "argv": ["sleep"], "t_start_ns": 0}))
        assert stop_orphans(run, supervisor_pid=1) == []  # another supervisor's command is left alone
        assert cmd.poll() is None
        notes = stop_orphans(run, supervisor_pid=4242, grace_s=5)
        assert notes == ["command: 1 process(es) stopped by the sampler"]
        assert cmd.wait(10) == -signal.SIGTERM
    finally:
        if cmd.poll() is None:
            cmd.kill()
            cmd.wait()
