"""The sweep table: one row per run with knobs, metrics and a status that keeps failures apart."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from powertrain.analyze import is_sweep_dir, summarize_sweep, synthetic
from powertrain.store.rundir import RunDir


def make_sweep(root):
    root.mkdir()
    synthetic.write_run(root / "tp1pp1", hosts=1, devices_per_host=2, steps=2, base_w=400.0)
    synthetic.write_run(root / "tp2pp1", hosts=1, devices_per_host=2, steps=2, base_w=450.0, layout={"tp": 2})
    synthetic.write_run(root / "oom", hosts=1, devices_per_host=2, steps=2, status="failed",
                        reason="command exited with code 1")
    (RunDir(root / "oom").logs_dir / "rank-0.stderr").write_text(
        "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB\n")
    synthetic.write_run(root / "crash", hosts=1, devices_per_host=2, steps=2, status="failed",
                        reason="command killed by SIGSEGV")
    (root / "sweep.json").write_text(json.dumps({"name": "demo", "runs": [
        {"id": "tp1pp1", "status": "ok", "variant": "base", "axes": {"tp": 1}},
        {"id": "tp2pp1", "status": "ok", "variant": "base", "axes": {"tp": 2}},
        {"id": "oom", "status": "failed", "variant": "base", "axes": {"tp": 4}},
        {"id": "crash", "status": "failed", "variant": "base", "axes": {"tp": 8}},
        {"id": "bad-heads", "status": "rejected", "reason": "heads (8) % tp (3) != 0",
         "config": {"model": "gpt3-tiny", "layout": {"tp": 3}}, "axes": {"tp": 3}},
        {"id": "later", "status": "not-run", "config": {"model": "gpt3-tiny"}, "axes": {"tp": 16}},
    ]}))
    return root


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_sweep(tmp_path_factory.mktemp("sw") / "sweep")


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
