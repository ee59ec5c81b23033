"""Node power at the wall: named host terms from the catalog's node description, fans, power supplies."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from powertrain.hardware import HostSpec, PsuSpec, get_device, load_catalog
from powertrain.predict import Case, predict
from powertrain.predict.node_power import (
    FAN_MAX_SHARE,
    TITANIUM_CURVE,
    node_power,
    psu_efficiency,
)
from powertrain.predict.power import node_dc_w, node_power_w

H100 = get_device("h100-sxm")
TERMS = ("cpus_w", "memory_w", "nics_w", "baseboard_w", "storage_w", "other_w", "fans_w")


def _node(**host: object):
    """The catalog's DGX H100 node with some host values replaced."""
    assert H100.node.host is not None
    return replace(H100.node, host=replace(H100.node.host, **host))  # type: ignore[arg-type]


def test_the_terms_add_up_to_dc_and_the_supplies_take_the_rest() -> None:
    p = node_power(8 * 650.0, H100.node, "air")
    assert p.why_null is None and p.gpus_w == 5200
    assert p.dc_w == pytest.approx(p.gpus_w + sum(getattr(p, t) for t in TERMS))
    assert p.host_w == pytest.approx(p.dc_w - p.gpus_w)
    assert p.ac_w == pytest.approx(p.dc_w / p.psu_efficiency)
    assert p.conversion_w == pytest.approx(p.ac_w - p.dc_w) and p.conversion_w > 0
    # DGX H100: 2 × 350 W Xeon 8480C, 32 DIMMs, 10 NICs, 4 NVSwitch chips, 10 drives, six 3.3 kW supplies
    h = H100.node.host
    assert (h.cpu_sockets, h.cpu_tdp_w, h.dimms, h.nics, h.nvswitches, h.drives) == (2, 350, 32, 10, 4, 10)
    assert h.psu == PsuSpec(6, 3300.0, 2) and p.psu_load == pytest.approx(p.dc_w / (6 * 3300))
    # every value the description leaves out is said, with the word "estimate" or "assumed"
    assert any("nic_w not described: 25 W per NIC assumed (estimate)" in n for n in p.notes)
    assert all("estimate" in n or "assumed" in n or "counted" in n for n in p.notes), p.notes


def test_power_and_dc_helpers_are_the_same_formula_over_nodes() -> None:
    one = node_power(8 * 600.0, H100.node, "air")
    assert node_power_w(4 * 8 * 600.0, 4, H100) == pytest.approx(4 * one.ac_w)
    assert node_dc_w(4 * 8 * 600.0, 4, H100) == pytest.approx(4 * one.dc_w)
    idle = node_power(8 * H100.idle_w, H100.node, "air", training=False)
    assert idle.cpu_load == 0 and idle.cpus_w < one.cpus_w and idle.ac_w < one.ac_w


def test_cpu_load_follows_the_ranks_on_the_host_cores() -> None:
    full = node_power(0.0, H100.node, "air", ranks=8)
    half = node_power(0.0, H100.node, "air", ranks=4)
    h = H100.node.host
    assert full.cpu_load == pytest.approx(8 * 2 / (2 * 56)) and half.cpu_load == pytest.approx(full.cpu_load / 2)
    assert full.cpus_w == pytest.approx(2 * (0.3 * 350 + 0.7 * 350 * full.cpu_load))
    given = node_power(0.0, _node(cpu_idle_w=60.0), "air")
    assert given.cpus_w == pytest.approx(2 * (60 + (350 - 60) * given.cpu_load)) and h.cpu_idle_w is None


