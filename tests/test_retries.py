"""``launch.retries``: a failed run is run again after a doubling back-off, every attempt recorded."""

from __future__ import annotations

from powertrain.launch.sweep import SweepOptions, SweepRunner
from powertrain.plan.planner import plan
from powertrain.plan.sweep_spec import parse_sweep_spec


def _spec(retries: int) -> dict:
    # An H100 spec without hardware.stand_in cannot start on this CPU machine: `powertrain run` refuses
    # it in one line before creating the run, every time — a real failure, fast.
    return {"name": "retry", "base": {"model": "gpt3-tiny", "hardware": {"device": "h100-sxm"}},
            "launch": {"retries": retries, "retry_backoff_s": 7}}


def test_a_failed_run_is_retried_with_doubling_back_off_and_every_attempt_kept(tmp_path):
    waits: list[float] = []
    runner = SweepRunner(plan(parse_sweep_spec(_spec(2))), tmp_path / "out", SweepOptions(), sleep=waits.append)
    state = runner.run()
    (run,) = state.runs
    assert waits == [7, 14]  # retry_backoff_s, doubled before each further re-try
    assert run["status"] == "failed" and run["attempts"] == 3  # the first try and two re-tries
    assert [r["attempt"] for r in run["retries"]] == [1, 2] and [r["backoff_s"] for r in run["retries"]] == [7, 14]
    assert all("this node has no GPU" in r["reason"] for r in run["retries"])
    assert "this node has no GPU" in run["reason"]  # the last attempt's own reason


def test_without_retries_a_failed_run_is_run_once(tmp_path):
    waits: list[float] = []
    (run,) = SweepRunner(plan(parse_sweep_spec(_spec(0))), tmp_path / "out", SweepOptions(), sleep=waits.append).run().runs
    assert waits == [] and run["attempts"] == 1 and "retries" not in run
