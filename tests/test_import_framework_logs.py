"""Training logs → step events: Megatron-LM, torchtitan, NeMo/Lightning (synthetic lines in their formats)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from powertrain.importers import import_sources
from powertrain.importers.common import SourceFormatError, parse_anchor
from powertrain.importers.framework_logs import import_framework_log, sniff
from powertrain.store import read_events

ENGINE = Path(__file__).parent / "fixtures" / "engine_logs"


def _utc_ns(*a):
    return int(dt.datetime(*a, tzinfo=dt.UTC).timestamp()) * 10**9


def _megatron_line(ts, it, ms, loss, tflops=180.5, gbs=512):
    return (f" [{ts}] iteration {it:8d}/  500000 | consumed samples: {it * gbs:12d} | elapsed time per iteration "
            f"(ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | learning rate: 3.000000E-04 | "
            f"global batch size: {gbs:5d} | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 1.234 | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |\n")


def test_megatron_single_iteration_lines_are_steps(tmp_path):
    f = tmp_path / "megatron.log"
    f.write_text("building GPT model ...\n"
                 + _megatron_line("2024-05-01 10:00:02", 1, 2000.0, 11.0)
                 + "[after training is done] datetime: ...\n"
                 + _megatron_line("2024-05-01 10:00:04", 2, 1500.0, 10.5)
                 + _megatron_line("2024-05-01 10:00:34", 12, 1400.0, 9.5))
    assert sniff(f) == "megatron"
    b = import_framework_log([f], tz="UTC", seq_len=2048)
    ev = b.events()
    steps = ev.filter(pc.equal(ev.column("kind"), "step"))
    assert steps.column("step").to_pylist() == [1, 2]
    assert steps.column("t_end_ns").to_pylist()[1] == _utc_ns(2024, 5, 1, 10, 0, 4)
    assert steps.column("t_start_ns").to_pylist()[1] == _utc_ns(2024, 5, 1, 10, 0, 4) - 1_500_000_000
    assert steps.column("loss").to_pylist() == [11.0, 10.5]
    assert steps.column("samples").to_pylist() == [512, 512]
    assert steps.column("tokens").to_pylist() == [512 * 2048, 512 * 2048]
    assert json.loads(steps.column("attrs")[0].as_py())["tflops_per_gpu"] == 180.5
    # a line averaging 10 iterations is not a step: per-step times are not in the log
    interval = ev.filter(pc.equal(ev.column("name"), "train_interval")).to_pylist()
    assert len(interval) == 1
    attrs = json.loads(interval[0]["attrs"])
    assert attrs["iterations"] == 10 and attrs["step_time_s"] == 1.4 and attrs["first_step"] == 3
    assert interval[0]["t_end_ns"] - interval[0]["t_start_ns"] == 14_000_000_000


def test_torchtitan_lines_with_colours(tmp_path):
    red, reset = "\x1b[31m", "\x1b[39m"
    lines = [f"[titan] 2025-01-01 12:00:{s:02d},{ms:03d} - root - INFO - {red}step: {step:2d}  "
             f"loss: {loss:7.4f}  memory: 30.12GiB(38.12%)  tps: 6,123  tflops: 123.45  mfu: 39.57%{reset}\n"
             for s, ms, step, loss in [(0, 0, 1, 12.0), (1, 500, 2, 11.0), (3, 0, 3, 10.0), (10, 0, 8, 9.0)]]
    f = tmp_path / "titan.log"
    f.write_text("[titan] 2025-01-01 11:59:00,000 - root - INFO - Building llama3 8B\n" + "".join(lines))
    assert sniff(f) == "torchtitan"
    ev = import_framework_log([f], tz="UTC").events()
    steps = ev.filter(pc.equal(ev.column("kind"), "step"))
    assert steps.column("step").to_pylist() == [2, 3]  # step 1 has no earlier line to start its window
    assert (steps.column("t_end_ns")[0].as_py() - steps.column("t_start_ns")[0].as_py()) == 1_500_000_000
    assert steps.column("mem_peak_bytes")[0].as_py() == int(30.12 * 2**30)
    a = json.loads(steps.column("attrs")[0].as_py())
    assert a["tps_per_gpu"] == 6123 and a["mfu_pct"] == 39.57
    assert ev.filter(pc.equal(ev.column("name"), "train_interval")).num_rows == 1  # steps 4..8 in one line


def test_nemo_progress_bars_give_back_to_back_steps_from_the_anchor(tmp_path):
    bars = "".join(f"\rEpoch 0: :  {i}%|#| {i}/50 [00:{i:02d}<01:00, reduced_train_loss={7 - i / 10:.3f}, "
                   f"global_step={i - 1}.0, consumed_samples={i * 128}.0, train_step_timing in s={1.5 + i / 100:.2f}]"
                   for i in range(1, 6))
    f = tmp_path / "nemo.log"
    f.write_text("Loading...\n" + bars + bars[-120:] + "\n")
    # no wall-clock times and no anchor: refused, one line naming the option, nothing written
    with pytest.raises(SourceFormatError, match=r"nemo\.log: the log has no wall-clock times: pass --anchor TIME"):
        import_sources("framework_log", [f], tmp_path / "run")
    assert not (tmp_path / "run").exists()
    anchor = parse_anchor("2024-05-01T10:00:00+02:00")
    assert anchor == _utc_ns(2024, 5, 1, 8, 0, 0)
    out = import_sources("framework_log", [f], tmp_path / "run", anchor_ns=anchor)
    ev = read_events(out)
    assert ev.column("step").to_pylist() == [0, 1, 2, 3, 4]
    assert ev.column("t_start_ns")[0].as_py() == anchor  # the first step starts at the anchor
    dur = [(e - s) / 1e9 for s, e in zip(ev.column("t_start_ns").to_pylist(), ev.column("t_end_ns").to_pylist(),
                                         strict=True)]
    assert dur == pytest.approx([1.51, 1.52, 1.53, 1.54, 1.55])
    assert ev.column("t_start_ns")[1].as_py() == ev.column("t_end_ns")[0].as_py()
    assert ev.column("samples").to_pylist() == [None, 128, 128, 128, 128]  # consumed_samples differences
    info = json.loads((out / "run.json").read_text())
    assert "--anchor 2024-05-01T08:00:00+00:00" in info["time_origin"]
    assert info["start_ns"] == anchor


def test_anchor_text_forms_and_refusals():
    assert parse_anchor("1714557600") == 1714557600 * 10**9
    assert parse_anchor("1714557600.5") == 1714557600_500_000_000
    assert parse_anchor("2024-05-01T10:00:00Z") == _utc_ns(2024, 5, 1, 10, 0, 0)
    assert parse_anchor("2024-05-01 12:00:00.25", tz="Europe/Berlin") == _utc_ns(2024, 5, 1, 10, 0, 0) + 250_000_000
    for bad, why in (("yesterday", "neither ISO-8601"), ("0", "before 2001"), ("nan", "not a time")):
        with pytest.raises(ValueError, match=why):
            parse_anchor(bad)


def test_anchor_is_refused_for_a_log_with_its_own_times(tmp_path):
    f = tmp_path / "m.log"
    f.write_text(_megatron_line("2024-05-01 10:00:02", 1, 2000.0, 11.0))
    with pytest.raises(ValueError, match="drop --anchor"):
        import_framework_log([f], tz="UTC", anchor_ns=parse_anchor("2024-05-01T10:00:00Z"))


def test_megatron_without_stamps_needs_the_anchor_and_starts_there(tmp_path):
    f = tmp_path / "m.log"
    f.write_text("".join(_megatron_line("x", i, 1000.0 + i, 10.0).replace(" [x]", "") for i in (1, 2, 3)))
    with pytest.raises(SourceFormatError, match="--anchor"):
        import_framework_log([f], tz="UTC")
    a = _utc_ns(2024, 5, 1, 10, 0, 0)
    steps = import_framework_log([f], anchor_ns=a).events()
    assert steps.column("t_start_ns").to_pylist() == [a, a + 1_001_000_000, a + 2_003_000_000]


def _summary(out):
    from powertrain.analyze.summary import summarize_run

    return summarize_run(out, probe_cpu_peak=False)


def test_engine_logs_show_step_time_and_throughput_in_the_summary(tmp_path):
    """Each engine's import has a measured window, so summarize gives its numbers (not "no metric")."""
    anchor = _utc_ns(2025, 8, 19, 14, 28, 0)
    cases = {  # fixture: (options, expected mean step time of the measured steps, s)
        "megatron.log": ({"tz": "UTC", "seq_len": 2048}, None),
        "torchtitan.log": ({"tz": "UTC"}, None),
        "nemo1.log": ({"anchor_ns": anchor}, (5.120 + 2.040 + 2.010 + 2.030 + 1.990) / 5),
        "nemo2.log": ({"anchor_ns": anchor}, (5.276 + 2.008 + 1.991 + 2.013 + 1.987 + 2.002) / 6),
    }
    for name, (opts, expect) in cases.items():
        out = import_sources("framework_log", [ENGINE / name], tmp_path / name, **opts)
        ev = read_events(out)
        steps = ev.filter(pc.equal(ev.column("kind"), "step"))
        assert set(steps.column("window").to_pylist()) == {"measured"}, name
        m = _summary(out)["metrics"]
        assert m["step_time_mean_s"] is not None and m["step_time_mean_s"] > 0, name
        if expect is not None:
            assert m["step_time_mean_s"] == pytest.approx(expect, rel=1e-9), name
    # Megatron: fractional stamps are wall-clock (not relative), 8 samples × 2048 tokens per step, world size 2
    meg = tmp_path / "megatron.log"
    info = json.loads((meg / "run.json").read_text())
    assert info["start"].startswith("2025-06-02T09:14:55.9") and "time_origin" not in info
    assert info["job_device_count"] == 2
    m = _summary(meg)["metrics"]
    assert m["tokens_per_s"] == pytest.approx(6 * 8 * 2048 / m["step_time_mean_s"] / 6, rel=1e-9)
    assert m["tokens_per_s_per_device"] == pytest.approx(m["tokens_per_s"] / 2)
    # torchtitan: the start line gives tokens per step (16 × 2048); the log states no world size
    titan = _summary(tmp_path / "torchtitan.log")
    assert titan["metrics"]["tokens_per_s"] == pytest.approx(16 * 2048 / titan["metrics"]["step_time_mean_s"])
    assert titan["metrics"]["tokens_per_s_per_device"] is None
    assert "device count is unknown" in titan["why_null"]["tokens_per_s_per_device"]


