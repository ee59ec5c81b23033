"""Issue 17's CPU acceptance, with real runs: `advise` for llama3-tiny on 4 CPU ranks, with a profile
calibrated from four real runs of this host, and a confirmation sweep of its top 3 (real runs).

It runs ``benchmarks/advise_cpu_check.py`` (one flow for the benchmark and this test): the advice picks
a layout, the measured order of its top 3 is compared with the advised one (a disagreement is reported,
not failed: close configurations swap on a busy 2-core host), and the advised #1 must be within 15 % of
the best measured run. Measured speeds on a shared host only ever lose time to neighbours, so each run
counts at its fastest measured step, and a miss is re-measured once before it fails (the check runs
the confirmation sweep again and counts each configuration at its faster run).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _check_script():
    spec = importlib.util.spec_from_file_location("advise_cpu_check", ROOT / "benchmarks" / "advise_cpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["advise_cpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_the_advised_layout_is_within_15_percent_of_the_best_measured(tmp_path: Path) -> None:
    check = _check_script()
    log: list[str] = []
    adv, conf = check.check(tmp_path, steps=3, log=log)
    report = "\n".join(log)

    assert len(adv.top) == 3, report
    labels = [r.point.cand.label() for r in adv.top]
    assert len(set(labels)) == 3, report
    # the profile came from this host's real runs, and every confirmation run was measured
    assert all((tmp_path / "calibration" / n / "run.json").is_file() for n in check.CAL_RUNS)
    assert [r["tokens_per_s"] is not None for r in conf.rows] == [True] * 3, report
    # the order is either confirmed or the disagreement is reported, with the measured order
    assert conf.agree or any(line.startswith("DISAGREEMENT: measured order #") for line in conf.lines()), report
    assert conf.top1_gap is not None and conf.top1_gap <= check.TARGET, report
