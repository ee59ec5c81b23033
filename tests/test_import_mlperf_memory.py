"""An MLPerf power log's readings are held in typed arrays (issue 29: a 3 MB gzip inside an MLPerf folder
reached the 2 GiB import cap only at 5.3 GB of memory, ~330 bytes of Python objects a reading).

The cap itself stops a bomb with one line; what the read keeps per reading until then is measured with
``tracemalloc`` as the growth between two caps (the fixed buffers cancel), which is deterministic: the
old lists of ints, floats, tuples and ``file:line`` strings grew ~330 bytes a reading, the arrays ~45.
"""

from __future__ import annotations

import gzip
import shutil
import tracemalloc
from array import array
from pathlib import Path

import pytest
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.importers.common import RunBuilder, SourceTooLarge, byte_cap
from powertrain.importers.mlperf import mlcommons_node_power_w, read_power_log

FIXTURE = Path(__file__).parent / "fixtures" / "mlperf" / "llama2-70b-lora_1node_8gpu_excerpt"
START = (':::MLLOG {"namespace": "", "time_ms": 1715277987815, "event_type": "INTERVAL_START", '
         '"key": "power_measurement_start", "value": "null", "metadata": ""}\n')
READING = (':::MLLOG {"namespace": "", "time_ms": %d, "event_type": "POINT_IN_TIME", "key": "power_reading", '
           '"value": 2845, "metadata": ""}\n')
runner = CliRunner()


def _bomb(path: Path, mib: int) -> None:
    """``mib`` MiB of power_reading lines, a few hundred KiB on disk."""
    block = "".join(READING % (1715277991847 + 2000 * i) for i in range(2000)).encode()
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(START.encode())
        for _ in range(mib * 2**20 // len(block) + 1):
            f.write(block)


def test_a_capped_import_of_a_bomb_stops_with_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    node = run / "power_ac" / "node_0.txt"
    node.unlink()
    _bomb(node.with_name("node_0.txt.gz"), 3)
    res = runner.invoke(app, ["import", "mlperf", str(run), "--out", str(tmp_path / "out"), "--max-bytes", "1MiB"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "node_0.txt.gz" in lines[0] and "import size cap of 1 MiB" in lines[0], res.output
    assert not (tmp_path / "out").exists()


def _growth(path: Path, cap: int) -> tuple[int, int]:
    """(peak bytes traced, readings read) of reading ``path`` until the cap stops it."""
    tracemalloc.start()
    try:
        with byte_cap(cap), pytest.raises(SourceTooLarge):
            read_power_log(path, RunBuilder(format="mlperf"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, cap // len(READING % 1715277991847)


def test_readings_cost_typed_arrays_not_python_objects_until_the_cap(tmp_path: Path) -> None:
    bomb = tmp_path / "node_0.txt.gz"
    _bomb(bomb, 16)
    peak_small, n_small = _growth(bomb, 4 * 2**20)
    peak_big, n_big = _growth(bomb, 12 * 2**20)
    per_reading = (peak_big - peak_small) / (n_big - n_small)
    assert per_reading < 100, f"{per_reading:.0f} bytes a reading (typed arrays: ~45; Python objects: ~330)"


def test_the_log_keeps_typed_arrays_and_makes_labels_on_demand() -> None:
    node = FIXTURE / "power_ac" / "node_0.txt"
    log = read_power_log(node, RunBuilder(format="mlperf"))
    assert isinstance(log.records.t, array) and (log.records.t.typecode, log.records.k.typecode,
                                                 log.records.v.typecode) == ("d", "b", "d")
    assert not isinstance(log.where, list) and len(log.where) == log.t_ns.size
    lineno = int(log.where[0].rsplit(":", 1)[1])
    assert log.where[0] == f"{node}:{lineno}" and log.where[:2] == [log.where[0], log.where[1]]
    assert '"power_reading"' in node.read_text().splitlines()[lineno - 1]
    records = list(log.records)
    kinds = {k for _, k, _ in records}
    assert {"power_reading", "power_measurement_start"} <= kinds
    assert all((v is None) == k.startswith("power_measurement_") for _, k, v in records)
    assert list(log.records.in_time_order()) == sorted(records, key=lambda r: r[0])  # stable, as before
    mean, why = mlcommons_node_power_w(log)
    assert why is None and mean is not None and 0 < mean < 20_000
