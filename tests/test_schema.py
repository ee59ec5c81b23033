from powertrain.schema import COUNTER_FIELDS, EVENTS_SCHEMA, TELEMETRY_FIELDS, TELEMETRY_SCHEMA, Throttle


def test_every_measured_field_carries_a_unit_or_is_a_bitset():
    units = ("_w", "_j", "_c", "_mhz", "_pct", "_bytes", "_s", "_1m")
    for name in TELEMETRY_FIELDS:
        assert name == "throttle" or name.endswith(units), name


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
