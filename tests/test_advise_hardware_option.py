"""advise --hardware (issue 32, point 1): a path is that file, never a fuzzy name; a near name says what it became."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from powertrain.advise import make_request
from powertrain.cli import app
from powertrain.hardware import describe_hardware, hardware_from_option

SLOW_NET = """devices:
  h200-ib100:
    vendor: nvidia
    peak_tflops: {fp32: 67.0, tf32: 494.7, fp16: 989.4, bf16: 989.4, fp8: 1978.9}
    memory_gb: 141
    memory_bw_gb_s: 4800
    tdp_w: 700
    compute_units: 132
    max_sm_clock_mhz: 1980
    node:
      devices_per_node: 8
      intra_node_bw_gb_s: 450
      intra_node_latency_us: 3
      nic_count: 1
      nic_gbit_s: 100
      inter_node_latency_us: 5
"""


@pytest.fixture
def isolated_catalog(monkeypatch: pytest.MonkeyPatch):
    """A test that reads a hardware file must not leave it in the process's catalog for the next one."""
    from powertrain.hardware.catalog import _default_catalog

    monkeypatch.setenv("POWERTRAIN_HARDWARE", os.environ.get("POWERTRAIN_HARDWARE", ""))
    _default_catalog.cache_clear()
    yield
    _default_catalog.cache_clear()


def test_a_hardware_file_is_read_as_is_not_matched_to_a_catalog_entry(tmp_path: Path, isolated_catalog) -> None:
    path = tmp_path / "h200-anything.yaml"  # a name the fuzzy reader would take for the catalog's H200
    path.write_text(SLOW_NET)
    req = make_request("llama3-8b", str(path), 16, 2, 64)
    assert req.device.name == req.device_name == "h200-ib100"
    assert req.device.node.nic_count == 1 and req.device.node.nic_bw == pytest.approx(100e9 / 8)
    assert req.hardware_note and "as that file describes it" in req.hardware_note and str(path) in req.hardware_note
    assert "1 × 100 Gb/s NICs per node" in describe_hardware(req.device)


@pytest.mark.parametrize("text", ["my/h200-ib100.yaml", "./h200-anything.yaml", "h100-pcie-foo.yml"])
def test_a_path_that_does_not_exist_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match=rf"--hardware {text}: no such file"):
        hardware_from_option(text)


def test_a_file_with_several_devices_is_refused_with_the_names(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(SLOW_NET + SLOW_NET.replace("devices:\n", "").replace("h200-ib100", "h200-ib200"))
    with pytest.raises(ValueError, match=r"describes 2 devices \(h200-ib100, h200-ib200\)"):
        hardware_from_option(str(path))


def test_an_alias_and_a_near_name_say_which_entry_they_became() -> None:
    dev, note = hardware_from_option("h200")
    assert dev.name == "h200" and note is None  # the entry's own name: nothing to say
    dev, note = hardware_from_option("H100")
    assert dev.name == "h100-sxm" and note and "one of its aliases" in note
    dev, note = hardware_from_option("h100-pcie-foo")
    assert dev.name == "h100-pcie" and note and "no catalog name or alias: read as entry 'h100-pcie'" in note


def test_advise_prints_the_hardware_it_assumed_and_how_it_read_the_option(tmp_path: Path, isolated_catalog) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(SLOW_NET)
    res = CliRunner().invoke(app, ["advise", "-m", "llama3-8b", "--hardware", str(path), "-g", "16", "-n", "2",
                                   "-b", "64", "--top", "1"], terminal_width=220)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert any(ln.startswith("note: --hardware ") and "h200-ib100" in ln for ln in lines)
    assert any(ln.startswith("hardware assumed: h200-ib100: 141 GB") and "1 × 100 Gb/s NICs" in ln for ln in lines)


def test_predict_prints_the_hardware_each_spec_assumed_and_a_near_name(tmp_path: Path) -> None:
    spec = tmp_path / "near.yaml"
    spec.write_text("name: near\nmodel: llama3-8b\nlayout: {tp: 2, pp: 1}\n"
                    "knobs: {micro_batch: 1, global_batch: 16, precision: bf16}\n"
                    "hardware: {nodes: 1, devices_per_node: 8, device: H100}\n")
    res = CliRunner().invoke(app, ["predict", str(spec)], terminal_width=220)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "note: hardware.device 'H100': catalog entry 'h100-sxm' ('H100' is one of its aliases)" in text
    assert "hardware assumed: h100-sxm: 80 GB, 700 W; 8 per node" in text


def test_gpus_alone_means_as_many_nodes_as_the_count_needs() -> None:
    req = make_request("llama3-8b", "h200", 32, None, 64)
    assert (req.nodes, req.devices_per_node) == (4, 8)
    assert req.hardware_note and "--nodes not given: 4 nodes of 8" in req.hardware_note
    assert make_request("llama3-8b", "h200", 8, None, 64).nodes == 1
    assert make_request("llama3-tiny", "cpu", 4, None, 8).nodes == 1  # a CPU's ranks share the host
    with pytest.raises(ValueError, match="not a whole number of h200 nodes of 8; give --nodes"):
        make_request("llama3-8b", "h200", 36, None, 72)