def test_fans_rise_steeply_with_heat_and_vanish_for_liquid_and_immersion() -> None:
    heats = [2000.0, 4000.0, 6000.0, 8000.0]
    fans = [node_power(g, H100.node, "air").fans_w for g in heats]
    assert all(b > a for a, b in itertools.pairwise(fans))
    # affinity law: above the floor, doubling the heat is 8× the fan power
    lo, hi = node_power(4000.0, H100.node, "air"), node_power(8000.0, H100.node, "air")
    assert lo.fan_speed > 0.2 and hi.fans_w == pytest.approx(lo.fans_w * (hi.fan_speed / lo.fan_speed) ** 3)
    assert hi.fan_speed == pytest.approx((hi.dc_w - hi.fans_w) / 10200)
    assert node_power(20000.0, H100.node, "air").fans_w == pytest.approx(FAN_MAX_SHARE * 10200)  # full speed
    stated = node_power(8000.0, _node(fans_max_w=900.0, airflow_max_cfm=1000.0, air_delta_t_c=20.0), "air")
    assert stated.fan_speed == pytest.approx(
        (stated.dc_w - stated.fans_w) / (1000 * 0.3048**3 / 60 * 1.2 * 1005 * 20))
    for cooling in ("liquid", "immersion"):
        p = node_power(8000.0, H100.node, cooling)
        assert p.fans_w == 0 and any(cooling in n for n in p.notes)
        assert p.dc_w < hi.dc_w


def test_psu_loss_falls_then_rises_with_load() -> None:
    assert [psu_efficiency(x) for x, _ in TITANIUM_CURVE] == [y for _, y in TITANIUM_CURVE]
    assert psu_efficiency(0.35) == pytest.approx(0.95)  # halfway between 20 % (94 %) and 50 % (96 %)
    assert psu_efficiency(0.02) == 0.90 and psu_efficiency(1.3) == 0.91  # held at the curve's ends
    shares = [0.1, 0.15, 0.2, 0.35, 0.5, 0.75, 1.0]
    loss = [1 - psu_efficiency(x) for x in shares]
    best = loss.index(min(loss))
    assert shares[best] == 0.5
    assert all(b < a for a, b in itertools.pairwise(loss[: best + 1]))
    assert all(b > a for a, b in itertools.pairwise(loss[best:]))
    # N+N: the spare supplies share the load, so each runs at half of what N alone would
    n_plus_n = node_power(8000.0, _node(psu=PsuSpec(6, 3300.0, 3)), "air")
    assert n_plus_n.psu_load == pytest.approx(n_plus_n.dc_w / (6 * 3300))
    undescribed = node_power(8000.0, _node(psu=None), "air")
    assert undescribed.psu_efficiency == 0.96 and any("power supplies not described" in n for n in undescribed.notes)


def test_an_undescribed_node_is_said_not_guessed() -> None:
    dev = get_device("mi300x")
    assert dev.node.host is None
    p = node_power(8 * 600.0, dev.node, dev.cooling, name=dev.name)
    assert p.gpus_w == 4800 and p.dc_w is None and p.ac_w is None and p.host_w is None
    assert all(getattr(p, t) is None for t in TERMS)
    assert "the node of 'mi300x'" in p.why_null and "add a `host:` block" in p.why_null
    assert node_power_w(4800.0, 1, dev) is None
    case = Case(layers=8, hidden=1024, ffn=4096, heads=8, kv_heads=8, vocab=32000, seq_len=2048, dp=8, micro_batch=1,
                global_batch=8, device=dev, devices_per_node=8)
    bd = predict(case).breakdown
    assert bd["node_energy_per_step_j"] is None and "describes no host" in bd["node_power"]["why_null"]
    # an air-cooled host without what sizes its fans is said too
    no_fans = node_power(4800.0, _node(max_power_w=None), "air", name="h100-sxm")
    assert no_fans.dc_w is None and "fan power is unknown" in no_fans.why_null


def test_advise_refuses_node_limits_on_an_undescribed_node() -> None:
    from powertrain.advise.request import Constraints, Objective, make_request

    with pytest.raises(ValueError, match=r"--node-kw: the node of 'mi300x': .*add a `host:` block"):
        make_request("mixtral-8x7b-tiny", "mi300x", 8, 1, 8, constraints=Constraints(node_kw=9.0))
    with pytest.raises(ValueError, match=r"--objective cost: the node of 'mi300x'"):
        make_request("mixtral-8x7b-tiny", "mi300x", 8, 1, 8,
                     objective=Objective("cost", tokens=1e9, gpu_hour_price=2.0, kwh_price=0.1))
    assert make_request("mixtral-8x7b-tiny", "mi300x", 8, 1, 8, constraints=Constraints(max_temp_c=80)).device.name


