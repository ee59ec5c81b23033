"""Which importer reads a source: decided from the file's name and first bytes, never guessed.

:func:`detect_kind` returns a kind only when the evidence is unambiguous; otherwise ``None`` and the
user names the kind (``powertrain import KIND ...``).
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

_METRIC_FILE = re.compile(r"^[a-z][a-z0-9_]*_\d+\.csv$")
_NVSMI_FIELDS = ("power.draw", "temperature.gpu", "utilization.gpu", "clocks.sm", "clocks.current.sm",
                 "memory.used", "power.draw.instant", "power.draw.average")


def _head(path: Path, n: int = 65536) -> str:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read(n).decode("utf-8", "replace")
        with open(path, "rb") as f:
            return f.read(n).decode("utf-8", "replace")
    except (OSError, EOFError):
        return ""


def detect_kind(path: str | Path) -> str | None:
    """``nvsmi`` | ``mlperf`` | ``zeus`` | ``powertraces`` | ``study_csv`` | ``framework_log`` |
    ``kineto`` | ``None`` (ambiguous or unknown)."""
    p = Path(path)
    if p.is_dir():
        kinds = {detect_kind(x) for x in sorted(p.iterdir())[:200] if x.is_file()}
        names = [x.name for x in p.iterdir()]
        if any(n.startswith("power") for n in names if (p / n).is_dir()) or "mlperf" in kinds:
            return "mlperf"
        kinds.discard(None)
        # only formats whose importer reads a whole folder as one run; a folder of nvidia-smi logs (or
        # of Zeus CSVs) is usually several runs, so it must be named file by file. A Perseus folder
        # (<plan>.prof.json beside its configuration) is one job.
        if kinds == {"zeus"} and any(n.endswith(".prof.json") for n in names):
            return "zeus"
        return kinds.pop() if len(kinds) == 1 and kinds <= {"kineto", "study_csv"} else None
    head = _head(p)
    if not head:
        return None
    first = head.splitlines()[0].strip() if head.splitlines() else ""
    low = first.lower().replace(" ", "")
    name = p.name.removesuffix(".gz")
    if ":::MLLOG" in head and (name.startswith(("node_", "result_")) or '"power_reading"' in head
                               or '"run_start"' in head or '"submission_benchmark"' in head):
        return "mlperf"
    if name.startswith("result_") and ":::MLLOG" in _head(p, 8_000_000):
        return "mlperf"
    if name.startswith("total_power"):
        return "mlperf"
    if low.startswith("timestamp,") and any(f in low for f in _NVSMI_FIELDS):
        return "nvsmi"
    if "gpu_id" in low.split(",") and "power_w" in low.split(",") and "timestamp" in low.split(","):
        return "powertraces"
    if low.startswith("start_time,window_name,elapsed_time") or low == "time,power" or name.endswith(".prof.json"):
        return "zeus"
    if name.endswith((".json", ".json.gz")) or head.lstrip().startswith("{"):
        if '"traceEvents"' in head or ('"schemaVersion"' in head and '"ph"' in head):
            return "kineto"
        return None
    if _METRIC_FILE.match(name) and re.match(r"^\s*[0-9.]+\s*,\s*-?[0-9.eE+-]+\s*$", first):
        return "study_csv"
    from powertrain.importers.framework_logs import sniff

    return "framework_log" if sniff(p) in ("megatron", "torchtitan", "nemo") else None
