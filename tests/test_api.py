"""The stable public API: Monitor + step/phase markers → load() and summary() of the same run.

Nothing here wires the hooks by hand: a ``Monitor`` block must do it, as the README promises.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import powertrain
from powertrain import hooks
from powertrain.hooks import markers


def _busy(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


@pytest.fixture(autouse=True)
def _fresh_hooks(monkeypatch):
    # Each test starts with no process-wide recorder and without a run directory from outside, so a
    # marker outside a Monitor block is a no-op; monkeypatch puts the old recorder back afterwards.
    monkeypatch.setattr(markers, "_recorder", None)
    monkeypatch.delenv(hooks.RUN_DIR_ENV, raising=False)


@pytest.fixture
def recorded_run(tmp_path):
    out = tmp_path / "api-run"
    with powertrain.Monitor(out=out, rate_hz=50, warmup_steps=1):
        for i in range(4):
            with powertrain.step(i, tokens=1024, samples=8) as s:
                with powertrain.phase("forward"):
                    _busy(0.05)
                with powertrain.phase("backward"):
                    _busy(0.05)
                s.loss = 2.0 - 0.1 * i
    return out


def test_public_names_are_exported():
    for name in ("Monitor", "step", "phase", "begin_step", "end_step", "set_window", "window", "load", "summary",
                 "Run"):
        assert hasattr(powertrain, name), name
        assert getattr(powertrain, name).__doc__, f"{name} has no docstring"


def test_load_gives_pyarrow_tables_of_the_run(recorded_run):
    run = powertrain.load(recorded_run)
    assert run.status == "ok"
    assert run.info["warmup_steps"] == 1
    assert isinstance(run.telemetry, pa.Table) and run.telemetry.num_rows > 0
    assert isinstance(run.events, pa.Table)
    steps = run.steps
    assert steps["step"].to_pylist() == [0, 1, 2, 3]
    assert steps["loss"].to_pylist() == pytest.approx([2.0, 1.9, 1.8, 1.7])
    assert steps["window"].to_pylist() == ["warmup", "measured", "measured", "measured"]
    phases = run.events.filter(pc.equal(run.events["kind"], "forward"))
    assert phases.num_rows == 4 and phases["step"].to_pylist() == [0, 1, 2, 3]
    assert phases["window"].to_pylist() == ["warmup", "measured", "measured", "measured"]
    # every step interval lies inside the sampled window, on the same clock
    t = run.telemetry["t_ns"]
    assert pc.min(t).as_py() <= pc.min(steps["t_start_ns"]).as_py()
    assert pc.max(steps["t_end_ns"]).as_py() <= run.info["end_ns"]
    # the events file was compacted when the block ended, not left as crash-safe segments
    assert (recorded_run / "events" / "rank-0.parquet").is_file()
    assert not (recorded_run / "events" / "rank-0.parts").exists()


def test_to_pandas(recorded_run):
    run = powertrain.load(recorded_run)
    tel, ev = run.to_pandas()
    assert len(tel) == run.telemetry.num_rows and list(ev["step"].dropna()[:1]) == [0]
    assert len(run.telemetry.to_pandas()) == run.telemetry.num_rows
    assert list(run.events.to_pandas().columns) == run.events.schema.names


def test_summary_of_the_run(recorded_run):
    s = powertrain.summary(recorded_run)
    assert (recorded_run / "summary.json").is_file()
    assert s == powertrain.load(recorded_run).summary()
    assert s["window"]["measured_steps"] == 3  # step 0 is the declared warm-up
    assert s["metrics"]["step_time_mean_s"] >= 0.1  # forward + backward busy 0.05 s each
    assert s["metrics"]["tokens_per_s"] == pytest.approx(1024 / s["metrics"]["step_time_mean_s"])


def test_readme_snippet_records_measured_steps(tmp_path, monkeypatch, caplog):
    # The README's snippet, with a small real loop: int token batches, a float matmul per step.
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    loader = [rng.integers(0, 50_000, size=(4, 256)) for _ in range(6)]
    weight = rng.standard_normal((256, 256))

    def train_step(batch: np.ndarray) -> None:
        x = batch.astype(np.float64) / 50_000
        for _ in range(20):
            x = np.tanh(x @ weight)

    with powertrain.Monitor(out="runs/try2"):
        for i, batch in enumerate(loader):
            with powertrain.step(i, tokens=batch.size):
                train_step(batch)

    run = powertrain.load("runs/try2")
    s = powertrain.summary("runs/try2")
    assert "not recorded" not in caplog.text  # the new user's only clue, before the fix

    steps = run.steps
    assert steps["step"].to_pylist() == list(range(6))
    assert steps["window"].to_pylist() == ["measured"] * 6
    assert steps["tokens"].to_pylist() == [4 * 256] * 6
    m = s["metrics"]
    assert s["window"]["measured_steps"] == 6 and s["window"]["source"] == "measured steps"
    durations = (pc.subtract(steps["t_end_ns"], steps["t_start_ns"]).to_numpy() / 1e9)
    assert m["step_time_mean_s"] == pytest.approx(durations.mean())
    assert m["step_time_mean_s"] > 0
    assert m["tokens_per_s"] == pytest.approx(6 * 4 * 256 / durations.sum())
    # unknown is null with a reason, never 0: this machine has no power or energy sensor
    if "energy" in run.info["not_measured"]:
        assert m["energy_j"] is None and s["why_null"]["energy_j"]
        assert m["j_per_token"] is None and s["why_null"]["j_per_token"]
    else:  # a machine with an energy counter or a power sensor: a real, positive energy
        assert m["energy_j"] > 0
    assert len(run.telemetry.to_pandas()) == run.telemetry.num_rows > 0


def test_warmup_window_block_and_set_window(tmp_path):
    out = tmp_path / "w"
    with powertrain.Monitor(out=out, rate_hz=20, backends=["host"], warmup_steps=1):
        with powertrain.window("warmup"), powertrain.step(0, tokens=10):  # the loop declares warm-up itself
            _busy(0.01)
        for i in range(1, 4):  # automatic again: step 1 is the 2nd step, past warmup_steps=1
            with powertrain.step(i, tokens=10):
                _busy(0.01)
        powertrain.set_window(None)  # from here on the loop's own choice: outside the protocol
        with powertrain.step(4, tokens=10):
            _busy(0.01)
    run = powertrain.load(out)
    assert run.steps["window"].to_pylist() == ["warmup", "measured", "measured", "measured", None]
    assert powertrain.summary(out)["window"]["measured_steps"] == 3


def test_markers_go_back_to_no_op_after_the_block(tmp_path, caplog):
    out = tmp_path / "b"
    with powertrain.Monitor(out=out, rate_hz=20, backends=["host"]), powertrain.step(0, tokens=1):
        pass
    with powertrain.step(1, tokens=1):  # no run any more: not recorded, and said so
        pass
    assert powertrain.load(out).steps["step"].to_pylist() == [0]
    assert "not recorded" in caplog.text  # the one warning, on stderr where logging is not configured


def test_a_block_without_markers_leaves_no_events_file(tmp_path):
    out = tmp_path / "n"
    with powertrain.Monitor(out=out, rate_hz=20, backends=["host"]):
        _busy(0.1)
    assert not list(out.glob("events/rank-*"))  # the monitoring process marked nothing
    s = powertrain.summary(out)
    assert s["window"]["source"].startswith("whole telemetry span")


def test_bad_warmup_steps_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="warmup_steps"):
        powertrain.Monitor(out=tmp_path / "x", warmup_steps=-1)
    assert not (tmp_path / "x").exists()


def test_load_of_a_folder_that_is_not_a_run_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no run\.json"):
        powertrain.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="--out"):
        powertrain.summary(tmp_path)
