"""Confirmation: did the measured runs of advise's top N come out in the advised order?

The sweep ``--emit FILE.yaml`` writes lists the top N as ``cases`` in the advised order, so the
sweep's ``sweep.json`` holds them in that order (``index``). :func:`confirm` reads each finished
run's measured step time (:func:`powertrain.predict.read_measured_run`, the same reader
``calibrate`` uses: step events of the measured window), ranks them by measured tokens/s and says
whether the orders agree, and how far the advised #1 is from the best measured run. Each run's
step time is the median over its measured steps (the slowest rank's time per step), or with
``statistic="min"`` the fastest one: on a machine shared with other work, interference only ever
adds time, so the fastest step of a few is the steadier estimate of the configuration's own speed.
For the same reason a sweep that ran again (``repeats``) counts each configuration at its faster run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from powertrain.plan.state import SweepState
from powertrain.predict import read_measured_run
from powertrain.store import read_events


@dataclass
class Confirmation:
    rows: list[dict[str, Any]]  # advised rank, run id, measured step s, measured tok/s, measured rank (None: no run)
    agree: bool  # measured order of the finished runs equals the advised order
    top1_gap: float | None  # best measured tok/s ÷ advised #1's measured tok/s − 1 (0: #1 was the fastest)
    notes: list[str]

    def lines(self) -> list[str]:
        out = [f"advised #{r['advised']}: {r['id']}: "
               + (f"{r['tokens_per_s']:,.1f} tok/s measured (step {r['step_s']:.4g} s"
                  f"{', the faster of ' + str(r['runs']) + ' runs' if r.get('runs', 1) > 1 else ''}), measured rank "
                  f"#{r['measured']}" if r["tokens_per_s"] is not None else f"not measured ({r['why']})")
               for r in self.rows]
        out.append("measured order agrees with the advised order" if self.agree else
                   "DISAGREEMENT: measured order " + " > ".join(f"#{r['advised']}" for r in
                                                               sorted((r for r in self.rows if r["measured"]),
                                                                      key=lambda r: r["measured"])))
        if self.top1_gap is not None:
            out.append(f"advised #1 is {self.top1_gap:.1%} below the best measured run" if self.top1_gap > 0 else
                       "advised #1 is the fastest measured run")
        return out + [f"note: {n}" for n in self.notes]


def median_step_s(run_dir: Path, statistic: Literal["median", "min"] = "median") -> float:
    """Median (or minimum) over the measured steps of the slowest rank's step time: on a shared machine
    one step slowed by a neighbour moves a mean of a few steps by tens of percent, a median much less."""
    import numpy as np
    import pyarrow.compute as pc

    ev = read_events(run_dir)
    steps = ev.filter(pc.and_(pc.equal(ev["kind"], "step"), pc.equal(ev["window"], "measured")))
    step = np.asarray(steps["step"].to_pylist(), dtype=float)
    dur = (np.asarray(steps["t_end_ns"].to_pylist(), dtype=float)
           - np.asarray(steps["t_start_ns"].to_pylist(), dtype=float)) / 1e9
    if not dur.size:
        raise ValueError(f"{run_dir}: no measured step events")
    per_step = [dur[step == s].max() for s in np.unique(step)]
    return float(np.min(per_step) if statistic == "min" else np.median(per_step))


def confirm(sweep_dir: str | os.PathLike[str], statistic: Literal["median", "min"] = "median",
            repeats: Sequence[str | os.PathLike[str]] = ()) -> Confirmation:
    """Compare the measured runs of a confirmation sweep with the advised order (its case order).

    ``repeats``: folders where the same emitted sweep ran again. A configuration's step is then the
    shortest over all its runs (each taken with ``statistic``): interference only adds time, so the
    faster of two runs minutes apart is the closer estimate of the configuration's own speed.
    """
    folders = [Path(sweep_dir), *(Path(f) for f in repeats)]
    sweeps = [_finished_runs(f) for f in folders]
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for i, r in enumerate(sweeps[0], 1):
        row: dict[str, Any] = {"advised": i, "id": r["id"], "step_s": None, "tokens_per_s": None, "measured": None,
                               "why": None, "runs": 0}
        for folder, runs in zip(folders, sweeps, strict=True):
            same = next((x for x in runs if x["id"] == r["id"]), None)
            if same is None:
                notes.append(f"{folder}: {r['id']} is not in this sweep (a repeat must run the same emitted sweep)")
                continue
            try:
                m = read_measured_run(folder / r["id"])  # checks the run and gives its configuration
                step = median_step_s(folder / r["id"], statistic)
            except (OSError, ValueError) as exc:
                row["why"] = str(exc).splitlines()[0]
                notes.append(f"{folder / r['id']}: {row['why']}")
                continue
            row["runs"] += 1
            if row["step_s"] is None or step < row["step_s"]:
                row["step_s"] = step
                row["tokens_per_s"] = m.case.global_batch * m.case.seq_len / step
        rows.append(row)
    done = [r for r in rows if r["tokens_per_s"] is not None]
    for rank, r in enumerate(sorted(done, key=lambda r: -r["tokens_per_s"]), 1):
        r["measured"] = rank
    agree = [r["measured"] for r in done] == sorted(r["measured"] for r in done)
    gap = None
    if done and rows[0]["tokens_per_s"] is not None:
        gap = max(r["tokens_per_s"] for r in done) / rows[0]["tokens_per_s"] - 1
    return Confirmation(rows, agree, gap, notes)


def _finished_runs(folder: Path) -> list[dict[str, Any]]:
    state = SweepState.load(folder)
    if state is None:
        raise ValueError(f"{folder}: no sweep.json; run the emitted sweep first (powertrain sweep FILE-sweep.yaml "
                         "--out DIR)")
    return sorted((r for r in state.runs if r.get("status") not in ("rejected", "duplicate", "unsupported")),
                  key=lambda r: r.get("index", 0))
