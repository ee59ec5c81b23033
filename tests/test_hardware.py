"""The hardware catalog: every device the issue names, cited, and user additions."""

from __future__ import annotations

import pytest
import yaml

from powertrain.hardware import CATALOG_FILE, get_device, load_catalog, measure_cpu

NAMED = ("v100-sxm2-32gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm", "h200", "gh200", "b200", "b300",
         "gb200", "gb300", "mi250x", "mi300x")


def test_catalog_has_every_named_device_with_a_source() -> None:
    cat = load_catalog()
    for name in NAMED:
        dev = cat[name]
        assert dev.source, name
        assert dev.node.source, name
        assert dev.peak("bf16") > dev.peak("fp32") > 0
        assert dev.memory_bytes > 16 * 2**30 and dev.memory_bw > 5e11
        assert dev.tdp_w > dev.idle_w > 0
        assert dev.node.inter_node_bw_per_device > 0 and dev.node.intra_node_bw > dev.node.inter_node_bw_per_device / 4


def test_fp8_and_fp4_only_where_the_device_has_them() -> None:
    assert get_device("h100-sxm").peak("fp8") == pytest.approx(2 * get_device("h100-sxm").peak("bf16"), rel=1e-3)
    # A100 has no fp8: an fp8 recipe runs at the 16-bit rate
    assert get_device("a100-sxm4-80gb").peak("fp8") == get_device("a100-sxm4-80gb").peak("bf16")
    assert get_device("b200").peak("fp4") == pytest.approx(2 * get_device("b200").peak("fp8"))


def test_aliases_from_published_tables_resolve() -> None:
    assert get_device("H100-SXM5-80GB").name == "h100-sxm"
    assert get_device("GB200 (Blackwell in NVL72)").node.nvlink_domain == 72
    assert get_device("a100 sxm4 80gb").name == "a100-sxm4-80gb"


def test_unknown_device_names_the_fix() -> None:
    with pytest.raises(KeyError, match="--hardware"):
        get_device("tpu-v9")


def test_user_yaml_adds_and_overrides(tmp_path) -> None:
    base = yaml.safe_load(CATALOG_FILE.read_text())["devices"]["h100-sxm"]
    mine = dict(base, tdp_w=500, aliases=["My H100"])
    new = {k: v for k, v in base.items() if k != "aliases"} | {"memory_gb": 24}
    f = tmp_path / "hw.yaml"
    f.write_text(yaml.safe_dump({"devices": {"h100-sxm": mine, "lab-gpu": new}}))
    cat = load_catalog([f])
    assert cat["h100-sxm"].tdp_w == 500
    assert cat["lab-gpu"].memory_bytes < cat["h100-sxm"].memory_bytes
    assert get_device("My H100", cat).tdp_w == 500


def test_bad_user_yaml_says_what_is_missing(tmp_path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({"devices": {"x": {"memory_gb": 8}}}))
    with pytest.raises(ValueError, match="lacks peak_tflops"):
        load_catalog([f])


def test_cpu_is_measured_and_labelled() -> None:
    cpu = measure_cpu()
    assert not cpu.has_power_sensor and cpu.transport == "gloo" and cpu.source.startswith("measured")
    assert cpu.peak("fp32") > 1e8 and cpu.memory_bw > 1e8
    assert get_device("cpu") is cpu


def test_user_yaml_says_sensor_and_transport_and_the_old_key_still_reads(tmp_path) -> None:
    base = yaml.safe_load(CATALOG_FILE.read_text())["devices"]["h100-sxm"]
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump({"devices": {
        "new": {**base, "has_power_sensor": False, "transport": "gloo"},
        "old": {**base, "measured": True},  # the key before has_power_sensor/transport: same meaning
        "plain": base,
    }}))
    cat = load_catalog([f])
    for name in ("new", "old"):
        assert not cat[name].has_power_sensor and cat[name].transport == "gloo"
    assert cat["plain"].has_power_sensor and cat["plain"].transport == "nccl"
    f.write_text(yaml.safe_dump({"devices": {"bad": {**base, "transport": "mpi"}}}))
    with pytest.raises(ValueError, match="transport 'mpi'"):
        load_catalog([f])
