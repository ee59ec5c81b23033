"""`powertrain monitor --parse ENGINE`: engines' printed step lines become step events, live."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

from powertrain.core.engine_logs import parse_step_line
from powertrain.live.parse import LiveStepParser
from powertrain.store import read_events

FIX = Path(__file__).parent / "fixtures" / "engine_logs"

# Prints a fixture as an engine would: line by line (\n or tqdm's \r), flushed, with small pauses.
PRINTER = """
import re, sys, time
text = open(sys.argv[1], encoding="utf-8").read()
for piece in re.findall(r"[^\\r\\n]*[\\r\\n]", text):
    sys.stdout.write(piece); sys.stdout.flush(); time.sleep(0.08)
"""


def _monitor(tmp_path: Path, engine: str, fixture: str, *extra: str) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path / engine
    res = subprocess.run(
        [sys.executable, "-m", "powertrain.cli.__main__", "monitor", "--out", str(out), "--quiet",
         "--parse", engine, *extra, "--", sys.executable, "-c", PRINTER, str(FIX / fixture)],
        capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return out, res


def _steps(out: Path):
    ev = read_events(out)
    return sorted(ev.filter(pc.equal(ev["kind"], "step")).to_pylist(), key=lambda r: r["step"])


def _attrs(row):
    return json.loads(row["attrs"])


@pytest.mark.slow
def test_megatron_lines_become_steps_with_reported_times_and_throughput(tmp_path):
    out, res = _monitor(tmp_path, "megatron", "megatron.log", "--seq-len", "2048")
    steps = _steps(out)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    durations_ms = [(s["t_end_ns"] - s["t_start_ns"]) / 1e6 for s in steps]
    assert durations_ms == pytest.approx([812.4, 402.1, 398.7, 401.5, 399.9, 400.3], abs=1e-3)
    assert [s["window"] for s in steps] == ["warmup"] + ["measured"] * 5
    assert all(s["samples"] == 8 and s["tokens"] == 8 * 2048 for s in steps)
    assert steps[0]["loss"] == pytest.approx(10.82734)
    assert _attrs(steps[1])["tflops_per_gpu"] == pytest.approx(41.3)
    # Samples/s the analysis derives from these rows: global batch ÷ reported step time.
    assert 8 / (durations_ms[1] / 1e3) == pytest.approx(19.895, abs=1e-3)
    assert "parsed 6 megatron step line(s) into 6 event(s)" in res.stderr
    # Events end when their line arrived: inside the run, in order.
    info = json.loads((out / "run.json").read_text())
    assert all(info["start_ns"] < s["t_end_ns"] < info["end_ns"] for s in steps)
    assert [s["t_end_ns"] for s in steps] == sorted(s["t_end_ns"] for s in steps)


@pytest.mark.slow
def test_torchtitan_windows_run_from_the_previous_line(tmp_path):
    out, _ = _monitor(tmp_path, "torchtitan", "torchtitan.log")
    steps = _steps(out)
    assert [s["step"] for s in steps] == [2, 3, 4, 5, 6]  # step 1's line only opens the first window
    assert all(s["rank"] == 0 for s in steps)
    durations_s = [(s["t_end_ns"] - s["t_start_ns"]) / 1e9 for s in steps]
    assert durations_s == pytest.approx([1.414, 1.371, 1.386, 1.372, 1.389], abs=1e-6)
    a = _attrs(steps[0])
    assert a["tps_per_gpu"] == 5795 and a["mfu_pct"] == pytest.approx(41.72)
    assert steps[0]["mem_peak_bytes"] == int(22.31 * 2**30)
    assert steps[-1]["loss"] == pytest.approx(9.0228)


@pytest.mark.slow
def test_nemo2_progress_lines(tmp_path):
    out, _ = _monitor(tmp_path, "nemo", "nemo2.log", "--warmup-steps", "2")
    steps = _steps(out)
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4, 5]
    durations_s = [(s["t_end_ns"] - s["t_start_ns"]) / 1e9 for s in steps]
    assert durations_s == pytest.approx([5.276, 2.008, 1.991, 2.013, 1.987, 2.002], abs=1e-9)
    assert [s["window"] for s in steps].count("measured") == 4
    assert all(s["samples"] == 8 for s in steps)


def test_nemo1_progress_bar_redraws_count_once(tmp_path):
    p = LiveStepParser("nemo", tmp_path / "run", clock=iter(range(10**10, 10**12, 10**9)).__next__)
    text = (FIX / "nemo1.log").read_text(encoding="utf-8")
    for i in range(0, len(text), 37):  # arbitrary chunking: lines are reassembled across chunks
        p.feed(text[i:i + 37].encode())
    p.close()
    steps = _steps(tmp_path / "run")
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4]
    assert [(s["t_end_ns"] - s["t_start_ns"]) / 1e9 for s in steps] == pytest.approx([5.12, 2.04, 2.01, 2.03, 1.99])
    assert _attrs(steps[4])["consumed_samples"] == 40.0


def test_megatron_interval_line_is_not_split_into_invented_steps(tmp_path):
    p = LiveStepParser("megatron", tmp_path / "run", warmup_steps=0)
    line = (" [2025-06-02 09:14:56.712400] iteration {:8d}/     100 | consumed samples: 80 | elapsed time per "
            "iteration (ms): 400.0 | global batch size:     8 | lm loss: 9.5E+00 |")
    p.feed_line(line.format(10), t_ns=10**12)
    row = p.feed_line(line.format(20), t_ns=2 * 10**12)
    p.close()
    assert row["kind"] == "phase" and row["attrs"]["iterations"] == 10
    assert row["t_end_ns"] - row["t_start_ns"] == 4_000_000_000 and row["samples"] == 80


def test_lines_that_are_not_step_lines_are_ignored():
    assert parse_step_line("megatron", "[Rank 1] (after 1 iterations) memory (MB) | allocated: 2210.5") is None
    assert parse_step_line("torchtitan", "[titan] 2025-03-10 14:02:05,871 - root - INFO - Training starts") is None
    assert parse_step_line("nemo", "[NeMo I 2025-08-19 14:27:47 nemo_logging:393] Setting up optimizers") is None
    with pytest.raises(ValueError, match="choose one of"):
        LiveStepParser("deepspeed", "x")


def test_unknown_engine_is_a_usage_error(tmp_path):
    from typer.testing import CliRunner

    from powertrain.cli import app

    res = CliRunner().invoke(app, ["monitor", "--out", str(tmp_path / "x"), "--parse", "fairseq", "--", "true"])
    assert res.exit_code == 2 and "megatron, torchtitan, nemo" in res.output
    assert not (tmp_path / "x").exists()  # refused before anything started
