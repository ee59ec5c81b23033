"""A power-cap sweep end to end on a stand-in NVIDIA node: ``powertrain sweep`` over three power limits.

The stand-in ``pynvml`` (tests/standins/nvml_shim, state in a JSON file) is what every process of
the sweep imports — the launcher that sets the limits, the sampler that records them in telemetry —
so the test sees what a GPU node would: each limit set before warm-up, read back, visible in
telemetry during the steps, and the original limit back after each run; and a run killed with -9
before the sweep restored by the sweep's first start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from powertrain.control.ledger import LEDGER_ENV
from powertrain.store.tables import read_events, read_telemetry
from standins.fake_nvml import FakeGpu
from standins.nvml_state import read_state, write_state
from test_control import hold_and_kill

TESTS = Path(__file__).resolve().parent

SPEC = """
name: powercap-standin
base:
  model: gpt3-tiny
  hardware: {devices_per_node: 1, device: h100-sxm, stand_in: true}
  knobs: {global_batch: 1, micro_batch: 1}
  protocol: {warmup_steps: 1, measured_steps: 1}
grid:
  - knobs.power_limit_w: [600, 500, 400]
launch: {backend: local, time_limit_min: 5, sampler_rate_hz: 10}
"""


@pytest.mark.slow
def test_power_cap_sweep_applies_records_and_restores(tmp_path, monkeypatch):
    state, ledger = tmp_path / "gpus.json", tmp_path / "ledger.json"
    write_state(state, [FakeGpu()])
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    env = {**os.environ, "PYTHONPATH": f"{TESTS / 'standins' / 'nvml_shim'}:{TESTS}", "FAKE_NVML_STATE": str(state)}
    hold_and_kill(state)  # a run killed with -9 left the GPU at 450 W with its SM clock locked
    (tmp_path / "spec.yaml").write_text(SPEC)
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", "sweep", str(tmp_path / "spec.yaml"), "--out",
                          str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]

    gpu = read_state(state)[0]
    assert gpu.power_limit_mw == 700_000 and gpu.sm_lock is None  # the original limit, after every run
    assert gpu.history == ["power 450000", "sm 1400-1400",  # the killed run
                           "power 700000", "sm reset",  # restored by the sweep's first start
                           "power 600000", "power 700000", "power 500000", "power 700000", "power 400000",
                           "power 700000"]
    assert json.loads(ledger.read_text())["entries"] == []
    for rid, watts in (("pl600", 600.0), ("pl500", 500.0), ("pl400", 400.0)):
        run = tmp_path / "out" / rid
        info = json.loads((run / "run.json").read_text())
        assert info["name"] == rid and info["stand_in"] == {"device": "h100-sxm", "ran_on": "cpu"}
        c = info["controls"]
        (dev,) = c["devices"]
        assert dev["found"]["power_limit_w"] == 700.0
        assert dev["settings"]["power_limit_w"] == {"requested": watts, "in_effect": watts, "applied": True,
                                                    "how": "read back from the device"}
        assert c["restored"]["ok"] is True
        steps = [e for e in read_events(run).to_pylist() if e["kind"] == "step"]
        first = min(e["t_start_ns"] for e in steps)
        last = max(e["t_end_ns"] for e in steps)
        assert c["t_applied_ns"] < first  # set before the first warm-up step
        during = [r["power_limit_w"] for r in read_telemetry(run).select(["t_ns", "device", "power_limit_w"])
                  .to_pylist() if r["device"] == "gpu0" and first <= r["t_ns"] <= last]
        assert during and set(during) == {watts}  # and in effect in telemetry while the steps ran
    first_run = json.loads((tmp_path / "out" / "pl600" / "run.json").read_text())
    assert [r["run"] for r in first_run["restored_at_start"]] == ["killed-run"]
