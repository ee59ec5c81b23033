"""Audit 2, H2 and H4: step numbers a rank reuses (epoch loops) and the devices a run's energy counts.

H2: a reused step number was overwritten by its last event while the window still covered every
event, so J/token doubled. Each event now stays a step of its own, and the summary says so.
H4: every sampled accelerator was counted, idle GPUs and the GPUs a CPU-spec run hides included. The
run's rank map now chooses the devices; device controls follow the inherited visible-devices list.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from powertrain.analyze import summarize_run, synthetic
from powertrain.analyze.steps import measured_steps
from powertrain.control.ledger import LEDGER_ENV
from powertrain.launch.controls import device_indices, node_controls
from powertrain.schema import EVENTS_SCHEMA
from powertrain.spec.run import RunConfig
from standins.fake_nvml import FakeGpu, FakeNvml

# ---------------------------------------------------------------------------------------------- H2


def _renumber(run: Path, first: int, by: int) -> None:
    """Every rank's step numbers ≥ ``first`` lowered by ``by`` (an index that restarts)."""
    for f in sorted((run / "events").glob("rank-*.parquet")):
        t = pq.read_table(f)
        step = pc.if_else(pc.greater_equal(t["step"], first), pc.subtract(t["step"], by), t["step"])
        pq.write_table(t.set_column(t.schema.get_field_index("step"), "step", step), f)


@pytest.fixture(scope="module")
def unique_and_restarting(tmp_path_factory):
    base = tmp_path_factory.mktemp("h2")
    a = synthetic.write_run(base / "unique", devices_per_host=2, warmup=1, steps=10, step_s=1.0, tokens_per_rank=1000)
    b = base / "restarting"
    shutil.copytree(a, b)
    _renumber(b, 6, 5)  # steps 6..10 become 1..5: a second epoch
    return summarize_run(a), summarize_run(b)


def test_reused_step_numbers_keep_every_step(unique_and_restarting):
    u, r = unique_and_restarting
    for key in ("energy_j", "tokens_per_s", "j_per_token", "step_time_mean_s"):
        assert r["metrics"][key] == pytest.approx(u["metrics"][key]), key
    assert r["window"]["measured_steps"] == u["window"]["measured_steps"] == 10
    assert [p["step"] for p in r["per_step"]] == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    starts = [p["t_start_ns"] for p in r["per_step"]]
    assert starts == sorted(starts)  # in time, the repeats after the first epoch
    assert sum(p["energy_j"] for p in r["per_step"]) == pytest.approx(r["metrics"]["energy_j"])
    assert [p["steps"] for p in r["per_rank"]] == [10, 10]


def test_reused_step_numbers_are_said(unique_and_restarting):
    u, r = unique_and_restarting
    assert u["data_quality"]["repeated_steps"] == {"count": 0, "ranks": [], "first": None}
    rep = r["data_quality"]["repeated_steps"]
    assert rep["count"] == 10 and rep["ranks"] == [0, 1] and rep["first"].startswith("rank 0 step 1")
    assert any("reuse a step number" in n and "keeps increasing" in n for n in r["notes"])


def _step(rank: int, step: int, t0_s: float, dur_s: float, *, kind: str = "step", tokens: int | None = 100,
          window: str | None = None) -> dict:
    a = int(t0_s * 1e9)
    return {"rank": rank, "kind": kind, "name": None, "step": step, "t_start_ns": a, "t_end_ns": a + int(dur_s * 1e9),
            "window": window, "tokens": tokens if kind == "step" else None, "samples": None, "loss": None,
            "mem_peak_bytes": None, "microbatch": None, "attrs": None}


def test_repeats_line_up_across_ranks_and_warmup_phases_stay_out():
    rows = []
    for rank in (0, 1):
        t = 0.0
        for epoch in range(2):
            for i in range(3):
                dur = 1.0 + epoch + 0.5 * rank  # epoch 2 slower; rank 1 slower
                rows.append(_step(rank, i, t, dur))
                rows.append(_step(rank, i, t, dur / 2, kind="forward"))
                t += 3.0
    ev = pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA)
    sd = measured_steps(ev, warmup_steps=1)  # unmarked: each rank's first event is warm-up
    assert sd is not None
    assert sd.steps.tolist() == [1, 2, 0, 1, 2]  # epoch 1's step 0 is the warm-up one
    assert sd.step_time_s.tolist() == pytest.approx([1.5, 1.5, 2.5, 2.5, 2.5])  # the slower rank's
    assert sd.rank_step_s.shape == (2, 5)
    assert sd.tokens.tolist() == [200.0] * 5  # no coordinates: every rank counts
    assert sd.repeated["count"] == 6
    fwd = {p["rank"]: p["seconds"] for p in sd.phases if p["kind"] == "forward"}
    # the warm-up step 0's forward (same number as a measured step) is not counted
    assert fwd == pytest.approx({0: 0.5 * 2 + 1.0 * 3, 1: 0.75 * 2 + 1.25 * 3})


