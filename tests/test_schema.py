import pyarrow as pa

from powertrain.schema import (
    COUNTER_FIELDS,
    EVENTS_SCHEMA,
    FLAG_FIELDS,
    POWER_SAMPLES_SCHEMA,
    TELEMETRY_FIELDS,
    TELEMETRY_SCHEMA,
    Throttle,
)


def test_every_measured_field_carries_a_unit_or_is_a_bitset():
    units = ("_w", "_j", "_c", "_mhz", "_pct", "_bytes", "_s", "_1m")
    for name in TELEMETRY_FIELDS:
        assert name == "throttle" or name in FLAG_FIELDS or name.endswith(units), name


def test_flags_are_booleans_about_a_reading():
    assert FLAG_FIELDS == ("power_repeat",)
    assert all(pa.types.is_boolean(TELEMETRY_FIELDS[f]) for f in FLAG_FIELDS)
    assert set(FLAG_FIELDS).isdisjoint(COUNTER_FIELDS)


def test_power_samples_schema():
    assert POWER_SAMPLES_SCHEMA.names == ["t_ns", "host", "device", "power_w"]
    assert not POWER_SAMPLES_SCHEMA.field("t_ns").nullable and POWER_SAMPLES_SCHEMA.field("power_w").nullable


def test_counters_are_telemetry_fields():
    assert set(COUNTER_FIELDS) <= set(TELEMETRY_FIELDS)


def test_key_columns_are_not_nullable_and_measurements_are():
    assert not TELEMETRY_SCHEMA.field("t_ns").nullable
    assert all(TELEMETRY_SCHEMA.field(f).nullable for f in TELEMETRY_FIELDS)
    assert not EVENTS_SCHEMA.field("t_start_ns").nullable


def test_throttle_names():
    assert Throttle.names_of(Throttle.POWER_CAP | Throttle.THERMAL_HW) == ["power_cap", "thermal_hw"]
    assert Throttle.names_of(0) == []
    assert Throttle.names_of(None) == []


def test_telemetry_written_before_power_repeat_reads_as_unknown(tmp_path):
    """A run written before the flag existed: its files lack the column; readers and compaction fill null."""
    import pyarrow.parquet as pq

    from powertrain.schema import empty_telemetry_row
    from powertrain.store import read_telemetry
    from powertrain.store.tables import finalize

    old = TELEMETRY_SCHEMA.remove(TELEMETRY_SCHEMA.get_field_index("power_repeat"))
    row = {k: v for k, v in empty_telemetry_row(1, "h", "gpu0").items() if k != "power_repeat"}
    tel = tmp_path / "run" / "telemetry"
    (tel / "h.parts").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([dict(row, power_w=100.0)], schema=old), tel / "h.parquet")
    pq.write_table(pa.Table.from_pylist([dict(row, t_ns=2, power_w=101.0)], schema=old), tel / "h.parts/seg-000000.parquet")
    t = read_telemetry(tmp_path / "run")
    assert t.column("power_w").to_pylist() == [100.0, 101.0] and t.column("power_repeat").to_pylist() == [None, None]
    finalize(tel / "h", TELEMETRY_SCHEMA)
    assert pq.read_schema(tel / "h.parquet").field("power_repeat").type == pa.bool_()
    assert read_telemetry(tmp_path / "run").num_rows == 2
