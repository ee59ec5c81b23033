"""`powertrain monitor`'s end-of-run table: one aggregate over the files, never the whole table in memory."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from powertrain.schema import TELEMETRY_SCHEMA
from powertrain.telemetry.quicklook import per_device

S = 1_000_000_000


def _rows(device: str, t0: int, n: int, power: float, energy0: float, throttle: int) -> list[dict]:
    return [{"t_ns": t0 + i * S, "host": "h", "device": device, "power_w": power + i,
             "energy_j": energy0 + 100.0 * i, "throttle": throttle if i % 2 else 0} for i in range(n)]


def test_per_device_levels_counter_totals_and_throttle_share_across_files(tmp_path) -> None:
    def write(name: str, rows: list[dict]) -> None:
        pq.write_table(pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA), tmp_path / name)

    # gpu0 spread over a compacted file and a later segment, written out of time order
    write("b.parquet", _rows("gpu0", 5 * S, 5, 105.0, 1500.0, 4) + _rows("gpu1", 0, 3, 50.0, 0.0, 0))
    write("a.parquet", _rows("gpu0", 0, 5, 100.0, 1000.0, 4))
    got = per_device([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    assert [(d["host"], d["device"], d["rows"]) for d in got] == [("h", "gpu0", 10), ("h", "gpu1", 3)]
    g0, g1 = got
    assert g0["levels"]["power_w"] == (pytest.approx(104.5), 109.0)  # 100,101,…,104 then 105,…,109
    assert g0["totals"]["energy_j"] == pytest.approx(900.0)  # last (1900) minus first (1000), in time order
    assert g0["duration_s"] == 9.0 and g0["rate_hz"] == pytest.approx(1.0)
    assert g0["throttled_share"] == pytest.approx(0.4)
    assert g1["throttled_share"] == 0.0 and "temp_c" not in g1["levels"]
    assert per_device([]) == []