def test_unique_numbers_are_unchanged():
    ev = pa.Table.from_pylist([_step(0, i, 2.0 * i, 1.0) for i in range(4)], schema=EVENTS_SCHEMA)
    sd = measured_steps(ev)
    assert sd is not None and sd.steps.tolist() == [0, 1, 2, 3] and sd.repeated["count"] == 0


# ---------------------------------------------------------------------------------------------- H4


def _edit_info(run: Path, edit) -> None:
    info = json.loads((run / "run.json").read_text())
    edit(info)
    (run / "run.json").write_text(json.dumps(info))


def _cpu_run_on_gpu_node(path: Path) -> Path:
    run = synthetic.write_run(path, kind="cpu", devices_per_host=1, steps=5, tokens_per_rank=1000, base_w=200, amp_w=0)
    tel = run / "telemetry" / "node0.parquet"
    cpu = pq.read_table(tel)
    gpu = synthetic.telemetry_table("node0", ["gpu0"], duration_s=7.5, base_w=75, amp_w=0)  # the idle GPU
    pq.write_table(pa.concat_tables([cpu, gpu.cast(cpu.schema)]), tel)

    def edit(info):
        info["devices"].append({**info["devices"][0], "device": "gpu0", "kind": "gpu", "uuid": "synthetic-gpu"})
        info["config"]["hardware"]["device"] = "cpu"
    _edit_info(run, edit)
    return run


def test_a_cpu_spec_run_on_a_gpu_node_counts_the_cpu(tmp_path):
    s = summarize_run(_cpu_run_on_gpu_node(tmp_path / "cpu-run"))
    m = s["metrics"]
    assert m["energy_j"] == pytest.approx(1000.0)  # the CPU's 200 W × 5 s, not the idle GPU's 375 J
    assert m["power_mean_w"] == pytest.approx(200.0) and m["j_per_token"] == pytest.approx(0.2)
    assert s["sources"]["devices_counted"] == "host"
    assert s["data_quality"]["device_selection"]["not_counted"] == ["gpu0 (node0)"]
    assert any("gpu0 (node0) sampled but no rank ran on them" in n for n in s["notes"])
    assert {d["device"]: d["energy_j"] for d in s["per_device"]} == pytest.approx({"cpu0": 1000.0, "gpu0": 375.0})


def _two_of_four(path: Path, **rank_fields) -> Path:
    run = synthetic.write_run(path, devices_per_host=4, steps=5, tokens_per_rank=1000, power_step_w=100.0)

    def edit(info):
        info["rank_map"] = [{**e, **{k: v[i] for k, v in rank_fields.items()}} for i, e in enumerate(info["rank_map"][:2])]
        info["config"]["hardware"]["devices_per_node"] = 2
        info["config"]["layout"]["dp"] = 2
    _edit_info(run, edit)
    for r in (2, 3):
        (run / "events" / f"rank-{r}.parquet").unlink()
    return run


def test_idle_gpus_of_the_node_are_not_counted(tmp_path):
    s = summarize_run(_two_of_four(tmp_path / "two"))
    m = s["metrics"]
    # gpu0 at 500 W and gpu1 at 600 W (power_step_w) for 5 s; gpu2, gpu3 idle (not the run's)
    assert m["energy_j"] == pytest.approx((500 + 600) * 5.0, rel=1e-6)
    assert m["j_per_token"] == pytest.approx(1100 * 5.0 / 10_000, rel=1e-6)
    assert m["cluster_power_mean_w"] == pytest.approx(1100.0, rel=1e-6)
    assert m["cluster_power_peak_w"] == pytest.approx(1100.0 + 2 * 100.0, rel=0.01)  # two devices' peaks
    sel = s["data_quality"]["device_selection"]
    assert sel["not_counted"] == ["gpu2 (node0)", "gpu3 (node0)"] and sel["missing"] == []
    assert any("CUDA_VISIBLE_DEVICES" in n and "launch.device_order" in n for n in s["notes"])
    assert [d["ranks"] for d in s["per_device"]] == [[0], [1], [], []]


