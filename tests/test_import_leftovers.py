"""What an import refuses (a FIFO before reading it, a host or a time that cannot be stored) and what a
killed import left (issue 29, items 5 and 6).

A FIFO source is refused in one line instead of hanging (run in a bounded subprocess, so a regression
fails instead of hanging); a killed import's staging folder is removed by the next import, and an import
it was replacing (``--force``, killed between its two renames) is put back rather than removed. Ages are
set with ``os.utime``: nothing depends on the clock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from powertrain.importers.common import RunBuilder, SourceFormatError, open_text, telemetry_table
from powertrain.store.leftovers import DEFAULT_MAX_AGE_S
from powertrain.store.targets import WriteRefused


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    for p in [*path.rglob("*"), path]:
        os.utime(p, (t, t), follow_symlinks=False)


def _builder() -> RunBuilder:
    b = RunBuilder(format="nvsmi")
    b.add_telemetry(telemetry_table(np.array([1, 2], dtype=np.int64) * 10**9, "node0", "gpu0",
                                    {"power_w": np.array([100.0, 110.0])}))
    return b


@pytest.mark.parametrize("kind", ["nvsmi", "mlperf"])
def test_a_fifo_source_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    fifo = tmp_path / "node_0.txt"
    os.mkfifo(fifo)
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", "import", kind, str(fifo), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "is a FIFO (named pipe), not a regular file" in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_open_text_refuses_a_device_as_a_source_format_error() -> None:
    if not Path("/dev/null").exists():
        pytest.skip("no /dev/null")
    with pytest.raises(SourceFormatError, match=r"^/dev/null: is a character device, not a regular file"):
        open_text(Path("/dev/null"))


def test_a_killed_imports_staging_folder_is_removed_a_live_ones_kept(tmp_path: Path) -> None:
    stale, live = tmp_path / ".out.importing-abc123", tmp_path / ".out.importing-def456"
    other = tmp_path / ".other.importing-abc123"  # another target's: not this import's to judge
    for d in (stale, live, other):
        d.mkdir()
        (d / "run.json").write_text("{}")
    _age(stale, DEFAULT_MAX_AGE_S + 60)
    _age(other, DEFAULT_MAX_AGE_S + 60)
    out = _builder().write(tmp_path / "out")
    assert (out / "run.json").is_file()
    assert not stale.exists() and live.exists() and other.exists()


def test_an_import_a_killed_force_was_replacing_is_put_back(tmp_path: Path) -> None:
    first = _builder().write(tmp_path / "out")
    held = tmp_path / ".out.replaced-xyz"
    held.mkdir()
    os.rename(first, held / "run")  # where a --force import killed between its renames left it
    _age(held, DEFAULT_MAX_AGE_S + 60)
    with pytest.raises(WriteRefused):  # put back, it is an import again: replacing it needs --force
        _builder().write(tmp_path / "out")
    assert (tmp_path / "out" / "run.json").is_file() and not held.exists()
    _builder().write(tmp_path / "out", force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_host_made_from_a_file_name_is_checked_naming_the_source(tmp_path: Path) -> None:
    from powertrain.core.names import BadName
    from powertrain.importers.mlperf import read_power_log

    log = tmp_path / "-rf.txt"  # not node_<N>: the host is the name's stem, which would start with -
    log.write_text(':::MLLOG {"key": "power_reading", "time_ms": 1, "value": 1}\n')
    with pytest.raises(BadName, match=rf"^{tmp_path}/-rf\.txt: host '-rf' starts with -"):
        read_power_log(log, RunBuilder(format="mlperf"))


@pytest.mark.parametrize("tms", ["1e30", "9223372036854776", "NaN"])
def test_a_time_ms_beyond_int64_nanoseconds_is_refused_naming_the_line(tmp_path: Path, tms: str) -> None:
    from powertrain.importers.mlperf import read_power_log

    log = tmp_path / "node_0.txt"
    log.write_text(':::MLLOG {"key": "power_reading", "time_ms": 1000, "value": 1}\n'
                   f':::MLLOG {{"key": "power_reading", "time_ms": {tms}, "value": 1}}\n')
    with pytest.raises(SourceFormatError, match=r"node_0\.txt:2: time_ms is not an epoch time in milliseconds"):
        read_power_log(log, RunBuilder(format="mlperf"))