def _refused(tmp_path: Path, node_extra: dict) -> str:
    raw = yaml.safe_load(Path(__file__).resolve().parents[1].joinpath(
        "src/powertrain/hardware/catalog.yaml").read_text())["devices"]["h100-sxm"]
    raw = {**raw, "node": {**raw["node"], **node_extra}}
    f = tmp_path / "hw.yaml"
    f.write_text(yaml.safe_dump({"devices": {"mygpu": raw}}))
    with pytest.raises(ValueError) as exc:
        load_catalog([f])
    msg = str(exc.value)
    assert "\n" not in msg and str(f) in msg
    return msg


@pytest.mark.parametrize(("typo", "meant"), [("cpu_tdp", "cpu_tdp_w"), ("nic_watts", "nic_w"),
                                             ("memory_gib", "memory_gb"), ("fans_max", "fans_max_w")])
def test_an_unknown_host_key_is_refused_with_the_nearest(tmp_path: Path, typo: str, meant: str) -> None:
    host = {"cpu_sockets": 2, "cpu_tdp_w": 300, "dimms": 32, typo: 1}
    msg = _refused(tmp_path, {"host": host})
    assert f"device 'mygpu' node host: unknown key '{typo}' (did you mean {meant}?)" in msg


def test_host_and_psu_values_are_checked(tmp_path: Path) -> None:
    base = {"cpu_sockets": 2, "cpu_tdp_w": 300, "dimms": 32}
    assert "psu: unknown key 'rating_w' (did you mean rated_w?)" in _refused(
        tmp_path, {"host": {**base, "psu": {"count": 6, "rating_w": 3300}}})
    assert "lacks cpu_tdp_w, dimms or memory_gb" in _refused(tmp_path, {"host": {"cpu_sockets": 2}})
    assert "dimms = 2.5 is not a whole number" in _refused(tmp_path, {"host": {**base, "dimms": 2.5}})
    assert "redundant 6 of 6 supplies" in _refused(
        tmp_path, {"host": {**base, "psu": {"count": 6, "rated_w": 3300, "redundant": 6}}})
    assert "nic_w = -3 is not a number ≥ 0" in _refused(tmp_path, {"host": {**base, "nic_w": -3}})


def test_a_user_host_overrides_and_reaches_the_prediction(tmp_path: Path) -> None:
    raw = yaml.safe_load(Path(__file__).resolve().parents[1].joinpath(
        "src/powertrain/hardware/catalog.yaml").read_text())["devices"]["h100-sxm"]
    host = {"cpu_sockets": 2, "cpu_cores": 32, "cpu_tdp_w": 300, "memory_gb": 2048, "nics": 8, "nic_w": 20,
            "nvswitches": 4, "drives": 10, "psu": {"count": 4, "rated_w": 3000, "redundant": 1},
            "source": "my site"}
    f = tmp_path / "hw.yaml"
    f.write_text(yaml.safe_dump({"devices": {"mygpu": {**raw, "cooling": "immersion",
                                                       "node": {**raw["node"], "host": host}}}}))
    dev = load_catalog([f])["mygpu"]
    # the catalog's `thermal: immersion:` entry (model defaults) is what an immersion-cooled device gets
    assert dev.cooling == "immersion" and dev.thermal.inlet_c == 35.0 and dev.thermal.rear_preheat_c_per_kw == 0
    assert isinstance(dev.node.host, HostSpec) and dev.node.host.memory_gb == 2048
    p = node_power(8 * 600.0, dev.node, dev.cooling)
    assert p.fans_w == 0 and p.nics_w == 160 and p.memory_w == 32 * 5.0
    assert p.psu_load == pytest.approx(p.dc_w / 12000)


def test_the_immersion_thermal_entry_sits_between_air_and_liquid() -> None:
    raw = yaml.safe_load(Path(__file__).resolve().parents[1].joinpath(
        "src/powertrain/hardware/catalog.yaml").read_text())["thermal"]
    imm = raw["immersion"]
    assert raw["air"]["r_c_per_w"] > imm["r_c_per_w"] > raw["liquid"]["r_c_per_w"]
    assert imm["rear_preheat_c_per_kw"] == 0 and "model defaults" in imm["note"]
