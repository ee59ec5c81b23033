"""``launch.retries``: a failed run is run again after a doubling back-off, every attempt recorded."""

from __future__ import annotations

import shutil

from powertrain.launch.sweep import SweepOptions, SweepRunner
from powertrain.plan.planner import plan
from powertrain.plan.sweep_spec import parse_sweep_spec

# The runs' interpreter is `false`: every launch fails at once, before creating its run — a real
# failure of the launch (as a broken interpreter on a node would fail it), without a torch start per try.
BROKEN = SweepOptions(python=shutil.which("false") or "/bin/false")


def _spec(retries: int) -> dict:
    return {"name": "retry", "base": {"model": "gpt3-tiny"}, "launch": {"retries": retries, "retry_backoff_s": 7}}


def test_a_failed_run_is_retried_with_doubling_back_off_and_every_attempt_kept(tmp_path):
    waits: list[float] = []
    runner = SweepRunner(plan(parse_sweep_spec(_spec(2))), tmp_path / "out", BROKEN, sleep=waits.append)
    state = runner.run()
    (run,) = state.runs
    assert waits == [7, 14]  # retry_backoff_s, doubled before each further re-try
    assert run["status"] == "failed" and run["attempts"] == 3  # the first try and two re-tries
    assert [r["attempt"] for r in run["retries"]] == [1, 2] and [r["backoff_s"] for r in run["retries"]] == [7, 14]
    assert all("exited with 1 before creating the run" in r["reason"] for r in run["retries"])
    assert "exited with 1 before creating the run" in run["reason"]  # the last attempt's own reason
    assert len(list((tmp_path / "out" / ".launch").glob("*.log"))) == 1  # one launch log, every attempt in it


def test_without_retries_a_failed_run_is_run_once(tmp_path):
    waits: list[float] = []
    (run,) = SweepRunner(plan(parse_sweep_spec(_spec(0))), tmp_path / "out", BROKEN, sleep=waits.append).run().runs
    assert waits == [] and run["attempts"] == 1 and "retries" not in run
