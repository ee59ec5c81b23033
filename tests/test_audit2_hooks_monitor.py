"""Audit 2 (H3, M1, M2, M4, M5): marker values are checked when given, a Monitor block always ends
its run, the environment the markers read is refused in one line naming the variable, ``flush_s``
reaches the step events, ``end_step(tokens=…)`` fills the step's columns, and counts are never
negative."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

import powertrain
from powertrain import hooks
from powertrain.cli import app
from powertrain.hooks import markers
from powertrain.live.parse import LiveStepParser
from powertrain.sampler_process import _arguments
from powertrain.store import read_events

runner = CliRunner()


@pytest.fixture(autouse=True)
def _own_recorder(monkeypatch):
    """Each test starts with no process-wide recorder and a clean marker environment."""
    monkeypatch.setattr(markers, "_recorder", None)
    for var in (hooks.FLUSH_ENV, "RANK", hooks.RUN_DIR_ENV):
        monkeypatch.delenv(var, raising=False)


def _steps(run_dir):
    return [e for e in read_events(run_dir).to_pylist() if e["kind"] == "step"]


# -- H3 (a), M5: values are checked on the line that gives them ------------------------------------
@pytest.mark.parametrize(("kwargs", "words"), [
    ({"tokens": math.nan}, ["tokens", "None when the count is unknown"]),
    ({"tokens": -4096}, ["tokens", "cannot be negative"]),
    ({"samples": -2}, ["samples", "cannot be negative"]),
    ({"tokens": 4096.9}, ["tokens", "round(tokens)"]),
    ({"tokens": True}, ["tokens", "int(tokens)"]),
    ({"samples": "8"}, ["samples", "int(samples)"]),
    ({"tokens": np.array([4096])}, ["tokens", ".item()"]),
])
def test_bad_counts_are_refused_at_begin_step(tmp_path, kwargs, words):
    rec = hooks.Recorder(tmp_path)
    with pytest.raises(ValueError) as err:
        rec.begin_step(0, **kwargs)
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    # nothing was opened: the loop can go on and every row it writes reaches the file
    with rec.step(0, tokens=10, samples=1) as s:
        s.loss = 1.5
    rec.close()
    assert [(e["step"], e["tokens"], e["loss"]) for e in _steps(tmp_path)] == [(0, 10, 1.5)]


def test_a_tensor_loss_is_refused_on_the_assignment_naming_item(tmp_path):
    torch = pytest.importorskip("torch")
    rec = hooks.Recorder(tmp_path)
    with pytest.raises(ValueError, match=r"loss must be a number.*call \.item\(\)") as err, rec.step(0) as s:
        s.loss = torch.tensor(2.5)
    assert "\n" not in str(err.value)
    rec.close()
    (row,) = _steps(tmp_path)  # the step is kept, marked failed, with no loss
    assert row["loss"] is None and json.loads(row["attrs"]) == {"failed": True}


@pytest.mark.parametrize(("field", "value", "word"), [
    ("mem_peak_bytes", -5 * 2**30, "cannot be negative"),
    ("loss", np.array(2.5), ".item()"),
    ("loss", "2.5", "float(loss)"),
    ("tokens", -1, "cannot be negative"),
])
def test_bad_values_are_refused_at_end_step_and_on_the_handle(tmp_path, field, value, word):
    rec = hooks.Recorder(tmp_path)
    h = rec.begin_step(0)
    with pytest.raises(ValueError, match=field) as err:
        rec.end_step(**{field: value})
    assert word in str(err.value)
    with pytest.raises(ValueError, match=field):
        setattr(h, field, value)
    rec.end_step()  # the step stayed open and closes normally
    rec.close()
    assert len(_steps(tmp_path)) == 1


def test_values_are_checked_without_a_run_directory_too():
    rec = hooks.Recorder(None)
    with pytest.raises(ValueError, match="tokens"):
        rec.begin_step(0, tokens=-1)
    with pytest.raises(ValueError, match="step must be a whole number"):
        rec.begin_step("0")


def test_good_values_of_other_types_are_stored_as_python_numbers(tmp_path):
    rec = hooks.Recorder(tmp_path)
    with rec.step(np.int64(0), tokens=4096.0, samples=np.int32(8)) as s:  # a whole float is that int
        s.loss = np.float32(2.5)
        s.mem_peak_bytes = np.uint64(1 << 30)
    with rec.step(1, tokens=0) as s:
        s.loss = math.nan  # a diverged loss is what was measured: kept
    rec.close()
    a, b = _steps(tmp_path)
    assert (a["step"], a["tokens"], a["samples"], a["loss"], a["mem_peak_bytes"]) == (0, 4096, 8, 2.5, 1 << 30)
    assert b["tokens"] == 0 and math.isnan(b["loss"])


def test_phase_and_record_columns_are_checked_before_anything_changes(tmp_path):
    rec = hooks.Recorder(tmp_path)
    rec.begin("forward")
    with pytest.raises(ValueError, match="tokens"):
        rec.end(tokens=-3)
    rec.end(tokens=3)  # the interval was still open
    with pytest.raises(ValueError, match="samples"):
        rec.record("step", 1, 2, step=5, samples=-1)
    with pytest.raises(ValueError, match="t_end_ns"):
        rec.record("comm", 1, 2.5)
    rec.close()
    assert [(e["kind"], e["tokens"]) for e in read_events(tmp_path).to_pylist()] == [("forward", 3)]


# -- H3 (b): a Monitor block that exits with an exception still ends its run ------------------------
def test_a_bad_marker_value_in_a_monitor_block_ends_the_run_failed_and_stops_the_sampler(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="tokens"), powertrain.Monitor(out=out, backends=["host"]) as m:
        for i in range(3):
            with powertrain.step(i, tokens=100 if i != 2 else math.nan):
                pass
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and "ValueError: tokens must be a whole number" in info["reason"]
    assert m.sampler is not None and m.sampler.poll() is not None  # stopped, not left running
    assert not list(out.rglob("*.parts"))  # telemetry and events compacted
    assert [e["step"] for e in _steps(out)] == [0, 1]  # the steps before the bad one are kept


def test_stop_finishes_the_run_even_when_closing_the_events_fails(tmp_path, monkeypatch):
    out = tmp_path / "run"
    m = powertrain.Monitor(out=out, backends=["host"]).start()

    def broken_unbind(binding):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hooks, "unbind", broken_unbind)
    with pytest.raises(OSError, match="No space left"):
        m.stop("ok")
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed"
    assert "step events could not be closed: OSError" in info["reason"]
    assert m.sampler is not None and m.sampler.poll() is not None


def test_unbind_gives_the_process_back_its_recorder_even_when_closing_fails(tmp_path, monkeypatch):
    before = hooks.Recorder(tmp_path / "before", lazy=True)
    monkeypatch.setattr(markers, "_recorder", before)
    binding = hooks.bind(tmp_path / "bound")

    def broken_close():
        raise OSError("disk full")

    monkeypatch.setattr(binding.recorder, "close", broken_close)
    with pytest.raises(OSError):
        hooks.unbind(binding)
    assert markers._recorder is before


# -- M1: the environment the markers read -----------------------------------------------------------
@pytest.mark.parametrize("value", ["abc", "1s", "nan", "inf", "-1"])
def test_a_bad_events_flush_variable_is_refused_naming_it(tmp_path, monkeypatch, value):
    monkeypatch.setenv(hooks.FLUSH_ENV, value)
    for call in (lambda: hooks.configure(tmp_path), lambda: hooks.bind(tmp_path)):
        with pytest.raises(ValueError, match=rf"^POWERTRAIN_EVENTS_FLUSH_S='{value}' is not a number of seconds"
                                             r".*fix or unset it$"):
            call()


@pytest.mark.parametrize(("value", "expected"), [("0", 0.0), ("0.25", 0.25), ("", 1.0), (None, 1.0)])
def test_good_events_flush_values_are_used(tmp_path, monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv(hooks.FLUSH_ENV, value)
    assert hooks.configure(tmp_path)._flush_s == expected
    hooks.close()


@pytest.mark.parametrize("value", ["abc", "-3", "1.5", "²", "٣"])
def test_a_bad_rank_variable_is_refused_naming_it(tmp_path, monkeypatch, value):
    monkeypatch.setenv("RANK", value)
    with pytest.raises(ValueError, match=rf"^RANK='{value}' is not a rank .*fix or unset it$"):
        hooks.configure(tmp_path)


@pytest.mark.parametrize(("var", "value"), [(hooks.FLUSH_ENV, "1s"), ("RANK", "abc")])
def test_monitor_refuses_a_bad_variable_before_anything_starts(tmp_path, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    out = tmp_path / "run"
    m = powertrain.Monitor(out=out, backends=["host"])
    with pytest.raises(ValueError, match=var):
        m.start()
    assert m.sampler is None and not out.exists()


# -- M2: Monitor(flush_s=…) ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 0, "abc", True])
def test_monitor_flush_s_must_be_positive_and_finite(tmp_path, value):
    with pytest.raises(ValueError, match=r"^flush_s=.* is not a number of seconds > 0"):
        powertrain.Monitor(out=tmp_path / "run", flush_s=value)
    assert not (tmp_path / "run").exists()


def test_monitor_flush_s_reaches_the_step_events_and_the_sampler(tmp_path, monkeypatch):
    monkeypatch.setenv(hooks.FLUSH_ENV, "5")  # an explicit flush_s wins over the environment
    with powertrain.Monitor(out=tmp_path / "a", backends=["host"], flush_s=0.25) as m:
        assert hooks.get()._flush_s == 0.25
        assert m.sampler is not None and m.sampler.args[m.sampler.args.index("--flush") + 1] == "0.25"
    # left out: the steps follow $POWERTRAIN_EVENTS_FLUSH_S, the telemetry the default second
    with powertrain.Monitor(out=tmp_path / "b", backends=["host"]) as m:
        assert hooks.get()._flush_s == 5.0
        assert m.sampler is not None and m.sampler.args[m.sampler.args.index("--flush") + 1] == "1.0"


@pytest.mark.parametrize("value", ["nan", "0", "-1", "x"])
def test_the_sampler_process_refuses_a_bad_flush(value, capsys):
    with pytest.raises(SystemExit) as exc:
        _arguments(["run", "--flush", value])
    assert exc.value.code == 2 and "--flush" in capsys.readouterr().err


# -- M4: end_step(tokens=…, samples=…) fills the step's columns ---------------------------------------
def test_end_step_counts_reach_the_step_row(tmp_path):
    rec = hooks.Recorder(tmp_path)
    rec.begin_step(0)
    rec.end_step(loss=1.0, tokens=4096, samples=8, lr=0.1)
    rec.begin_step(1, tokens=10, samples=1)
    rec.end_step(tokens=20)  # given at the end: replaces the count given at the start
    rec.close()
    a, b = _steps(tmp_path)
    assert (a["tokens"], a["samples"], json.loads(a["attrs"])) == (4096, 8, {"lr": 0.1})
    assert (b["tokens"], b["samples"]) == (20, 1)


def test_end_step_tokens_give_tokens_per_second_in_the_summary(tmp_path):
    out = tmp_path / "run"
    with powertrain.Monitor(out=out, backends=["host"]):
        for i in range(4):
            powertrain.begin_step(i)
            powertrain.end_step(loss=1.0, tokens=4096, samples=8)
    assert [e["tokens"] for e in _steps(out)] == [4096] * 4
    summary = powertrain.summary(out)
    assert summary["metrics"]["tokens_per_s"] is not None and summary["metrics"]["tokens_per_s"] > 0


# -- M5: --seq-len ------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["-4096", "0"])
def test_monitor_seq_len_must_be_at_least_one(tmp_path, value):
    out = tmp_path / "run"
    res = runner.invoke(app, ["monitor", "--out", str(out), "--backends", "host", "--parse", "megatron",
                              "--seq-len", value, "--", "true"])
    assert res.exit_code == 2 and "--seq-len" in res.output
    assert not out.exists()


@pytest.mark.parametrize("value", [-4096, 0, 4096.5, True])
def test_live_parser_refuses_a_seq_len_below_one(tmp_path, value):
    with pytest.raises(ValueError, match="--seq-len must be a whole number of tokens per sample >= 1"):
        LiveStepParser("megatron", tmp_path, seq_len=value)


def test_record_refuses_an_unknown_kind_and_an_interval_that_ends_before_it_starts(tmp_path):
    rec = hooks.Recorder(tmp_path)
    with pytest.raises(ValueError, match=r"event kind must be one of .*got 'forwrd'"):
        rec.record("forwrd", 1, 2)
    with pytest.raises(ValueError, match=r"t_end_ns 1 is before t_start_ns 2"):
        rec.record("comm", 2, 1)
    rec.record("comm", 1, 2)
    rec.close()


def test_monitor_refuses_a_command_given_as_one_string(tmp_path):
    with pytest.raises(ValueError, match=r"command: give the command as a list of arguments"):
        powertrain.Monitor(tmp_path / "run", command="python train.py")


@pytest.mark.parametrize("value", ["nan", "-1", "0"])
def test_run_refuses_a_timeout_that_is_not_a_positive_number_of_seconds(value):
    from pathlib import Path

    spec = Path(__file__).resolve().parents[1] / "examples" / "run-llama-dp2.yaml"
    res = CliRunner().invoke(app, ["run", str(spec), "--check", "--timeout", value])
    assert res.exit_code == 2 and "--timeout" in res.output
