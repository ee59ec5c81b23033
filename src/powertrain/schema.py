"""The data contracts: one definition of every table powertrain writes or reads.

Every producer (sampler backends, importers, the trainer's step markers, predictions) and every
consumer (analysis, reports, traces) imports its columns from here, so a unit or a type is defined
once. Rules that hold for every column:

* units are in the name (``_w``, ``_j``, ``_c``, ``_mhz``, ``_pct``, ``_bytes``, ``_s``, ``_ns``); a flag about
  a reading (:data:`FLAG_FIELDS`, boolean) has no unit, no mean and no peak;
* unknown is null, never 0 or -1;
* a value that is estimated rather than measured carries ``_est`` in its name;
* all timestamps are ``CLOCK_REALTIME`` nanoseconds since the epoch (``t_ns``), stamped by the host.
"""

from __future__ import annotations

import pyarrow as pa

from powertrain.core.throttle import Throttle as Throttle  # re-exported: the throttle column's bit set

SCHEMA_VERSION = 1


# Per-sample measured fields, in schema order. Host and GPU rows share one table; a field a device
# does not have is null on its rows.
TELEMETRY_FIELDS: dict[str, pa.DataType] = {
    "power_w": pa.float64(),  # instantaneous power
    # power_w repeats the driver's last value without the driver having refreshed it (telemetry.nvidia
    # module doc): True; a fresh reading: False; null where unknown (no power_w, an importer, a host row)
    "power_repeat": pa.bool_(),
    "power_avg_w": pa.float64(),  # device-averaged power (e.g. NVML 1 s average)
    "energy_j": pa.float64(),  # hardware energy counter, cumulative since an arbitrary origin
    "energy_dram_j": pa.float64(),  # DRAM energy counter (RAPL dram domain), cumulative
    "temp_c": pa.float64(),  # main die temperature (GPU core / AMD edge / CPU package)
    "temp_hotspot_c": pa.float64(),  # junction / hotspot temperature
    "temp_mem_c": pa.float64(),  # memory (HBM) temperature
    "clock_sm_mhz": pa.float64(),  # SM / GFX clock
    "clock_mem_mhz": pa.float64(),
    "util_pct": pa.float64(),
    "util_mem_pct": pa.float64(),
    "mem_used_bytes": pa.int64(),
    "power_limit_w": pa.float64(),  # enforced power limit at the time of the sample
    "throttle": pa.int64(),  # Throttle bit set
    "pcie_tx_bytes": pa.int64(),  # cumulative, 64-bit, unwrapped
    "pcie_rx_bytes": pa.int64(),
    "link_tx_bytes": pa.int64(),  # NVLink / xGMI over all links, cumulative, 64-bit
    "link_rx_bytes": pa.int64(),
    "fan_pct": pa.float64(),
    # host fields (device "cpu")
    "cpu_util_pct": pa.float64(),  # whole host, all cores, 0..100
    "cgroup_cpu_s": pa.float64(),  # CPU time used by this cgroup, cumulative
    "cgroup_mem_bytes": pa.int64(),
    "load_1m": pa.float64(),
}

TELEMETRY_SCHEMA = pa.schema(
    [
        pa.field("t_ns", pa.int64(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("device", pa.string(), nullable=False),
        *[pa.field(name, typ) for name, typ in TELEMETRY_FIELDS.items()],
    ],
    metadata={"powertrain.schema": f"telemetry/{SCHEMA_VERSION}"},
)

# Flags about another column's reading, not readings: boolean, never averaged, summed into a rate or
# plotted as a level.
FLAG_FIELDS = tuple(name for name, typ in TELEMETRY_FIELDS.items() if pa.types.is_boolean(typ))

# Columns added to a table after files of its schema version were written: a file without them is not
# damaged, and reads them as null (unknown). Any other missing column is damage.
ADDED_LATER = frozenset({"power_repeat"})

# Cumulative counters: analysis differentiates them; importers un-wrap them before writing.
COUNTER_FIELDS = (
    "energy_j",
    "energy_dram_j",
    "pcie_tx_bytes",
    "pcie_rx_bytes",
    "link_tx_bytes",
    "link_rx_bytes",
    "cgroup_cpu_s",
)


# One row per interval a rank spent in something: a whole step, a phase of it, a communication.
EVENT_KINDS = ("step", "forward", "backward", "optimizer", "comm", "data", "checkpoint", "eval", "phase")

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # one of EVENT_KINDS
        pa.field("name", pa.string()),  # free label, e.g. "allreduce", "stage1.mb3"
        pa.field("step", pa.int64()),
        pa.field("t_start_ns", pa.int64(), nullable=False),
        pa.field("t_end_ns", pa.int64(), nullable=False),
        pa.field("window", pa.string()),  # "warmup" | "measured" | null (outside the protocol)
        pa.field("microbatch", pa.int32()),
        pa.field("tokens", pa.int64()),  # tokens processed by this rank in this interval
        pa.field("samples", pa.int64()),
        pa.field("loss", pa.float64()),
        pa.field("mem_peak_bytes", pa.int64()),
        pa.field("attrs", pa.string()),  # JSON object with anything else
    ],
    metadata={"powertrain.schema": f"events/{SCHEMA_VERSION}"},
)


# The driver's own buffered power samples (NVML ``nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)``), read
# between polls: one row per driver sample, in ``telemetry/power-samples/<host>.parquet``. ``t_ns`` is the
# driver's timestamp put on the telemetry rows' clock (telemetry.nvidia module doc: "The driver's buffer").
POWER_SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("t_ns", pa.int64(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("device", pa.string(), nullable=False),
        pa.field("power_w", pa.float64()),
    ],
    metadata={"powertrain.schema": f"power-samples/{SCHEMA_VERSION}"},
)


def empty_telemetry_row(t_ns: int, host: str, device: str) -> dict[str, object]:
    """A telemetry row with every measured field unknown (null)."""
    row: dict[str, object] = {"t_ns": t_ns, "host": host, "device": device}
    row.update(dict.fromkeys(TELEMETRY_FIELDS))
    return row