def test_warmup_steps_leave_the_rest_measured(tmp_path):
    out = import_sources("framework_log", [ENGINE / "nemo1.log"], tmp_path / "run",
                         anchor_ns=_utc_ns(2025, 1, 1, 0, 0, 0), warmup_steps=1)
    ev = read_events(out)
    assert ev.column("window").to_pylist() == ["warmup"] + ["measured"] * 4
    m = _summary(out)["metrics"]
    assert m["step_time_mean_s"] == pytest.approx((2.040 + 2.010 + 2.030 + 1.990) / 4)
    info = json.loads((out / "run.json").read_text())
    assert info["measured_window"]["warmup_steps"] == 1 and info["measured_window"]["measured_steps"] == 4
    with pytest.raises(ValueError, match="--warmup-steps 5 leaves no measured step: the import has 5"):
        import_sources("framework_log", [ENGINE / "nemo1.log"], tmp_path / "run2",
                       anchor_ns=_utc_ns(2025, 1, 1, 0, 0, 0), warmup_steps=5)


def test_broken_megatron_line_is_named(tmp_path):
    f = tmp_path / "m.log"
    f.write_text(_megatron_line("2024-05-01 10:00:02", 1, 2000.0, 11.0)
                 + " iteration        x/  500000 | elapsed time per iteration (ms): 12.0 |\n")
    with pytest.raises(SourceFormatError, match=r"m\.log:2: Megatron iteration line"):
        import_sources("framework_log", [f], tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_runs_window_is_the_measured_steps_or_mlperfs_own(tmp_path):
    out = import_sources("framework_log", [ENGINE / "nemo1.log"], tmp_path / "run",
                         anchor_ns=_utc_ns(2025, 1, 1, 0, 0, 0), warmup_steps=1)
    ev = read_events(out)
    w = json.loads((out / "run.json").read_text())["window"]
    assert w["t0_ns"] == ev.column("t_start_ns")[1].as_py() and w["t1_ns"] == ev.column("t_end_ns")[4].as_py()
    assert w["source"] == "framework log: first measured step start → last measured step end"
    log = next((Path(__file__).parent / "fixtures" / "mlperf" / "llama2-70b-lora_1node_8gpu_excerpt").glob("result_*"))
    b = import_framework_log([log])
    ml = b.info["mlperf"]
    assert b.info["window"] == {"t0_ns": ml["run_start_ms"] * 1_000_000, "t1_ns": ml["run_stop_ms"] * 1_000_000,
                                "source": "MLPerf run_start → run_stop"}
