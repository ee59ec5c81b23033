"""hardware: what a device and its node can do, and how fast this host's CPU is.

* :mod:`powertrain.hardware.catalog` — :class:`DeviceSpec` / :class:`NodeSpec` (with its :class:`HostSpec` and
  :class:`PsuSpec`) / :class:`ThermalSpec` from data sheets (``catalog.yaml``, user YAML via ``--hardware`` / ``$POWERTRAIN_HARDWARE``),
  :func:`get_device`, and the host CPU as a device (:func:`cpu_device`, :func:`measure_cpu`);
* :mod:`powertrain.hardware.host_probe` — :class:`HostProbe`: fp32 matmul and copy rates measured
  with the threads a training rank uses (:func:`rank_threads`), kept on disk by :func:`probe_host`.
"""

from powertrain.hardware.catalog import (
    CATALOG_FILE,
    PRECISIONS,
    TRANSPORTS,
    DeviceSpec,
    HostSpec,
    NodeSpec,
    PsuSpec,
    ThermalSpec,
    cooling_thermal,
    cpu_device,
    describe_hardware,
    device_by_name,
    get_device,
    hardware_from_option,
    is_cpu_name,
    load_catalog,
    looks_like_path,
    measure_cpu,
)
from powertrain.hardware.host_probe import (
    PROBE_COPY_ELEMS,
    PROBE_MATMUL_N,
    PROBE_REPEATS,
    HostProbe,
    host_cores,
    measure_host_probe,
    probe_cache_dir,
    probe_host,
    rank_threads,
    record_host_probe,
)

__all__ = [
    "CATALOG_FILE",
    "PRECISIONS",
    "PROBE_COPY_ELEMS",
    "PROBE_MATMUL_N",
    "PROBE_REPEATS",
    "TRANSPORTS",
    "DeviceSpec",
    "HostProbe",
    "HostSpec",
    "NodeSpec",
    "PsuSpec",
    "ThermalSpec",
    "cooling_thermal",
    "cpu_device",
    "describe_hardware",
    "device_by_name",
    "get_device",
    "hardware_from_option",
    "host_cores",
    "is_cpu_name",
    "load_catalog",
    "looks_like_path",
    "measure_cpu",
    "measure_host_probe",
    "probe_cache_dir",
    "probe_host",
    "rank_threads",
    "record_host_probe",
]