def test_torch_device_names_and_device_order_choose_the_gpus(tmp_path):
    # powertrain run's rank map: cuda:<local rank>, and local_device when launch.device_order placed it
    s = summarize_run(_two_of_four(tmp_path / "ordered", device=["cuda:0", "cuda:1"], local_device=[3, 2]))
    assert s["metrics"]["energy_j"] == pytest.approx((800 + 700) * 5.0, rel=1e-6)
    assert {d["device"]: d["ranks"] for d in s["per_device"]} == {"gpu0": [], "gpu1": [], "gpu2": [1], "gpu3": [0]}
    assert not any("CUDA_VISIBLE_DEVICES" in n for n in s["notes"])  # the order is recorded: no doubt


def test_a_rank_device_without_telemetry_is_named(tmp_path):
    s = summarize_run(_two_of_four(tmp_path / "missing", device=["gpu0", "gpu7"]))
    assert s["data_quality"]["device_selection"]["missing"] == ["gpu7 (node0)"]
    assert any("gpu7 (node0): a rank ran there but it has no telemetry" in n for n in s["notes"])


def test_without_a_rank_map_every_accelerator_counts_and_extra_ones_are_said(tmp_path):
    run = _two_of_four(tmp_path / "monitor")
    _edit_info(run, lambda info: info.pop("rank_map"))  # a powertrain monitor run records no map
    s = summarize_run(run)
    assert s["metrics"]["energy_j"] == pytest.approx((500 + 600 + 700 + 800) * 5.0, rel=1e-6)
    assert any("4 accelerators were sampled and the run has 2 rank(s)" in n for n in s["notes"])
    _edit_info(run, lambda info: info.update(kind="import"))  # an import's events stand for the whole job
    s = summarize_run(run)
    assert s["metrics"]["energy_j"] == pytest.approx((500 + 600 + 700 + 800) * 5.0, rel=1e-6)
    assert not any("accelerators were sampled" in n for n in s["notes"])


# ------------------------------------------------------------------------------- H4: device controls


def _cfg(**launch) -> RunConfig:
    return RunConfig.model_validate({"model": "gpt3-tiny", "knobs": {"power_limit_w": 450}, "launch": launch,
                                     "hardware": {"devices_per_node": 2, "device": "h100-sxm", "stand_in": True}})


def test_device_indices_follow_the_inherited_visible_devices():
    assert device_indices(_cfg(), {}) == [0, 1]
    assert device_indices(_cfg(), {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == [4, 5]
    assert device_indices(_cfg(device_order=[1, 0]), {"CUDA_VISIBLE_DEVICES": "4,5"}) == [1, 0]  # the launcher sets it
    amd = RunConfig.model_validate({"model": "gpt3-tiny", "hardware": {"devices_per_node": 2, "device": "mi300x"}})
    assert device_indices(amd, {"ROCR_VISIBLE_DEVICES": "2,3,4", "HIP_VISIBLE_DEVICES": "2,1"}) == [4, 3]
    with pytest.raises(ValueError, match=r"CUDA_VISIBLE_DEVICES='GPU-1a2b' does not list GPU indices.*launch.device_order"):
        device_indices(_cfg(), {"CUDA_VISIBLE_DEVICES": "GPU-1a2b"})
    with pytest.raises(ValueError, match=r"leave 1 GPU\(s\) \[3\] for 2 ranks per node"):
        device_indices(_cfg(), {"CUDA_VISIBLE_DEVICES": "3"})
    with pytest.raises(ValueError, match=r"hide every GPU"):
        device_indices(_cfg(), {"CUDA_VISIBLE_DEVICES": ""})


def test_node_controls_set_the_gpus_the_ranks_see(tmp_path, monkeypatch):
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "ledger.json"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    gpus = [FakeGpu(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", bus_id=f"00000000:{0x18 + i:02x}:00.0")
            for i in range(6)]
    nvml = FakeNvml(gpus)
    found = [g.power_limit_mw for g in gpus]
    with node_controls(_cfg(), "r", binding=nvml) as rec:
        assert rec is not None and [d["device"] for d in rec["devices"]] == ["gpu4", "gpu5"]
        assert [g.power_limit_mw for g in gpus] == [*found[:4], 450_000, 450_000]  # GPUs 0..3 untouched
    assert [g.power_limit_mw for g in gpus] == found
