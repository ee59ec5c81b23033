"""Hugging Face Trainer callback: a 2-rank torchrun run → one run directory, per-rank steps, report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

import powertrain

pytest.importorskip("transformers", reason="needs the [hf] extra: pip install 'powertrain[hf]'")

SCRIPT = Path(__file__).parent / "fixtures" / "trainers" / "hf_tiny.py"


def check_two_rank_run(out: Path, steps: int, samples: int, tokens: int) -> None:
    """What both trainer callbacks must leave behind (shared with the Lightning test)."""
    run = powertrain.load(out)
    assert run.status == "ok", run.info.get("reason")
    assert run.info["hosts"] and len(run.info["sampler_hosts"]) == 1  # one node, one sampler
    assert sorted(p.name for p in (out / "events").glob("rank-*.parquet")) == ["rank-0.parquet", "rank-1.parquet"]
    assert not list((out / "telemetry").glob("*.parts"))  # every stream compacted at the end
    st = run.steps
    for rank in (0, 1):
        mine = st.filter(pc.equal(st["rank"], rank))
        assert mine["step"].to_pylist() == list(range(1, steps + 1))
        assert mine["window"].to_pylist() == ["warmup"] + ["measured"] * (steps - 1)
        assert set(mine["samples"].to_pylist()) == {samples} and set(mine["tokens"].to_pylist()) == {tokens}
        assert mine["loss"].null_count == 0
    assert run.telemetry.num_rows > 0
    # steps happened while the sampler ran, on the same clock
    assert run.info["start_ns"] <= pc.min(st["t_start_ns"]).as_py() <= pc.max(st["t_end_ns"]).as_py() <= run.info["end_ns"]
    rep = subprocess.run([sys.executable, "-m", "powertrain.cli.__main__", "report", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert (out / "report" / "report.html").stat().st_size > 1000


@pytest.mark.slow
def test_hf_trainer_two_ranks_under_torchrun(tmp_path):
    out = tmp_path / "hf-run"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(SCRIPT), str(out), str(tmp_path / "work")],
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    check_two_rank_run(out, steps=5, samples=4, tokens=4 * 16)
    # HF's logged loss is the same on every rank (the Trainer averages it across processes)
    st = powertrain.load(out).steps
    by_rank = [st.filter(pc.equal(st["rank"], r))["loss"].to_pylist() for r in (0, 1)]
    assert by_rank[0] == pytest.approx(by_rank[1])
