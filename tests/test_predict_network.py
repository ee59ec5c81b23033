"""Collectives from first principles (predict/network.py): NICs striped, NVLS, placement, alpha-beta."""

from __future__ import annotations

import pytest

from powertrain.hardware import get_device
from powertrain.predict import Case
from powertrain.predict import network as net
from powertrain.predict.calibration import Coefficients

C = Coefficients()


def _case(dev: str = "h100-sxm", world: int = 64, dpn: int = 8, **kw: object) -> Case:
    base = dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=32000, seq_len=4096,
                tp=1, pp=1, dp=world, device=get_device(dev), devices_per_node=dpn)
    base.update(kw)
    return Case(**base)  # type: ignore[arg-type]


def test_a_group_filling_whole_nodes_uses_all_their_nics() -> None:
    # DP64 over 8 DGX H100 nodes: every node's 8 GPUs are in the group, so the ring has 8 × 400 Gb/s,
    # not one GPU's 50 GB/s share (the bug issue 15 names): about 8x faster than a one-NIC ring.
    case = _case()
    f = net.fabric(case, C)
    g = net.group(case, 1, 64)
    assert g.in_domain == 8 and g.domains == 8
    size = 1e9
    t = net.all_reduce(f, g, size)
    one_nic = 2 * 63 / 64 * size / f.nic_share
    assert one_nic / t == pytest.approx(8, rel=0.1)


def test_one_member_per_node_is_bound_by_its_own_nic() -> None:
    # DP groups of TP8 layouts have one GPU per node: each ring runs on that GPU's NIC share
    case = _case(tp=8, dp=8)
    f = net.fabric(case, C)
    g = net.group(case, 8, 8)
    assert g.in_domain == 1
    assert net.all_reduce(f, g, 1e9) == pytest.approx(2 * 7 / 8 * 1e9 / f.nic_share, rel=0.01)


def test_nvl72_keeps_72_gpus_on_nvlink() -> None:
    case = _case("gb200", world=144, dpn=4)
    f = net.fabric(case, C)
    inside = net.group(case, 1, 72)
    assert inside.domains == 1
    across = net.group(case, 1, 144)
    assert across.domains == 2 and across.in_domain == 72
    # bus bandwidth across two racks: the 72 GPUs' NICs together exceed NVLink, so NVLink bounds it
    assert net._scale_out_bw(f, across) == pytest.approx(f.up_bw)


def test_nvls_speeds_up_an_in_domain_all_reduce_only_where_the_switch_has_it() -> None:
    from dataclasses import replace

    case = _case(world=8)
    f = net.fabric(case, C)
    assert f.nvls and not net.fabric(_case("a100-sxm4-80gb", world=8), C).nvls  # NVSwitch gen 3+ only
    g = net.group(case, 1, 8)
    ring = net.all_reduce(replace(f, nvls=False), g, 1e9)
    nvls = net.all_reduce(f, g, 1e9)
    assert nvls < ring
    assert net.reduce_scatter(replace(f, nvls=False), g, 1e9) == net.reduce_scatter(f, g, 1e9)
    # across domains NVLS does not apply (the network bounds the ring)
    g2 = net.group(_case(world=16), 1, 16)
    assert net.all_reduce(f, g2, 1e9) == net.all_reduce(replace(f, nvls=False), g2, 1e9)


def test_latency_bound_small_messages_use_the_tree() -> None:
    case = _case(world=512)
    f = net.fabric(case, C)
    g = net.group(case, 1, 512)
    t = net.all_reduce(f, g, 8.0)  # 8 bytes: pure latency
    ring_lat = 2 * 511 * ((512 - 64) * f.up_lat + 64 * f.out_lat) / 512
    assert t < ring_lat / 5


def test_oversubscription_above_a_pod_slows_what_crosses_it() -> None:
    from dataclasses import replace

    case = _case(world=512)
    f = net.fabric(case, C)
    g = net.group(case, 1, 512)
    slow = replace(f, pod_devices=256, oversubscription=2.0)
    assert net.all_reduce(slow, g, 1e9) > 1.8 * net.all_reduce(f, g, 1e9)
    small = net.group(case, 1, 128)
    assert net.all_reduce(slow, small, 1e9) == net.all_reduce(f, small, 1e9)


def test_all_to_all_moves_domain_and_network_shares_concurrently() -> None:
    case = _case(world=16)
    f = net.fabric(case, C)
    g = net.group(case, 1, 16)
    size = 1e8
    t = net.all_to_all(f, g, size)
    far = size * 8 / 16 / f.nic_share
    assert far <= t < far * 1.2
    assert net.all_to_all(f, net.group(case, 1, 8), size) < t


def test_gloo_keeps_rings_only() -> None:
    from powertrain.hardware import HostProbe, cpu_device

    probe = HostProbe(matmul_flops=1e11, copy_bytes_per_s=1e10, threads=1, cores=2, method="test", source="test")
    case = _case(world=2, dpn=2, device=cpu_device(probe, 2))
    f = net.fabric(case, C)
    assert not f.tree
    g = net.group(case, 1, 2)
    assert net.all_reduce(f, g, 1e6) == pytest.approx(1e6 / f.up_bw + 2 * f.up_lat)
