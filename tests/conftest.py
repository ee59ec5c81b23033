"""Shared fixtures. Tests run against the installed package (editable) in .venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("POWERTRAIN_SHARED", REPO.parent / "shared"))


@pytest.fixture
def python() -> str:
    """The interpreter of this test session (the project's venv)."""
    return sys.executable


@pytest.fixture
def shared_data() -> Path:
    """../shared/data, or a skip saying where it was looked for."""
    path = SHARED / "data"
    if not path.is_dir():
        pytest.skip(f"shared data not found at {path} (set POWERTRAIN_SHARED)")
    return path


@pytest.fixture(scope="session")
def slurm_conf():
    """A real single-node Slurm on localhost (scripts/slurm-local.sh): path of its slurm.conf.

    One folder (one set of ports) per machine: a running local Slurm is reused, and only what this
    session started is stopped. Skips with one line when Slurm is not installed or we are not root.
    """
    if shutil.which("slurmctld") is None or shutil.which("srun") is None:
        pytest.skip("slurm-wlm is not installed (scripts/setup.sh --system installs it as root)")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    folder = Path(os.environ.get("POWERTRAIN_SLURM_DIR", "/tmp/powertrain-slurm"))
    script = REPO / "scripts" / "slurm-local.sh"
    status = subprocess.run([str(script), "status", str(folder)], capture_output=True, text=True, timeout=30)
    was_running = "slurmctld: running" in status.stdout
    res = subprocess.run([str(script), "start", str(folder)], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        pytest.fail(f"local Slurm did not start: {res.stderr}")
    yield str(folder / "slurm.conf")
    if not was_running:
        subprocess.run([str(script), "stop", str(folder)], capture_output=True, timeout=60)
