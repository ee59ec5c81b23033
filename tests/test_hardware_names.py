"""Device names as people write them resolve to one catalog entry by their tokens, or fail naming the closest."""

from __future__ import annotations

import pytest
import yaml

from powertrain.hardware import CATALOG_FILE, load_catalog
from powertrain.hardware.catalog import UnknownDeviceError, get_device, parse_device_name, resolve_device

# (as written, entry) — published tables, nvidia-smi's name, vendor pages, lower case
SPELLINGS = [
    ("H100 80GB", "h100-sxm"),
    ("H100-SXM5-80GB (HBM3)", "h100-sxm"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("h100 sxm5 700w", "h100-sxm"),
    ("H100 96GB", "h100-sxm-96gb"),
    ("H100 SXM 95/96GB HBM2e", "h100-sxm-96gb"),
    ("H200-SXM5-141GB", "h200"),
    ("h200 141gb", "h200"),
    ("NVIDIA H200 141GB HBM3e", "h200"),
    ("GB200 NVL72", "gb200"),
    ("gb300 nvl72", "gb300"),
    ("MI300X", "mi300x"),
    ("AMD Instinct MI300X OAM", "mi300x"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("A100 80GB", "a100-sxm4-80gb"),
    ("A100", "a100-sxm4-80gb"),  # the family's bare name is the catalog's stated default
    ("NVIDIA B200 180GB", "b200"),
    ("NVIDIA GH200 480GB", "gh200"),
    # as the real records in ../shared/data/real name them (MLPerf system JSON, Kineto traces, nvidia-smi)
    ("NVIDIA H100-SXM5-80GB", "h100-sxm"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("NVIDIA H200", "h200"),
    ("H100 SXM 80GB (NVLink 900 GB/s)", "h100-sxm"),  # a bandwidth is no memory size
    # other products of a known family are their own entries, never the SXM part (power, bandwidth differ)
    ("H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 PCIe 80GB", "h100-pcie"),
    ("H100 NVL", "h100-nvl"),
    ("H100 NVL 94GB", "h100-nvl"),
    ("H200 NVL", "h200-nvl"),
    ("a100 pcie 40gb", "a100-pcie-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA H800", "h800"),
    ("H800 SXM5 80GB", "h800"),
    ("A800-SXM4-80GB", "a800-sxm4-80gb"),
    ("NVIDIA H20", "h20"),
    ("AMD Instinct MI325X", "mi325x"),
    ("MI355X", "mi355x"),
    ("AMD Instinct MI350X OAM", "mi350x"),
    ("8xH100", "h100-sxm"),  # a device count glued to the name
    ("72xGB200", "gb200"),
]


@pytest.mark.parametrize(("text", "entry"), SPELLINGS)
def test_free_text_names_resolve(text: str, entry: str) -> None:
    assert get_device(text).name == entry


def test_the_v100_memory_sizes_and_the_l40s_resolve() -> None:
    assert get_device("Tesla V100-SXM2-16GB").name == "v100-sxm2-16gb"  # DGX-1's V100 (Megatron-LM 2019)
    assert get_device("V100 32GB").name == get_device("V100").name == "v100-sxm2-32gb"
    assert get_device("NVIDIA L40S").name == "l40s"


@pytest.mark.parametrize(("text", "entry"), [
    ("B200 192GB", "b200"),  # the decimal 192 GB of DGX B200's 180 GB (GiB-ish) part
    ("GB200 192GB", "gb200"), ("GB300 288GB", "gb300"),  # nominal HBM of the 186 / 279 GB usable
    ("H100 SXM5 94GB", "h100-sxm-96gb"),  # nvidia-smi's MiB of the 96 GB SXM part: the form factor wins over the 94 GB NVL card
    ("H100 94GB", "h100-nvl"), ("GH200 480GB", "gh200"),  # GH200's module name counts its CPU memory
])
def test_memory_sizes_as_tables_write_them_resolve(text: str, entry: str) -> None:
    assert get_device(text).name == entry


def test_tokens_are_read_not_looked_up() -> None:
    q = parse_device_name("NVIDIA H100-SXM5-80GB (HBM3) 700 W")
    assert (q.family, q.memory_gb, q.form, q.power_w, q.vendor) == ("h100", 80.0, "sxm", 700.0, "nvidia")
    q = parse_device_name("gb200 nvl72")
    assert (q.family, q.memory_gb, q.form) == ("gb200", None, "nvl")


@pytest.mark.parametrize("text", ["V100 PCIe 16GB", "H200 NVL 80GB", "A40 24GB", "MI250"])
def test_a_different_product_of_a_known_family_is_refused_with_the_closest(text: str) -> None:
    # another form factor or memory size is another device (power, bandwidth): never silently the SXM part
    with pytest.raises(UnknownDeviceError) as exc:
        get_device(text)
    assert 1 <= len(exc.value.closest) <= 3
    assert "closest:" in str(exc.value) and "--hardware" in str(exc.value)


def test_the_closest_entries_are_of_the_same_family_first() -> None:
    with pytest.raises(UnknownDeviceError) as exc:
        get_device("H100 PCIe 48GB")
    assert exc.value.closest[:2] == ["h100-sxm", "h100-pcie"]  # nearest memory size first


def test_a_name_that_fits_two_products_is_ambiguous_not_guessed() -> None:
    # two PCIe A100s (40 and 80 GB): the memory size decides, so it must be stated; the nearest size wins
    with pytest.raises(UnknownDeviceError) as exc:
        get_device("A100 PCIe")
    assert "ambiguous" in str(exc.value) and set(exc.value.closest) == {"a100-pcie-40gb", "a100-pcie-80gb"}
    assert get_device("H100 94GB").name == "h100-nvl" and get_device("NVIDIA H100 96GB HBM3").name == "h100-sxm-96gb"


def test_an_ambiguous_name_is_refused(tmp_path) -> None:
    base = yaml.safe_load(CATALOG_FILE.read_text())["devices"]["h100-sxm"]
    f = tmp_path / "hw.yaml"
    f.write_text(yaml.safe_dump({"devices": {
        "z900-a": dict(base, memory_gb=64, aliases=["Z900 64GB SXM"]),
        "z900-b": dict(base, memory_gb=128, aliases=["Z900 128GB SXM"])}}))
    cat = load_catalog([f])
    assert resolve_device("z900 128 GB", cat) == "z900-b"
    with pytest.raises(UnknownDeviceError, match="ambiguous") as exc:
        resolve_device("Z900 SXM", cat)
    assert set(exc.value.closest) == {"z900-a", "z900-b"}


def test_a_user_catalog_is_indexed_on_its_own(tmp_path) -> None:
    base = yaml.safe_load(CATALOG_FILE.read_text())["devices"]["h100-sxm"]
    f = tmp_path / "hw.yaml"
    f.write_text(yaml.safe_dump({"devices": {"lab-a6000": dict(base, memory_gb=48, aliases=["RTX A6000"])}}))
    cat = load_catalog([f])
    assert get_device("NVIDIA RTX A6000 48GB", cat).name == "lab-a6000"
    with pytest.raises(UnknownDeviceError):
        get_device("NVIDIA RTX A6000 48GB")  # the shipped catalog still lacks it


def test_a_spec_written_with_a_free_text_device_validates_and_predicts() -> None:
    from powertrain.predict import case_from_run_config
    from powertrain.spec.layout import Layout
    from powertrain.spec.model import get_model
    from powertrain.spec.run import Hardware, Knobs, RunConfig
    from powertrain.spec.validate import rule_device

    def cfg(device: str) -> RunConfig:
        return RunConfig(name="t", model=get_model("llama3-70b"), layout=Layout(tp=8, pp=1),
                         knobs=Knobs(micro_batch=1, global_batch=8),
                         hardware=Hardware(nodes=1, devices_per_node=8, device=device))

    assert rule_device(cfg("NVIDIA H100 80GB HBM3")) == []
    assert case_from_run_config(cfg("h200 141gb")).device.name == "h200"
    (v,) = rule_device(cfg("H100 PCIe 48GB"))
    assert v.rule == "unknown_device" and "h100-sxm" in v.message
