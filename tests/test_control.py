"""Device controls (power limit, SM/memory clock locks) against the NVIDIA and AMD stand-ins.

The stand-ins (tests/standins) are injected at the one boundary the controls offer
(``NvidiaControls(nvml=…)``, ``AmdControls(amdsmi=…)``, ``binding=`` further up); the ledger lives in
a per-test file (``$POWERTRAIN_CONTROL_LEDGER``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from powertrain.control.amd import AmdControls
from powertrain.control.apply import apply_controls, restore_stale
from powertrain.control.interface import ControlRefused
from powertrain.control.ledger import LEDGER_ENV, Ledger, this_owner
from powertrain.control.nvidia import NvidiaControls
from powertrain.launch.controls import (
    check_node_device,
    node_controls,
    restore_left_over,
    visible_devices_env,
)
from powertrain.spec.run import RunConfig
from standins import fake_nvml
from standins.fake_amdsmi import FakeAmdGpu, FakeAmdSmi
from standins.fake_nvml import FakeGpu, FakeNvml
from standins.nvml_state import PersistentNvml, read_state, write_state

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def ledger(tmp_path, monkeypatch) -> Ledger:
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "ledger.json"))
    return Ledger()


def _gpus(n: int = 2) -> list[FakeGpu]:
    return [FakeGpu(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", bus_id=f"00000000:{0x18 + i:02x}:00.0")
            for i in range(n)]


def _cfg(**knobs) -> RunConfig:
    return RunConfig.model_validate({"model": "gpt3-tiny", "knobs": knobs,
                                     "hardware": {"devices_per_node": 2, "device": "h100-sxm", "stand_in": True}})


def test_apply_records_requested_and_in_effect_then_restores(ledger):
    nvml = FakeNvml(_gpus())
    ctl = NvidiaControls(nvml)
    req = {"power_limit_w": 500.0, "sm_clock_mhz": [1200, 2500], "mem_clock_mhz": 2619}
    applied = apply_controls(req, ctl, ledger, [0, 1], this_owner("run-a"))
    assert [g.power_limit_mw for g in nvml.gpus] == [500_000, 500_000]
    assert nvml.gpus[1].sm_lock == (1200, 2500) and nvml.gpus[1].mem_lock == (2619, 2619)
    dev = applied.record["devices"][0]
    assert dev["found"]["power_limit_w"] == 700.0  # what the device had, written before any change
    s = dev["settings"]
    assert s["power_limit_w"]["requested"] == 500.0 and s["power_limit_w"]["in_effect"] == 500.0
    assert s["sm_clock_mhz"]["in_effect"] == [1200, 1980]  # clamped to the device's highest SM clock
    assert s["mem_clock_mhz"]["in_effect"] == 2619
    assert [e["device"] for e in ledger.entries()] == ["gpu0", "gpu1"]  # held while the run runs
    applied.restore()
    assert [g.power_limit_mw for g in nvml.gpus] == [700_000, 700_000]
    assert all(g.sm_lock is None and g.mem_lock is None for g in nvml.gpus)
    assert ledger.entries() == [] and applied.record["restored"]["ok"] is True
    assert nvml.gpus[0].history == ["power 500000", "sm 1200-2500", "mem 2619-2619", "power 700000", "sm reset",
                                    "mem reset"]


def test_the_ledger_is_written_before_the_first_change(ledger):
    nvml = FakeNvml(_gpus(1))
    seen = []
    real = nvml.nvmlDeviceSetPowerManagementLimit

    def spy(h, limit):
        seen.append(ledger.entries())
        return real(h, limit)

    nvml.nvmlDeviceSetPowerManagementLimit = spy
    apply_controls({"power_limit_w": 400.0}, NvidiaControls(nvml), ledger, [0], this_owner("r")).restore()
    assert seen[0][0]["found"]["power_limit_w"] == 700.0 and seen[0][0]["changed"] == ["power_limit_w"]


def test_no_permission_is_one_line_and_changes_nothing(ledger):
    gpus = _gpus()
    gpus[1].can_set = False  # e.g. not root
    nvml = FakeNvml(gpus)
    with pytest.raises(ControlRefused) as exc:
        apply_controls({"power_limit_w": 500.0}, NvidiaControls(nvml), ledger, [0, 1], this_owner("r"))
    line = str(exc.value)
    assert line.startswith("gpu1: cannot set the power limit") and "root" in line and "\n" not in line
    assert [g.power_limit_mw for g in nvml.gpus] == [700_000, 700_000]  # gpu0's change was undone
    assert ledger.entries() == []


def test_allow_unapplied_records_the_setting_as_not_applied(ledger):
    gpus = _gpus(1)
    gpus[0].unsupported = {"nvmlDeviceSetMemoryLockedClocks"}  # e.g. a pre-Ampere GPU
    nvml = FakeNvml(gpus)
    applied = apply_controls({"power_limit_w": 600.0, "mem_clock_mhz": 1600}, NvidiaControls(nvml), ledger, [0],
                             this_owner("r"), allow_unapplied=True)
    s = applied.record["devices"][0]["settings"]
    assert s["power_limit_w"]["applied"] is True and s["power_limit_w"]["in_effect"] == 600.0
    assert s["mem_clock_mhz"]["applied"] is False and s["mem_clock_mhz"]["in_effect"] is None
    assert "Not Supported" in s["mem_clock_mhz"]["not_applied"]
    applied.restore()
    assert nvml.gpus[0].power_limit_mw == 700_000 and ledger.entries() == []


def test_a_limit_outside_the_device_range_names_the_range(ledger):
    with pytest.raises(ControlRefused, match=r"150 W is outside the device's range 200–700 W"):
        apply_controls({"power_limit_w": 150.0}, NvidiaControls(FakeNvml(_gpus(1))), ledger, [0], this_owner("r"))


def test_a_device_held_by_a_live_run_is_refused(ledger):
    nvml = FakeNvml(_gpus(1))
    first = apply_controls({"power_limit_w": 500.0}, NvidiaControls(nvml), ledger, [0], this_owner("one"))
    with pytest.raises(ControlRefused, match="held by powertrain pid"):
        apply_controls({"power_limit_w": 400.0}, NvidiaControls(nvml), ledger, [0], this_owner("two"))
    assert nvml.gpus[0].power_limit_mw == 500_000  # the second run changed nothing
    assert restore_stale(NvidiaControls(nvml), ledger) == []  # a live owner's entry is left alone
    first.restore()
    assert nvml.gpus[0].power_limit_mw == 700_000


def test_amd_controls_apply_and_restore(ledger):
    smi = FakeAmdSmi([FakeAmdGpu(), FakeAmdGpu(uuid="other", bdf="0000:0d:00.0")])
    applied = apply_controls({"power_limit_w": 500.0, "sm_clock_mhz": [1500, 1500], "mem_clock_mhz": 900},
                             AmdControls(smi), ledger, [0, 1], this_owner("r"))
    assert smi.gpus[1].power_cap_uw == 500_000_000 and smi.gpus[1].gfx_range == (1500, 1500)
    assert smi.gpus[0].mem_range == (900, 900) and smi.gpus[0].perf_level == "MANUAL"
    s = applied.record["devices"][1]["settings"]
    assert s["power_limit_w"]["in_effect"] == 500.0 and applied.record["devices"][1]["found"]["power_limit_w"] == 750.0
    applied.restore()
    assert [g.power_cap_uw for g in smi.gpus] == [750_000_000] * 2
    assert all(g.perf_level == "AUTO" and g.gfx_range is None for g in smi.gpus)
    smi.gpus[0].can_set = False
    with pytest.raises(ControlRefused, match=r"gpu0: cannot set the power cap: amdsmi: .*Permission.*needs root"):
        apply_controls({"power_limit_w": 500.0}, AmdControls(smi), ledger, [0], this_owner("r"))


def test_sigterm_inside_the_run_still_restores(ledger):
    nvml = FakeNvml(_gpus())
    with pytest.raises(SystemExit), node_controls(_cfg(power_limit_w=450), "r", binding=nvml) as rec:
        assert rec["devices"][0]["settings"]["power_limit_w"]["in_effect"] == 450.0
        os.kill(os.getpid(), signal.SIGTERM)  # the handler raises SystemExit at the next bytecode
        for _ in range(10_000_000):
            pass
    assert [g.power_limit_mw for g in nvml.gpus] == [700_000, 700_000] and ledger.entries() == []
    assert rec["restored"]["ok"] is True


def test_node_controls_refusal_points_at_allow_unapplied(ledger):
    gpus = _gpus()
    for g in gpus:
        g.can_set = False
    with pytest.raises(ValueError, match=r"gpu0: cannot set the power limit.*root.*--allow-unapplied"), \
            node_controls(_cfg(power_limit_w=450), "r", binding=FakeNvml(gpus)):
        pass
    with node_controls(_cfg(power_limit_w=450), "r", binding=FakeNvml(gpus), allow_unapplied=True) as rec:
        assert rec["devices"][0]["settings"]["power_limit_w"]["applied"] is False
    broken = FakeNvml(init_error=fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with node_controls(_cfg(power_limit_w=450), "r", binding=broken, allow_unapplied=True) as rec:
        assert "Driver Not Loaded" in rec["not_applied"] and rec["devices"] == []


def test_a_gpu_spec_on_a_cpu_node_needs_stand_in():
    cfg = RunConfig.model_validate({"model": "gpt3-tiny", "hardware": {"device": "h200"}})
    with pytest.raises(ValueError, match=r"hardware.device is h200 but this node has no GPU.*stand_in: true"):
        check_node_device(cfg, "cpu")
    assert check_node_device(cfg.model_copy(update={"hardware": cfg.hardware.model_copy(
        update={"stand_in": True})}), "cpu") == {"device": "h200", "ran_on": "cpu"}
    assert check_node_device(cfg, "cuda") is None  # a GPU whose name is not known: nothing to compare
    assert check_node_device(cfg, "cuda", "NVIDIA H200") is None
    with pytest.raises(ValueError, match=r"this node's GPUs are NVIDIA H100 80GB HBM3 \(h100-sxm\); set "
                                         r"hardware.device: h100-sxm, or hardware.stand_in: true"):
        check_node_device(cfg, "cuda", "NVIDIA H100 80GB HBM3")
    rehearsal = cfg.model_copy(update={"hardware": cfg.hardware.model_copy(update={"stand_in": True})})
    assert check_node_device(rehearsal, "cuda", "NVIDIA H100 80GB HBM3") == {"device": "h200", "ran_on": "h100-sxm"}
    cpu = RunConfig.model_validate({"model": "gpt3-tiny"})
    assert check_node_device(cpu, "cuda", "NVIDIA H200") is None
    assert visible_devices_env(cpu, "cuda") == {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}  # trains on the CPU


_HOLD = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from standins.nvml_state import PersistentNvml
from powertrain.control.apply import apply_controls
from powertrain.control.ledger import Ledger, this_owner
from powertrain.control.nvidia import NvidiaControls
nvml = PersistentNvml(Path({state!r}))
apply_controls({{"power_limit_w": 450.0, "sm_clock_mhz": [1400, 1400]}}, NvidiaControls(nvml), Ledger(),
               list(range(len(nvml.gpus))), this_owner("killed-run"))
print("applied", flush=True)
time.sleep(600)
"""


