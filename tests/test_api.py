"""The stable public API: Monitor + step/phase markers → load() and summary() of the same run."""

from __future__ import annotations

import importlib.util
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import powertrain
from powertrain import hooks


def _busy(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


@pytest.fixture
def recorded_run(tmp_path):
    out = tmp_path / "api-run"
    with powertrain.Monitor(out=out, rate_hz=50):
        hooks.configure(out, rank=0)
        try:
            for i in range(4):
                powertrain.set_window("warmup" if i == 0 else "measured")
                with powertrain.step(i, tokens=1024, samples=8) as s:
                    with powertrain.phase("forward"):
                        _busy(0.05)
                    with powertrain.phase("backward"):
                        _busy(0.05)
                    s.loss = 2.0 - 0.1 * i
        finally:
            hooks.close()
            hooks._recorder = None  # the next test starts from the environment again
    return out


def test_public_names_are_exported():
    for name in ("Monitor", "step", "phase", "begin_step", "end_step", "set_window", "load", "summary", "Run"):
        assert hasattr(powertrain, name), name
        assert getattr(powertrain, name).__doc__, f"{name} has no docstring"


def test_load_gives_pyarrow_tables_of_the_run(recorded_run):
    run = powertrain.load(recorded_run)
    assert run.status == "ok"
    assert isinstance(run.telemetry, pa.Table) and run.telemetry.num_rows > 0
    assert isinstance(run.events, pa.Table)
    steps = run.steps
    assert steps["step"].to_pylist() == [0, 1, 2, 3]
    assert steps["loss"].to_pylist() == pytest.approx([2.0, 1.9, 1.8, 1.7])
    assert steps["window"].to_pylist() == ["warmup", "measured", "measured", "measured"]
    phases = run.events.filter(pc.equal(run.events["kind"], "forward"))
    assert phases.num_rows == 4 and phases["step"].to_pylist() == [0, 1, 2, 3]
    # every step interval lies inside the sampled window, on the same clock
    t = run.telemetry["t_ns"]
    assert pc.min(t).as_py() <= pc.min(steps["t_start_ns"]).as_py()
    assert pc.max(steps["t_end_ns"]).as_py() <= run.info["end_ns"]


def test_to_pandas_or_a_clear_error(recorded_run):
    run = powertrain.load(recorded_run)
    if importlib.util.find_spec("pandas") is None:
        with pytest.raises(ImportError, match="pip install pandas"):
            run.to_pandas()
    else:
        tel, ev = run.to_pandas()
        assert len(tel) == run.telemetry.num_rows and list(ev["step"].dropna()[:1]) == [0]


def test_summary_of_the_run(recorded_run):
    s = powertrain.summary(recorded_run)
    assert (recorded_run / "summary.json").is_file()
    assert s == powertrain.load(recorded_run).summary()
    text = repr(s)
    assert "step" in text  # step-time metrics come from the 3 measured steps


def test_load_of_a_folder_that_is_not_a_run_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no run\.json"):
        powertrain.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="--out"):
        powertrain.summary(tmp_path)
