"""The sweep table: one row per run with knobs, metrics and a status that keeps failures apart."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from powertrain.analyze import is_sweep_dir, summarize_sweep, synthetic


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return synthetic.write_sweep(tmp_path_factory.mktemp("sw") / "sweep")


def test_sweep_table_statuses_and_knobs(sweep):
    assert is_sweep_dir(sweep) and not is_sweep_dir(sweep / "oom")
    table = summarize_sweep(sweep)
    on_disk = pq.read_table(sweep / "summary.parquet")
    assert on_disk.num_rows == 6
    rows = {r["id"]: r for r in table.to_pylist()}
    assert rows["tp1pp1"]["status"] == "ok" and rows["tp2pp1"]["status"] == "ok"
    assert rows["oom"]["status"] == "oom"  # the log tail says out of memory
    assert rows["crash"]["status"] == "failed"  # a segfault is not an OOM
    assert rows["bad-heads"]["status"] == "rejected" and "tp" in rows["bad-heads"]["reason"]
    assert rows["later"]["status"] == "not-run"
    assert rows["tp2pp1"]["tp"] == 2 and rows["bad-heads"]["tp"] == 3
    assert rows["tp1pp1"]["model"] == "gpt3-tiny"
    assert rows["tp1pp1"]["power_mean_w"] == pytest.approx(400.0, rel=1e-3)
    assert rows["tp2pp1"]["power_mean_w"] == pytest.approx(450.0, rel=1e-3)
    assert rows["bad-heads"]["power_mean_w"] is None  # not run: null, not zero
    assert on_disk.schema.field("energy_j").type == "double"
    assert (sweep / "tp1pp1" / "summary.json").is_file()


def test_not_a_sweep_names_the_fix(tmp_path):
    from powertrain.analyze import load_sweep

    with pytest.raises(FileNotFoundError, match="neither a run directory"):
        load_sweep(tmp_path)


def test_summarize_cli_run_and_sweep(sweep):
    from typer.testing import CliRunner

    from powertrain.cli import app

    r = CliRunner().invoke(app, ["summarize", str(sweep), "--refresh"])
    assert r.exit_code == 0, r.output
    assert "summary.parquet" in r.output and "oom" in r.output
    r = CliRunner().invoke(app, ["summarize", str(sweep / "tp1pp1")])
    assert r.exit_code == 0, r.output
    assert "step_time_mean_s" in r.output and "summary.json" in r.output
    # a null metric is counted in one line, and listed with --all
    assert "pcie_bytes_per_step" not in r.output and "metrics have no value" in r.output
    r = CliRunner().invoke(app, ["summarize", str(sweep / "tp1pp1"), "--all"])
    assert r.exit_code == 0 and "pcie_bytes_per_step" in r.output


def test_sweep_runner_statuses(tmp_path):
    """The sweep runner's vocabulary: planned → not-run, reasons list, duplicates kept apart."""
    import json

    from powertrain.analyze.sweep import load_sweep

    root = tmp_path / "s"
    synthetic.write_run(root / "a", hosts=1, devices_per_host=1, steps=2)
    (root / "sweep.json").write_text(json.dumps({"runs": [
        {"id": "a", "status": "ok", "reasons": []},
        {"id": "b", "status": "planned", "reasons": []},
        {"id": "c", "status": "duplicate", "reasons": [], "duplicate_of": "a"},
        {"id": "d", "status": "unsupported", "reasons": ["fsdp with pp is not supported by the trainer"]},
    ]}))
    rows = {r["id"]: r for r in load_sweep(root)[0]}
    assert rows["b"]["status"] == "not-run"
    assert rows["c"]["status"] == "duplicate" and "as a" in rows["c"]["reason"]
    assert rows["d"]["status"] == "unsupported" and "fsdp" in rows["d"]["reason"]
