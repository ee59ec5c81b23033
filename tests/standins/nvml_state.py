"""STAND-IN state that outlives a process: the NVIDIA stand-in's GPUs kept in a JSON file.

Device settings live in the driver, not in the process that set them, so a test of "restored after
``kill -9``" needs a stand-in whose settings survive the process: :class:`PersistentNvml` is
:class:`FakeNvml` reading its GPUs from ``state`` before every call and writing them back after
every set/reset call (atomically). ``nvml_shim/pynvml.py`` makes it *the* ``pynvml`` of a
subprocess (``PYTHONPATH=tests/standins/nvml_shim:tests``, ``FAKE_NVML_STATE=<file>``), so a whole
``powertrain sweep`` — launcher, sampler, restore — sees one stand-in node.

A GPU's known-truth power sensor is kept as its JSON ``sensor_spec`` (a :class:`PowerSensor` object,
with its callables, cannot be written): each process builds its own sensor from it on the real clock,
once, and keeps it while the state is re-read (:meth:`FakeNvml._sensor`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from standins.fake_nvml import FakeGpu, FakeNvml

_TUPLES = ("sm_lock", "mem_lock", "app_clocks")


def write_state(path: Path, gpus: list[FakeGpu]) -> None:
    data = []
    for g in gpus:
        if g.sensor is not None:
            raise ValueError("a PowerSensor object cannot be kept in the shared state: give the GPU a sensor_spec")
        d = dataclasses.asdict(g)
        del d["sensor"]
        d["unsupported"] = sorted(g.unsupported)
        data.append(d)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_state(path: Path) -> list[FakeGpu]:
    gpus = []
    for d in json.loads(path.read_text()):
        d["unsupported"] = set(d["unsupported"])
        for k in _TUPLES:
            d[k] = tuple(d[k]) if d[k] is not None else None
        gpus.append(FakeGpu(**d))
    return gpus


class PersistentNvml(FakeNvml):
    """:class:`FakeNvml` whose GPUs live in the JSON file ``state`` (shared by every process)."""

    def __init__(self, state: Path, **kw: Any) -> None:
        self.state = Path(state)
        super().__init__(read_state(self.state), **kw)

    def _gpu(self, fn: str, handle: Any) -> FakeGpu:
        self.gpus = read_state(self.state)
        return super()._gpu(fn, handle)

    def nvmlDeviceGetCount(self) -> int:
        self.gpus = read_state(self.state)
        return super().nvmlDeviceGetCount()


def _saving(name: str) -> Any:
    def call(self: PersistentNvml, *args: Any) -> Any:
        out = getattr(FakeNvml, name)(self, *args)
        write_state(self.state, self.gpus)
        return out

    call.__name__ = name
    return call


for _name in ("nvmlDeviceSetPowerManagementLimit", "nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks",
              "nvmlDeviceSetMemoryLockedClocks", "nvmlDeviceResetMemoryLockedClocks"):
    setattr(PersistentNvml, _name, _saving(_name))