def hold_and_kill(state: Path) -> None:
    """A process that set limits on the stand-in node and was killed with -9 (no chance to restore)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD.format(tests=str(TESTS), state=str(state))],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "applied"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_kill_9_is_restored_by_the_next_start(tmp_path, ledger):
    state = tmp_path / "gpus.json"
    write_state(state, _gpus())
    hold_and_kill(state)
    assert [g.power_limit_mw for g in read_state(state)] == [450_000, 450_000]  # left capped
    assert len(ledger.entries()) == 2
    reports = restore_left_over(PersistentNvml(state))  # what launch_local does first
    assert [r["problems"] for r in reports] == [[], []] and reports[0]["run"] == "killed-run"
    after = read_state(state)
    assert [g.power_limit_mw for g in after] == [700_000, 700_000] and all(g.sm_lock is None for g in after)
    assert ledger.entries() == []


def test_kill_9_is_restored_by_powertrain_restore(tmp_path, ledger):
    state = tmp_path / "gpus.json"
    write_state(state, _gpus())
    hold_and_kill(state)
    env = {**os.environ, "PYTHONPATH": f"{TESTS / 'standins' / 'nvml_shim'}:{TESTS}", "FAKE_NVML_STATE": str(state)}
    listed = subprocess.run([sys.executable, "-m", "powertrain.cli", "restore", "--list"], env=env,
                            capture_output=True, text=True)
    assert listed.returncode == 0 and "run gone: restore it" in listed.stdout and "killed-run" in listed.stdout
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", "restore"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "2 restored, 0 not restored" in res.stdout
    assert [g.power_limit_mw for g in read_state(state)] == [700_000, 700_000]
    assert json.loads(Path(os.environ[LEDGER_ENV]).read_text())["entries"] == []


def test_plan_lists_every_powercap_run_with_its_controls():
    from rich.console import Console

    from powertrain.cli.plan import print_plan
    from powertrain.plan.planner import plan
    from powertrain.plan.sweep_spec import load_sweep_spec

    p = plan(load_sweep_spec(TESTS.parent / "examples" / "study-h200-powercap.yaml"))
    assert p.counts()["planned"] == len(p.runs) == 15 * 7
    controls = sorted({json.dumps(r.config.knobs.controls()) for r in p.runs})
    assert len(controls) == 7 and all(r.config.knobs.recompute == "full" for r in p.runs)
    con = Console(record=True, width=400)
    print_plan(p, console=con)
    text = con.export_text()
    assert "controls" in text and "400 W" in text and "SM 1200" in text
    assert text.count("planned") == 105


def test_a_control_knob_sweep_on_the_cpu_backend_is_refused_before_anything_launches(tmp_path):
    spec = tmp_path / "cap.yaml"
    spec.write_text("name: cap\nbase: {model: gpt3-tiny, hardware: {device: cpu}}\n"
                    "grid:\n  - knobs.power_limit_w: [300, 200]\n")
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", "sweep", str(spec), "--out", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 1 and "control_needs_gpu" in res.stderr and "nothing to launch" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()


def test_the_report_draws_throughput_and_j_per_token_against_the_limit(tmp_path):
    from powertrain.report.build import Report
    from powertrain.report.powercap import add_powercap_section, series

    def row(limit, tps, jpt, label="DP1·TP2", status="ok", **extra):
        return {"id": f"{label}.pl{limit}", "status": status, "kind": "measured", "model": "llama3-70b",
                "label": label, "variant": None, "power_limit_w": limit, "tokens_per_s": tps, "j_per_token": jpt,
                **extra}

    rows = [row(600, 900.0, 1.1), row(400, 700.0, 0.9), row(500, 820.0, None), row(700, 950.0, 1.3),
            row(400, 500.0, 1.0, label="DP2·PP2"), row(300, None, None, status="failed"),
            row(None, 990.0, 1.4, **{"axis.knobs.sm_clock_mhz": [1200, 1200]})]
    s = series(rows, "power_limit_w")
    assert s["llama3-70b DP1·TP2"] == [(400.0, 700.0, 0.9), (500.0, 820.0, None), (600.0, 900.0, 1.1),
                                       (700.0, 950.0, 1.3)]  # sorted by the limit; a failed run is left out
    assert s["llama3-70b DP2·PP2"] == [(400.0, 500.0, 1.0)]
    assert series(rows, "axis.knobs.sm_clock_mhz") == {"llama3-70b DP1·TP2": [(1200.0, 990.0, 1.4)]}
    rep = Report(tmp_path / "r", "t", ("png",))
    add_powercap_section(rep, rows)
    html = rep.write().read_text()
    assert "Power limit and clock lock" in html and "powercap_power_limit_w" in html and "powercap_sm_clock_mhz" in html
    empty = Report(tmp_path / "e", "t", ("png",))
    add_powercap_section(empty, [row(None, 1.0, 1.0)])  # no control set: no section
    assert "Power limit" not in empty.write().read_text()


def test_a_gpu_without_locked_clocks_gets_its_sm_clock_through_application_clocks(ledger):
    gpus = _gpus(1)
    gpus[0].unsupported = {"nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks"}  # before Volta
    nvml = FakeNvml(gpus)
    applied = apply_controls({"sm_clock_mhz": [1100, 1400]}, NvidiaControls(nvml), ledger, [0], this_owner("r"))
    s = applied.record["devices"][0]["settings"]["sm_clock_mhz"]
    assert nvml.gpus[0].app_clocks == (2619, 1400) and s["applied"] is True
    assert s["how"].startswith("application clocks (SM 1400 MHz, memory 2619 MHz)")
    applied.restore()
    assert nvml.gpus[0].app_clocks is None and nvml.gpus[0].history == ["app 2619/1400", "app reset"]
    gpus[0].unsupported |= {"nvmlDeviceSetMemoryLockedClocks"}
    with pytest.raises(ControlRefused, match="gpu0: cannot set the memory clock lock: NVML: Not Supported"):
        apply_controls({"mem_clock_mhz": 1600}, NvidiaControls(nvml), ledger, [0], this_owner("r"))


def test_a_damaged_ledger_is_reported_never_emptied(ledger):
    ledger.path.write_text("{not json")
    (report,) = restore_left_over(FakeNvml(_gpus(1)))
    assert "cannot be read" in report["problems"][0] and "powertrain restore" in report["problems"][0]
    assert ledger.path.read_text() == "{not json"  # the only record of a change is not thrown away
    with pytest.raises(OSError, match="cannot be read"), ledger.locked():
        pass
