"""Importers: other tools' records → standard run directories (one module per format).

::

    from powertrain.importers import import_sources
    run_dir = import_sources("nvsmi", ["gpu.csv"], out="runs/old1", tz="Europe/Berlin")

Kinds: ``nvsmi`` (nvidia-smi CSV), ``mlperf`` (MLLOG power + result logs), ``zeus`` (Zeus windows /
power samples, Perseus profiles), ``powertraces`` (long per-GPU CSV), ``study_csv`` (the study's
``<metric>_<rank>.csv``), ``framework_log`` (Megatron-LM / torchtitan / NeMo step lines),
``kineto`` (PyTorch profiler traces), or ``auto`` (per source, see
:func:`powertrain.importers.detect.detect_kind`). Several sources of different kinds (e.g. an
nvidia-smi log and the training log of the same job) are joined into one run directory.

Every import that yields ``step`` events marks the measurement protocol's windows on them, as the
built-in trainer does: all steps are ``measured`` except the first ``warmup_steps`` (``--warmup-steps``,
default 0; MLPerf keeps only its own run_start → run_stop window). Sources without wall-clock times
(NeMo progress bars, Megatron logs without stamps, Perseus profiles, monotonic Zeus windows) need
``anchor_ns`` (``--anchor``) and are refused without it. ``run.json["job_device_count"]`` is the
job's device count (null when the sources do not state it), which per-device throughput divides by.

Every importer raises :class:`SourceFormatError` (file, line, problem) on malformed input and writes
nothing; the run directory appears complete or not at all (:class:`RunBuilder`).
"""

from powertrain.importers.common import RunBuilder, SourceFormatError
from powertrain.importers.detect import detect_kind
from powertrain.importers.registry import KINDS, build, import_sources, merge

__all__ = ["KINDS", "RunBuilder", "SourceFormatError", "build", "detect_kind", "import_sources", "merge"]
