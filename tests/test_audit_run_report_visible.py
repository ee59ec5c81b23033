"""run.json records the CUDA_VISIBLE_DEVICES / HIP / ROCR variables `powertrain run` inherited (null
when unset, "" only when set empty), and the analysis maps a rank's cuda:i through them to the
sampler's gpu<index>, so a run on GPUs 3 and 2 counts those two and not gpu0 and gpu1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from powertrain.analyze import summarize_run, synthetic
from powertrain.analyze.families.context import visible_by_node
from powertrain.launch.local import _note_placement, _place_ranks, rank_map
from powertrain.spec.run import RunConfig
from powertrain.supervise import inherited_visible_devices

NONE_SET = {"CUDA_VISIBLE_DEVICES": None, "HIP_VISIBLE_DEVICES": None, "ROCR_VISIBLE_DEVICES": None}


def test_the_record_keeps_unset_apart_from_empty():
    assert inherited_visible_devices({}) == NONE_SET
    assert inherited_visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == {**NONE_SET, "CUDA_VISIBLE_DEVICES": ""}
    assert inherited_visible_devices({"CUDA_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "1"}) == \
        {**NONE_SET, "CUDA_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "1"}


def _gpu_cfg(**launch) -> RunConfig:
    return RunConfig.model_validate({"model": "gpt3-tiny", "launch": launch,
                                     "hardware": {"devices_per_node": 2, "device": "h100-sxm"}})


def test_the_run_records_what_it_inherited(monkeypatch, tmp_path):
    import json

    import powertrain

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    with powertrain.Monitor(out=tmp_path / "r", rate_hz=20, backends=["host"]):
        pass
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["visible_devices"] == {**NONE_SET, "CUDA_VISIBLE_DEVICES": "3,2"}
    cfg = _gpu_cfg()
    placed = {"rank_map": rank_map(cfg, "node0", "cuda")}
    _note_placement(placed, cfg, None, [], {})
    assert all("local_device" not in e for e in placed["rank_map"])  # the analysis maps cuda:i through the record


def test_a_rebuilt_rank_map_keeps_the_device_order():
    cfg = _gpu_cfg(device_order=[1, 0])
    entries = rank_map(cfg, "node0", "cuda")
    _place_ranks(entries, cfg)
    assert [e["local_device"] for e in entries] == [1, 0]


def _edit_info(run: Path, edit) -> None:
    info = json.loads((run / "run.json").read_text())
    edit(info)
    (run / "run.json").write_text(json.dumps(info))


def _two_of_four(path: Path, visible: dict | None) -> Path:
    """Two cuda ranks on a node whose sampler reads four GPUs (gpu<i> draws 500 + 100·i W)."""
    run = synthetic.write_run(path, devices_per_host=4, steps=5, tokens_per_rank=1000, power_step_w=100.0)

    def edit(info):
        info["rank_map"] = [{**e, "device": f"cuda:{i}"} for i, e in enumerate(info["rank_map"][:2])]
        info["config"]["hardware"]["devices_per_node"] = 2
        info["config"]["layout"]["dp"] = 2
        for i, d in enumerate(info["devices"]):
            d.update(vendor="nvidia", uuid=f"GPU-{i}aaa-0000")
        if visible is not None:
            info["visible_devices"] = visible
    _edit_info(run, edit)
    for r in (2, 3):
        (run / "events" / f"rank-{r}.parquet").unlink()
    return run


@pytest.mark.parametrize("value", ["3,2", "GPU-3aaa,GPU-2"])
def test_cuda_ranks_are_mapped_through_the_recorded_visible_devices(tmp_path, value):
    s = summarize_run(_two_of_four(tmp_path / "run", {**NONE_SET, "CUDA_VISIBLE_DEVICES": value}))
    assert s["metrics"]["energy_j"] == pytest.approx((800 + 700) * 5.0, rel=1e-6)  # gpu3 and gpu2, not gpu0, gpu1
    assert {d["device"]: d["ranks"] for d in s["per_device"]} == {"gpu0": [], "gpu1": [], "gpu2": [1], "gpu3": [0]}
    assert s["data_quality"]["device_selection"]["not_counted"] == ["gpu0 (node0)", "gpu1 (node0)"]
    assert not any("if CUDA_VISIBLE_DEVICES was set" in n for n in s["notes"])  # the record says where they ran


def test_unset_keeps_rank_i_on_gpu_i(tmp_path):
    s = summarize_run(_two_of_four(tmp_path / "run", NONE_SET))
    assert s["metrics"]["energy_j"] == pytest.approx((500 + 600) * 5.0, rel=1e-6)


def test_an_entry_that_names_no_sampled_gpu_leaves_the_ranks_unplaced(tmp_path):
    # a MIG instance: the ranks' GPUs cannot be told, so no guess is made; every accelerator counts, with a note
    s = summarize_run(_two_of_four(tmp_path / "run", {**NONE_SET, "CUDA_VISIBLE_DEVICES": "MIG-1234"}))
    assert s["metrics"]["energy_j"] == pytest.approx((500 + 600 + 700 + 800) * 5.0, rel=1e-6)
    assert any("4 accelerators were sampled and the run has 2 rank(s)" in n for n in s["notes"])


def test_each_node_uses_its_own_record_and_rocm_nests_hip_in_rocr():
    info = {
        "rank_map": [{"rank": 0, "node": 0, "host": "a"}, {"rank": 1, "node": 1, "host": "b"},
                     {"rank": 2, "node": 2, "host": "c"}],
        "devices": [{"host": "a", "device": "gpu0", "kind": "gpu", "vendor": "nvidia"},
                    {"host": "b", "device": "gpu0", "kind": "gpu", "vendor": "amd"},
                    {"host": "c", "device": "gpu0", "kind": "gpu", "vendor": "nvidia"}],
        "visible_devices": {**NONE_SET, "CUDA_VISIBLE_DEVICES": "6,7"},
        "nodes": {"exits": {"1": {"visible_devices": {**NONE_SET, "ROCR_VISIBLE_DEVICES": "2,3,4",
                                                      "HIP_VISIBLE_DEVICES": "2,1"}},
                            "2": {"visible_devices": NONE_SET}}},
    }
    assert visible_by_node(info) == {0: ["gpu6", "gpu7"], 1: ["gpu4", "gpu3"]}
