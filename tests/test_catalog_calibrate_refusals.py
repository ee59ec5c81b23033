"""Every knob real or refused: user hardware catalogs and `calibrate --params` (audit A7, A9).

A catalog key the loader does not read would leave its default in place without a word (a typo of
``idle_w`` gives 10 % of TDP, of ``slowdown_c`` no throttling, an upper-case ``BF16`` peak the fp32
fallback); a coefficient no run's prediction moves would be fitted to an arbitrary value and saved into
the profile every later prediction uses. Both are refused with one line naming the fix.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.hardware import CATALOG_FILE, get_device, load_catalog
from powertrain.predict import Case, fit_calibration, load_calibration, predict
from powertrain.predict.calibrate import MeasuredRun
from powertrain.schema import EVENTS_SCHEMA
from powertrain.spec.run import RunConfig
from powertrain.store import RunDir

H100 = yaml.safe_load(CATALOG_FILE.read_text())["devices"]["h100-sxm"]


def _load(tmp_path, raw: dict):
    f = tmp_path / "hw.yaml"
    f.write_text(yaml.safe_dump(raw))
    return load_catalog([f])


def _refused(tmp_path, raw: dict) -> str:
    with pytest.raises(ValueError) as exc:
        _load(tmp_path, raw)
    msg = str(exc.value)
    assert "\n" not in msg and str(tmp_path / "hw.yaml") in msg
    return msg


# --- the hardware catalog (A7) ------------------------------------------------------------------------


def test_the_shipped_catalog_reads_every_key_it_holds() -> None:
    cat = load_catalog()
    assert "h100-sxm" in cat and cat["h100-sxm"].peak("bf16") > cat["h100-sxm"].peak("fp32")


@pytest.mark.parametrize(("entry", "typo", "meant"), [
    ({"idle_watts": 90}, "idle_watts", "idle_w"),
    ({"power_at_peak": 900}, "power_at_peak", "power_at_peak_w"),
    ({"slowdown_temp_c": 80}, "slowdown_temp_c", "slowdown_c"),
    ({"power_limit_w": 500}, "power_limit_w", "tdp_w"),  # too far in spelling: named by meaning
])
def test_an_unknown_device_key_is_refused_naming_the_closest(tmp_path, entry, typo, meant) -> None:
    msg = _refused(tmp_path, {"devices": {"mygpu": {**H100, **entry}}})
    assert f"device 'mygpu': unknown key '{typo}' (did you mean {meant}" in msg


@pytest.mark.parametrize(("typo", "meant"), [("nvlink_domain_size", "nvlink_domain"),
                                             ("oversubscription_ratio", "oversubscription")])
def test_an_unknown_node_key_is_refused(tmp_path, typo, meant) -> None:
    msg = _refused(tmp_path, {"devices": {"mygpu": {**H100, "node": {**H100["node"], typo: 4}}}})
    assert f"device 'mygpu' node: unknown key '{typo}' (did you mean {meant}?)" in msg


def test_an_unknown_top_level_or_thermal_key_is_refused(tmp_path) -> None:
    assert "unknown key 'device' (did you mean devices?)" in _refused(tmp_path, {"device": {"mygpu": H100}})
    air = {"inlet_c": 25.0, "r_c_per_w": 0.07, "tau_s": 45.0}
    msg = _refused(tmp_path, {"thermal": {"air": {**air, "tau": 30.0}}, "devices": {}})
    assert "thermal 'air': unknown key 'tau' (did you mean tau_s?)" in msg
    msg = _refused(tmp_path, {"devices": {"mygpu": {**H100, "thermal": {**air, "inlet": 20}}}})
    assert "device 'mygpu' thermal: unknown key 'inlet' (did you mean inlet_c?)" in msg
    # no close spelling: the known keys are listed
    assert "unknown key 'zzz' (known: aliases, compute_units, cooling" in _refused(tmp_path, {"devices": {"g": {**H100, "zzz": 1}}})


def test_note_and_source_document_any_entry(tmp_path) -> None:
    air = {"inlet_c": 21.0, "r_c_per_w": 0.07, "tau_s": 45.0, "note": "lab", "source": "measured"}
    cat = _load(tmp_path, {"thermal": {"air": air}, "devices": {
        "mygpu": {**H100, "note": "n", "source": "s", "node": {**H100["node"], "note": "n", "source": "s"},
                  "thermal": {**air, "inlet_c": 22.0}},
        "aircooled": H100}})
    assert cat["mygpu"].thermal.inlet_c == 22.0 and cat["aircooled"].thermal.inlet_c == 21.0
    assert cat["mygpu"].source == "s" and cat["mygpu"].node.source == "s"


def test_peak_precisions_read_in_any_case_and_others_are_refused(tmp_path) -> None:
    cat = _load(tmp_path, {"devices": {"mygpu": {**H100, "peak_tflops": {"FP32": 60, "BF16": 900, "Fp8": 1800}}}})
    dev = cat["mygpu"]
    assert dev.peak("bf16") == 900e12 and dev.peak("fp8") == 1800e12 and dev.peak("fp32") == 60e12
    for bad in ("int8", "fp6"):
        msg = _refused(tmp_path, {"devices": {"mygpu": {**H100, "peak_tflops": {"fp32": 60, bad: 1800}}}})
        assert f"peak_tflops '{bad}' is not a precision" in msg and "fp32, tf32, fp16, bf16, fp8, fp4" in msg
    msg = _refused(tmp_path, {"devices": {"mygpu": {**H100, "peak_tflops": {"bf16": 900, "BF16": 800}}}})
    assert "peak_tflops gives bf16 twice" in msg
    msg = _refused(tmp_path, {"devices": {"mygpu": {**H100, "peak_tflops": {"bf16": "fast"}}}})
    assert "'fast' is not a number of TFLOP/s" in msg


def test_a_cooling_without_a_thermal_entry_is_refused(tmp_path) -> None:
    msg = _refused(tmp_path, {"devices": {"mygpu": {**H100, "cooling": "water"}}})
    assert "cooling 'water' has no thermal entry (known: air, immersion, liquid)" in msg
    own = {"inlet_c": 18.0, "r_c_per_w": 0.02, "tau_s": 10.0}
    assert _load(tmp_path, {"devices": {"mygpu": {**H100, "cooling": "water", "thermal": own}}})["mygpu"].thermal.inlet_c == 18


def test_the_audit_typo_catalog_is_refused_on_its_first_typo(tmp_path) -> None:
    node = {"devices_per_node": 8, "intra_node_bw_gb_s": 450, "nic_count": 8, "nic_gbit_s": 400, "nvlink_domain_size": 72}
    raw = {"devices": {"mygpu": {"vendor": "nvidia", "peak_tflops": {"fp32": 60, "bf16": 900}, "memory_gb": 80,
                                 "memory_bw_gb_s": 3000, "tdp_w": 700, "idle_watts": 90, "node": node}}}
    assert "unknown key 'idle_watts' (did you mean idle_w?)" in _refused(tmp_path, raw)
    del raw["devices"]["mygpu"]["idle_watts"]
    assert "unknown key 'nvlink_domain_size'" in _refused(tmp_path, raw)


# --- calibrate --params (A9) ----------------------------------------------------------------------------

BASE = load_calibration("default")
# a truth the default fit can represent: a slower 16-bit GEMM and a larger per-layer overhead
TRUTH = BASE.with_coefficients(gemm_eff_16=0.6, layer_overhead_s=30e-6)


def _case(device: str = "h100-sxm", **kw: object) -> Case:
    base = Case(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256, seq_len=4096, tp=2, pp=1,
                dp=4, micro_batch=1, global_batch=64, device=get_device(device), devices_per_node=8)
    return replace(base, **kw)  # type: ignore[arg-type]


def _runs(layouts: list[dict], power: bool = False, **kw: object) -> list[MeasuredRun]:
    out = []
    for i, lay in enumerate(layouts):
        c = _case(**{**kw, **lay})
        m = predict(c, TRUTH).metrics
        out.append(MeasuredRun(f"r{i}", c, m["step_time_mean_s"], 0.9 * m["power_mean_w"] if power else None))
    return out


DENSE = [{"tp": 2, "dp": 4}, {"tp": 4, "dp": 2}, {"tp": 8, "dp": 1}, {"tp": 2, "dp": 4, "micro_batch": 2}]


@pytest.mark.parametrize(("coeff", "why"), [
    ("moe_layer_overhead_s", "no run here is MoE"),
    ("gemm_eff_fp8", "no run here is fp8"),
    ("comm_eff_inter", "no run here spans nodes"),
    ("mem_fragmentation", "it sets predicted memory, not step time"),
])
def test_a_coefficient_no_run_moves_is_refused(coeff, why) -> None:
    with pytest.raises(ValueError) as exc:
        fit_calibration(_runs(DENSE), name="x", params=["gemm_eff_16", coeff])
    assert str(exc.value) == f"--params {coeff}: {why}, so the fit cannot see it; drop it"


def test_more_names_than_runs_are_refused_not_truncated() -> None:
    with pytest.raises(ValueError, match=r"names 3 coefficients .* for 2 run\(s\).*name at most 2 or add runs"):
        fit_calibration(_runs(DENSE[:2]), name="x", params=["gemm_eff", "layer_overhead_s", "comm_eff_intra"])
    with pytest.raises(ValueError, match="gemm_eff_16 more than once"):
        fit_calibration(_runs(DENSE), name="x", params=["gemm_eff", "gemm_eff_16"])


@pytest.mark.parametrize(("device", "precision", "key"), [
    ("h100-sxm", "bf16", "gemm_eff_16"),
    ("h100-sxm", "fp32", "gemm_eff_fp32"),
    ("h100-sxm", "fp8", "gemm_lowp_scale"),  # a known generation: gemm_eff_16 × its ratio × gemm_lowp_scale
    ("b200", "fp4", "gemm_lowp_scale"),
    ("a100-sxm4-80gb", "fp8", "gemm_eff_16"),  # no fp8 units: the 16-bit rate and efficiency
])
def test_gemm_eff_means_the_coefficient_that_sets_the_runs_gemm_rate(device, precision, key) -> None:
    runs = _runs(DENSE[:3], device=device, precision=precision)
    fit = fit_calibration(runs, name="x", params=["gemm_eff"], allow_pinned=True)
    assert fit.error["fitted"] == [key]
    assert fit.error["step_time_mape"] < fit.error["step_time_mape_before"] or fit.error["step_time_mape_before"] < 1e-6


def test_gemm_eff_fp8_of_a_device_of_unknown_generation_is_its_own(tmp_path) -> None:
    cat = _load(tmp_path, {"devices": {"mygpu": {**H100, "aliases": []}}})  # a name precision.py does not know
    case = replace(_case(precision="fp8"), device=cat["mygpu"])
    run = MeasuredRun("r", case, 1.2 * predict(case, BASE).metrics["step_time_mean_s"])
    assert fit_calibration([run], name="x", params=["gemm_eff"]).error["fitted"] == ["gemm_eff_fp8"]


def test_the_default_fits_fp8_runs_through_gemm_lowp_scale_and_gemm_eff_fp8_is_refused() -> None:
    runs = _runs(DENSE[:3], precision="fp8")
    fit = fit_calibration(runs, name="x")
    # nothing left out but the step's fixed time, which these runs (no events) cannot measure either
    assert fit.error["fitted"][0] == "gemm_lowp_scale" and set(fit.error["not_fitted"]) == {"step_overhead_s"}
    assert "not measured either" in fit.error["not_fitted"]["step_overhead_s"]
    assert fit.error["step_time_mape"] < 0.01
    assert fit.coefficients.gemm_eff_fp8 == BASE.coefficients.gemm_eff_fp8  # not read, not touched
    with pytest.raises(ValueError) as exc:
        fit_calibration(runs, name="x", params=["gemm_eff_fp8"])
    assert str(exc.value) == ("--params gemm_eff_fp8: the fp8 runs here (h100-sxm) take their GEMM rate from "
                              "gemm_lowp_scale, not from it, so the fit cannot see it; fit gemm_lowp_scale "
                              "(or gemm_eff) instead")


def test_the_default_leaves_out_what_the_runs_cannot_see_and_says_so() -> None:
    h = get_device("h100-sxm")
    # one device per node and one NIC: no link inside a node to be efficient on
    solo = replace(h, name="solo", aliases=(), node=replace(h.node, devices_per_node=1, nvlink_domain=1, nic_count=1))
    runs = []
    for i, (mb, seq) in enumerate([(1, 4096), (2, 1024), (4, 512)]):
        c = replace(_case(), device=solo, tp=1, dp=4, devices_per_node=1, micro_batch=mb, seq_len=seq)
        runs.append(MeasuredRun(f"r{i}", c, predict(c, TRUTH).metrics["step_time_mean_s"]))
    fit = fit_calibration(runs, name="x")
    assert fit.error["fitted"] == ["gemm_eff_16", "layer_overhead_s"]
    assert set(fit.error["not_fitted"]) == {"comm_eff_intra", "step_overhead_s"}
    assert fit.coefficients.comm_eff_intra == BASE.coefficients.comm_eff_intra
    assert fit.coefficients.gemm_eff_16 == pytest.approx(0.6, rel=1e-3)
    one = fit_calibration(runs[:1], name="x")
    assert one.error["fitted"] == ["gemm_eff_16"] and "only 1 run(s)" in one.error["not_fitted"]["layer_overhead_s"]


def test_power_coefficients_need_measured_power_and_are_fitted_on_it() -> None:
    with pytest.raises(ValueError, match="--params power_compute: no run here has measured power"):
        fit_calibration(_runs(DENSE[:3]), name="x", params=["gemm_eff", "power_compute"])
    runs = _runs(DENSE[:3], power=True)
    fit = fit_calibration(runs, name="x", params=["gemm_eff", "power_compute"])
    assert fit.error["fitted"] == ["gemm_eff_16"] and fit.error["fitted_power"] == ["power_compute"]
    assert fit.coefficients.power_compute != BASE.coefficients.power_compute
    assert fit.coefficients.power_wait == BASE.coefficients.power_wait  # named alone: only it moves
    with pytest.raises(ValueError, match=r"--params psu_efficiency: no longer a coefficient \(power-supply efficiency"):
        fit_calibration(runs, name="x", params=["psu_efficiency"])


# --- the command line --------------------------------------------------------------------------------------

PROBE = {"matmul_flops": 1.5e11, "copy_bytes_per_s": 2.0e10, "threads": 1, "cores": 2, "method": "fixture"}


def _write_run(root, name: str, step_s: float) -> None:
    cfg = RunConfig(name=name, model="llama3-tiny", layout={}, knobs={"global_batch": 8, "micro_batch": 1},
                    hardware={"nodes": 1, "devices_per_node": 1, "device": "cpu"})
    rd = RunDir(root / name).create()
    rd.write({"kind": "run", "status": "ok", "name": name, "config": cfg.model_dump(mode="json"), "host_probe": PROBE})
    rows = [{"rank": 0, "kind": "step", "name": "step", "step": s, "t_start_ns": int(s * 10e9),
             "t_end_ns": int(s * 10e9 + step_s * 1e9), "window": "warmup" if s < 2 else "measured"} for s in range(6)]
    pq.write_table(pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA), rd.events_file(0))


def test_cli_refuses_what_the_runs_cannot_fit_in_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POWERTRAIN_PROFILES", str(tmp_path / "profiles"))
    for name, t in (("a", 1.0), ("b", 1.3)):
        _write_run(tmp_path, name, t)
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    runner = CliRunner()
    for params, says in (("gemm_eff,moe_layer_overhead_s", "--params moe_layer_overhead_s: no run here is MoE"),
                         ("gemm_eff,layer_overhead_s,step_overhead_s", "name at most 2 or add runs"),
                         (" , ", "--params names no coefficient")):
        res = runner.invoke(app, ["calibrate", *runs, "--name", "x", "--params", params])
        assert res.exit_code == 2, res.output
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and says in lines[0], res.output
    assert not list(tmp_path.glob("profiles/*"))  # nothing written


def test_a_user_files_cooling_entry_reaches_the_shipped_devices_of_that_cooling(tmp_path) -> None:
    """`thermal: air:` in a --hardware file changes every air-cooled device without its own thermal entry,
    shipped ones included (it used to reach only devices defined after it)."""
    from powertrain.hardware.catalog import load_catalog

    shipped = load_catalog()["h100-sxm"].thermal
    user = tmp_path / "site.yaml"
    user.write_text(yaml.safe_dump({"devices": {}, "thermal": {"air": {
        "inlet_c": shipped.inlet_c - 4, "r_c_per_w": shipped.r_c_per_w, "tau_s": shipped.tau_s}}}))
    assert load_catalog([user])["h100-sxm"].thermal.inlet_c == shipped.inlet_c - 4
    assert load_catalog([user])["gb200"].thermal == load_catalog()["gb200"].thermal  # liquid-cooled: unchanged
