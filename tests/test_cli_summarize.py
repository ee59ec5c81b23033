"""`powertrain summarize` prints the metrics that have a value, counts the null ones in one line."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from powertrain.analyze import synthetic
from powertrain.cli import app


def test_run_prints_values_and_one_line_for_nulls(tmp_path):
    run = synthetic.write_run(tmp_path / "r", hosts=2, devices_per_host=2, steps=3, kind="cpu")
    res = CliRunner().invoke(app, ["summarize", str(run)])
    assert res.exit_code == 0, res.output
    summ = json.loads((run / "summary.json").read_text())
    metrics = summ["metrics"]
    have = [k for k, v in metrics.items() if v is not None]
    null = [k for k, v in metrics.items() if v is None]
    assert have and null  # a CPU-kind run: step times yes, GPU-only fields no
    for name in have:
        assert name in res.output
    for name in null:
        assert f"│ {name} " not in res.output  # no row of "—"
    assert f"{len(null)} metrics have no value here" in res.output
    assert "2 nodes: mean power" in res.output  # two hosts: the per-node spread
    full = CliRunner().invoke(app, ["summarize", str(run), "--all"])
    assert full.exit_code == 0, full.output
    assert all(name in full.output for name in null)
    assert "metrics have no value here" not in full.output


def test_sweep_table_leaves_out_columns_null_everywhere(tmp_path):
    sweep = synthetic.write_sweep(tmp_path / "s")
    res = CliRunner().invoke(app, ["summarize", str(sweep)])
    assert res.exit_code == 0, res.output
    assert "tp1pp1" in res.output and "power_mean_w" in res.output
    assert (sweep / "summary.parquet").is_file()
