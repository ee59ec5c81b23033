"""Shared fixtures. Tests run against the installed package (editable) in .venv."""

from __future__ import annotations

import fcntl
import gc
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("POWERTRAIN_SHARED", REPO.parent / "shared"))

# One intra-op thread for torch in this process and every process it starts (set before torch is
# imported): the suite runs on 2 busy cores, where OpenMP threads spin-waiting against each other and
# against the other worker multiplied a small training loop's CPU time by five. Multi-rank runs use one
# thread a rank anyway (torchrun's default); tests that need another count set it themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Import torch (most test files use it, lazily or not) and move everything imported out of the
    garbage collector's full passes: with torch's million objects each pass took 0.3-0.9 s of CPU, a
    dozen passes per test file that builds reports or models."""
    import torch  # noqa: F401

    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def _own_probe_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Host probes kept by this test session only (not the user's ~/.cache), for it and its subprocesses."""
    before = os.environ.get("POWERTRAIN_CACHE_DIR")
    os.environ["POWERTRAIN_CACHE_DIR"] = str(tmp_path_factory.mktemp("probe-cache"))
    yield
    if before is None:
        os.environ.pop("POWERTRAIN_CACHE_DIR", None)
    else:
        os.environ["POWERTRAIN_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def build_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Callable[[Path], object]], object]:
    """``build_once(name, build)``: ``build(folder)`` runs once per test session, whichever xdist worker
    asks first (the other waits on a file lock and reads the result), and its JSON-able result is returned.

    A module-scoped fixture runs once per *worker* that runs a test of its module — a real multi-rank
    launch twice over. The folder is shared: what ``build`` writes there must only be read by tests.
    """
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder

    def run(name: str, build: Callable[[Path], object]) -> object:
        folder, done = root / f"once-{name}", root / f"once-{name}.json"
        with open(root / f"once-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)  # what a failed attempt left
                folder.mkdir()
                result = build(folder)
                done.write_text(json.dumps(result))
            return json.loads(done.read_text())

    return run


@pytest.fixture(scope="session")
def world2(build_once: Callable[[str, Callable[[Path], object]], object]) -> object:
    """The shared 2-rank equivalence launch (tests/equivalence_cases.py): case name → loss curve (and facts)."""
    from equivalence_cases import launch

    return build_once("layouts-world2", lambda folder: launch(2, folder))


@pytest.fixture(scope="session")
def world4(build_once: Callable[[str, Callable[[Path], object]], object]) -> object:
    """The shared 4-rank equivalence launch (tests/equivalence_cases.py)."""
    from equivalence_cases import launch

    return build_once("layouts-world4", lambda folder: launch(4, folder))


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
def slurm_conf() -> Iterator[str]:
    """A real single-node Slurm on localhost (scripts/slurm-local.sh): path of its slurm.conf.

    One folder (one set of ports) per machine, shared by every pytest-xdist worker and any other test
    session. Two lock files next to it: ``start`` makes starting and stopping one at a time (one
    session starts the daemons, the others find them running); every session holds ``use`` shared
    while it needs Slurm. At the end, the last user (the one that gets ``use`` exclusively) stops
    the daemons if a test session started them (a marker in the folder), whichever worker that was;
    a Slurm someone started by hand is left running. No session waits for another to finish.
    Skips with one line when Slurm is not installed or we are not root.
    """
    if shutil.which("slurmctld") is None or shutil.which("srun") is None:
        pytest.skip("slurm-wlm is not installed (scripts/setup.sh --system installs it as root)")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    folder = Path(os.environ.get("POWERTRAIN_SLURM_DIR", "/tmp/powertrain-slurm"))
    script = REPO / "scripts" / "slurm-local.sh"
    marker = folder / ".started-by-tests"
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Always "start" before "use" (setup and teardown alike): the two can never deadlock.
    with open(folder.parent / f".{folder.name}.start.lock", "a") as start, \
            open(folder.parent / f".{folder.name}.use.lock", "a") as use:
        fcntl.flock(start, fcntl.LOCK_EX)  # slurm-local.sh start/stop are not safe to run twice at once
        try:
            status = subprocess.run([str(script), "status", str(folder)], capture_output=True, text=True, timeout=30)
            res = subprocess.run([str(script), "start", str(folder)], capture_output=True, text=True, timeout=120)
            if res.returncode != 0:
                pytest.fail(f"local Slurm did not start: {res.stderr}")
            if "slurmctld: running" not in status.stdout:
                marker.touch()
            fcntl.flock(use, fcntl.LOCK_SH)
        finally:
            fcntl.flock(start, fcntl.LOCK_UN)
        yield str(folder / "slurm.conf")
        fcntl.flock(start, fcntl.LOCK_EX)
        fcntl.flock(use, fcntl.LOCK_UN)
        try:
            fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another session still uses it: the last one out stops it
        if marker.exists():
            subprocess.run([str(script), "stop", str(folder)], capture_output=True, timeout=60)
            marker.unlink()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order and group the tests for ``pytest -n 2 --dist loadgroup`` (``make test``).

    Every Slurm test joins one xdist group, so one worker runs them all against the one local Slurm.
    pytest 9.2 with pytest-xdist 3.8 silently loses such groups (pytest-dev/pytest-xdist#1386: xdist
    rewrites a node id pytest no longer reads), so safety does not rest on the group: the
    ``slurm_conf`` lock lets two workers share the one Slurm (its node has slots for both).
    The end-to-end (``slow``) tests go first, in their file order: started early they run beside
    the many quick ones instead of being the tail of the run on one worker while the other idles.
    Every worker collects the same list and orders it the same way, as xdist requires.
    """
    for item in items:
        if item.get_closest_marker("slurm") is not None:
            item.add_marker(pytest.mark.xdist_group("slurm"))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order kept


def _pp_run(folder: Path) -> dict[str, str]:
    import yaml

    spec = folder / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "pp1f1b", "model": {"name": "llama-test", "family": "llama", "layers": 4, "hidden": 32, "ffn": 64,
                                    "heads": 4, "kv_heads": 2, "vocab": 128, "seq_len": 16},
        "layout": {"pp": 2, "pp_schedule": "1f1b"}, "knobs": {"micro_batch": 1, "global_batch": 4},
        "hardware": {"devices_per_node": 2}, "protocol": {"warmup_steps": 2, "measured_steps": 3},
        "profile": {"enabled": True}}))
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", "run", str(spec), "--out", str(folder / "run"),
                          "--rate", "10"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return {"run": str(folder / "run"), "stderr": res.stderr[-5000:]}


@pytest.fixture(scope="module")
def pp_launch(build_once: Callable[[str, Callable[[Path], object]], object]) -> object:
    """A real 2-rank 1F1B run (a 4-layer Llama, 4 micro-batches, 2 warm-up + 3 measured steps, step 1
    profiled) under `powertrain run`, once per session: its folder and the command's stderr. Used by
    test_workload_trainer (the 1F1B pattern) and test_workload_run (a complete run directory)."""
    return build_once("pp1f1b", _pp_run)
