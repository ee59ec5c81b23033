"""RankAttachment (what both trainer callbacks use), in one process: own run vs. the monitor's run."""

from __future__ import annotations

import time

import pytest

import powertrain
from powertrain.integrations import RankAttachment


def _steps(att: RankAttachment, n: int) -> None:
    for i in range(1, n + 1):
        h = att.begin_step(i, samples=2)
        h.tokens = 32
        time.sleep(0.01)
        att.end_step(loss=1.0 / i)


def test_single_rank_creates_its_run_and_closes_it(tmp_path):
    att = RankAttachment(tmp_path / "own", warmup_steps=2)
    att.start(rank=0, local_rank=0, world_size=1)
    _steps(att, 4)
    att.stop("ok")
    run = powertrain.load(tmp_path / "own")
    assert run.status == "ok" and run.telemetry.num_rows > 0
    assert run.steps["window"].to_pylist() == ["warmup", "warmup", "measured", "measured"]
    assert run.steps["tokens"].to_pylist() == [32] * 4


def test_under_powertrain_monitor_only_events_are_written(tmp_path, monkeypatch):
    with powertrain.Monitor(tmp_path / "mon") as mon:
        monkeypatch.setenv("POWERTRAIN_RUN_DIR", str(mon.run_dir))
        att = RankAttachment(tmp_path / "ignored")
        assert att.start(rank=3, local_rank=1, world_size=4) == mon.run_dir
        assert att.monitor is None  # the monitor's sampler is the node's sampler
        _steps(att, 2)
        att.stop("ok")
    assert not (tmp_path / "ignored").exists()
    st = powertrain.load(tmp_path / "mon").steps
    assert set(st["rank"].to_pylist()) == {3} and st.num_rows == 2


def test_other_nodes_first_rank_attaches_to_the_owners_run(tmp_path):
    owner = powertrain.Monitor(tmp_path / "run", host="node0").start()
    try:
        node1 = powertrain.Monitor(tmp_path / "run", host="node1").attach(timeout_s=5)
        time.sleep(0.3)
        node1.detach()
    finally:
        info = owner.stop("ok")
    assert info["hosts"] == ["node0", "node1"]  # every node's sampler is in the run
    assert {d["host"] for d in info["devices"]} == {"node0", "node1"}
    with pytest.raises(powertrain.monitor.MonitorError, match="shared filesystem"):
        powertrain.Monitor(tmp_path / "nothing").attach(timeout_s=0.2)
