"""The sweep table: one row per run of a sweep folder, with its knobs, metrics and status.

A sweep folder holds run directories as subfolders and, optionally, ``sweep.json`` written by the
sweep runner: ``{"name": ..., "runs": [{"id", "status", "reason", "config", "variant", "axes"}]}``.
Runs listed there without a folder (rejected by validation, not run yet) still get a row, with their
status from ``sweep.json``. Statuses keep apart what the study's scripts mixed up:

``ok`` · ``failed`` (crashed for any reason other than memory) · ``oom`` (only when the reason or the
log tail says out-of-memory) · ``rejected`` / ``unsupported`` (refused before launch) · ``duplicate``
(same effective configuration as another run; not launched) · ``not-run`` (planned, not launched
yet) · ``running``. Predictions are rows whose ``kind`` is ``prediction``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from powertrain.analyze.metrics import METRIC_NAMES
from powertrain.analyze.summary import load_summary
from powertrain.store.leftovers import remove_stale
from powertrain.store.rundir import set_file_mode
from powertrain.store.sweep_log import read_sweep
from powertrain.store.validate import DamagedRun

SWEEP_STATUSES = ("ok", "failed", "oom", "rejected", "unsupported", "duplicate", "not-run", "running")
# the sweep runner's "planned" (not launched yet) is "not-run" here


def _entry_reason(e: dict[str, Any]) -> str | None:
    """``reason`` (or the sweep runner's ``reasons`` list, and ``duplicate_of``) of a sweep.json entry."""
    if e.get("reason"):
        return str(e["reason"])
    parts = [str(r) for r in e.get("reasons") or []]
    if e.get("duplicate_of"):
        parts.append(f"same effective configuration as {e['duplicate_of']}")
    return "; ".join(parts) or None


def is_sweep_dir(path: str | Path) -> bool:
    p = Path(path)
    if (p / "run.json").exists():  # a damaged run.json still makes a run directory
        return False
    return (p / "sweep.json").is_file() or any((c / "run.json").is_file() for c in p.iterdir() if c.is_dir())


def config_columns(config: dict[str, Any] | None) -> dict[str, Any]:
    """The knobs a sweep varies, flattened to columns (``None`` where the config lacks them)."""
    c = config or {}
    model = c.get("model")
    layout = c.get("layout") or {}
    knobs = c.get("knobs") or {}
    hw = c.get("hardware") or {}
    model_name = model if isinstance(model, str) else (model or {}).get("name")
    nodes, per = hw.get("nodes"), hw.get("devices_per_node")
    return {
        "model": model_name,
        "dp": layout.get("dp"), "tp": layout.get("tp"), "pp": layout.get("pp"), "cp": layout.get("cp"),
        "ep": layout.get("ep"), "fsdp": layout.get("fsdp"), "pp_schedule": layout.get("pp_schedule"),
        "micro_batch": knobs.get("micro_batch"), "global_batch": knobs.get("global_batch"),
        "recompute": knobs.get("recompute"), "precision": knobs.get("precision"),
        "power_limit_w": knobs.get("power_limit_w"),
        "nodes": nodes, "devices_per_node": per, "device_type": hw.get("device"),
        "world": nodes * per if isinstance(nodes, int) and isinstance(per, int) else None,
    }


def layout_label(row: dict[str, Any]) -> str:
    """A short configuration label like ``TP4·PP2·EP8 mb2 rc=full`` (the study's x-axis)."""
    parts = []
    for k in ("tp", "pp", "dp", "ep", "cp"):
        v = row.get(k)
        if v is not None and (v != 1 or k in ("tp", "pp")):
            parts.append(f"{k.upper()}{v}")
    if row.get("fsdp"):
        parts.append("FSDP")
    label = "·".join(parts) or str(row.get("id"))
    if row.get("variant"):
        label += f" {row['variant']}"
    if row.get("micro_batch") not in (None, 1):
        label += f" mb{row['micro_batch']}"
    if row.get("recompute") not in (None, "none"):
        label += f" rc={row['recompute']}"
    return label


def load_sweep(path: str | Path, *, refresh: bool = False, damaged: list[str] | None = None
               ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """(rows of the sweep table, {run id: summary}) for a sweep folder.

    A damaged run directory (:class:`powertrain.store.validate.DamagedRun`) raises, unless a
    ``damaged`` list is given: then its one line (``RUN: file: problem``) goes there and the run is
    left out of the table (the caller reports the count).
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} does not exist")
    meta = read_sweep(root) or {}  # sweep.json with the changes logged since (store.sweep_log)
    entries = {str(e.get("id")): e for e in meta.get("runs", []) if e.get("id") is not None}
    folders = {c.name: c for c in sorted(root.iterdir()) if c.is_dir() and (c / "run.json").is_file()}
    order = list(entries) + [k for k in folders if k not in entries]
    if not order:
        raise FileNotFoundError(
            f"{root} is neither a run directory (no run.json) nor a sweep folder (no sweep.json and no "
            "subfolder with a run.json); point at a run written by `powertrain run`/`monitor` or a sweep folder")
    rows: list[dict[str, Any]] = []
    summaries: dict[str, dict[str, Any]] = {}
    for rid in order:
        e = entries.get(rid, {})
        if rid in folders:
            try:
                summ = load_summary(folders[rid], refresh=refresh)
            except DamagedRun as exc:
                if damaged is None:
                    raise
                damaged.append(str(exc))
                continue
            summaries[rid] = summ
            status = summ.get("status")
            # The runner may know better (it saw the OOM); it never downgrades a finished ok run.
            if e.get("status") == "oom" and status == "failed":
                status = "oom"
            kind = summ.get("kind", "measured")
            metrics = summ.get("metrics") or {}
            config = summ.get("config") or e.get("config")
            reason = summ.get("reason") or _entry_reason(e)
        else:
            status = e.get("status") or "not-run"
            status = "not-run" if status == "planned" else status
            kind, metrics, config, reason = "none", {}, e.get("config"), _entry_reason(e)
            if status in ("ok", "failed", "oom", "running") and not reason:
                reason = f"sweep.json says {status}, but the run folder {rid}/ is not here"
        row: dict[str, Any] = {"id": rid, "status": status, "kind": kind, "reason": reason,
                               "variant": e.get("variant"), **config_columns(config)}
        for k, v in (e.get("axes") or {}).items():
            row[f"axis.{k}"] = v
        row["label"] = layout_label(row)
        for m in METRIC_NAMES:
            v = metrics.get(m)
            row[m] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        rows.append(row)
    return rows, summaries


def _column(values: list[Any]) -> pa.Array:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.array(values, pa.bool_())
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.array(values, pa.int64())
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    return pa.array([None if v is None else str(v) for v in values], pa.string())


def sweep_table(rows: list[dict[str, Any]]) -> pa.Table:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    table = pa.table({k: _column([r.get(k) for r in rows]) for k in keys})
    # metric columns are always float64, even when every run left them null
    return table.cast(pa.schema([pa.field(f.name, pa.float64()) if f.name in METRIC_NAMES else f
                                 for f in table.schema]))


def write_sweep_table(path: str | Path, table: pa.Table) -> Path:
    """Write ``<sweep>/summary.parquet`` atomically (temporary file removed on every error path)."""
    final = Path(path) / "summary.parquet"
    if final.is_symlink() or (final.exists() and not final.is_file()):
        raise ValueError(f"{final}: not a file written by powertrain (a link or a folder); it is never replaced")
    remove_stale(Path(path), [".summary.parquet.{pid}.tmp"])  # a summarize that was killed writing it
    tmp = Path(path) / f".summary.parquet.{os.getpid()}.tmp"
    try:
        pq.write_table(table, tmp)
        set_file_mode(tmp)
        tmp.replace(final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def summarize_sweep(path: str | Path, *, write: bool = True, refresh: bool = False,
                    damaged: list[str] | None = None) -> pa.Table:
    """The sweep table of ``path``; writes ``summary.parquet`` (and each run's ``summary.json``).

    ``damaged``: see :func:`load_sweep` (collect damaged runs' lines there and go on)."""
    rows, _ = load_sweep(path, refresh=refresh, damaged=damaged)
    table = sweep_table(rows)
    if write:
        write_sweep_table(path, table)
    return table
