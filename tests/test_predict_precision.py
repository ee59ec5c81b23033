"""GEMM efficiency by generation, precision and recipe (predict/precision.py)."""

from __future__ import annotations

from dataclasses import replace

from powertrain.hardware import get_device
from powertrain.predict import Case
from powertrain.predict.calibration import Coefficients
from powertrain.predict.precision import generation, recipe_from_text, relative_efficiency
from powertrain.predict.steptime import compute_rates

C = Coefficients()


def _case(dev: str, precision: str, recipe: str = "") -> Case:
    return Case(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=32000, seq_len=4096,
                device=get_device(dev), precision=precision, recipe=recipe, devices_per_node=8)


def test_fp8_over_bf16_depends_on_the_generation() -> None:
    def ratio(dev: str) -> float:
        return compute_rates(_case(dev, "fp8"), C).peak / compute_rates(_case(dev, "bf16"), C).peak

    # Blackwell's tensor cores scale blocks natively: fp8 keeps more of its 2x than Hopper's
    assert 1.7 < ratio("h100-sxm") < ratio("b200") <= 2.0
    assert ratio("a100-sxm4-80gb") == 1.0  # no fp8 units: the 16-bit rate


def test_blockwise_fp8_is_slower_on_hopper_only() -> None:
    assert relative_efficiency("h100-sxm", "fp8", "blockwise") < relative_efficiency("h100-sxm", "fp8", "delayed")
    assert relative_efficiency("b200", "fp8", "blockwise") == relative_efficiency("b200", "fp8", "mxfp8")


def test_current_scaling_pays_an_extra_pass() -> None:
    cur = compute_rates(_case("h100-sxm", "fp8", "current"), C)
    dly = compute_rates(_case("h100-sxm", "fp8", "delayed"), C)
    assert cur.q > dly.q > 0
    assert compute_rates(_case("h100-sxm", "bf16"), C).q == 0


def test_16bit_efficiency_differs_by_generation() -> None:
    a100 = compute_rates(_case("a100-sxm4-80gb", "bf16"), C).peak / get_device("a100-sxm4-80gb").peak("bf16")
    h100 = compute_rates(_case("h100-sxm", "bf16"), C).peak / get_device("h100-sxm").peak("bf16")
    b200 = compute_rates(_case("b200", "bf16"), C).peak / get_device("b200").peak("bf16")
    assert a100 > h100 > b200


def test_flashattention2_is_slower_than_fused_attention_from_hopper_on_only() -> None:
    import pytest

    from powertrain.core.flops import layer_flops_per_token, shape_of
    from powertrain.predict.precision import attention_kernel_ratio
    from powertrain.predict.steptime import attention_core_time, tokens_per_micro_batch

    def attn(dev: str, kernel: str) -> float:
        case = replace(_case(dev, "bf16"), attention_kernel=kernel)
        lf = layer_flops_per_token(shape_of(case))
        return attention_core_time(case, C, compute_rates(case, C), lf, tokens_per_micro_batch(case))

    # FA3/cuDNN use Hopper's wgmma/TMA paths, FA2 does not (FlashAttention-3 paper: 1.5-2x)
    assert attn("h100-sxm", "flash2") == pytest.approx(attn("h100-sxm", "fused") / 0.6)
    assert attn("b200", "flash2") > attn("b200", "fused")
    assert attn("a100-sxm4-80gb", "flash2") == attn("a100-sxm4-80gb", "fused")  # FA2 is Ampere's fused kernel
    with pytest.raises(ValueError, match="not one of"):
        attention_kernel_ratio("h100-sxm", "xformers")


def test_recipes_from_free_text() -> None:
    assert recipe_from_text("fp8-cs") == "current"
    assert recipe_from_text("mxfp8 (32x32)") == "mxfp8"
    assert recipe_from_text("fp8-mx") == "mxfp8"
    assert recipe_from_text("fp8 (Transformer Engine, delayed scaling)") == "delayed"
    assert recipe_from_text("nvfp4") == "nvfp4"
    assert recipe_from_text("bf16") == ""
    # torchao's rowwise scaling, like its tensorwise one, scales by this step's amax
    assert recipe_from_text("fp8 rowwise (torchao)") == recipe_from_text("FP8 dynamic scaling") == "current"
    assert recipe_from_text("fp8 delayed scaling, dynamic loss scaling") == "delayed"
    # with the precision already read, only a recipe of that precision
    assert recipe_from_text("fp8 (Transformer Engine, tensorwise; config not '_fp4')", "fp8") == "current"
    assert recipe_from_text("fp4 (MXFP4)", "fp4") == "nvfp4" and recipe_from_text("bf16 (not fp8)", "bf16") == ""
    assert generation("gb300") == "blackwell_ultra" and generation("no-such") == "unknown"


def test_unknown_generation_keeps_the_calibrations_own_fp8_efficiency() -> None:
    dev = replace(get_device("h100-sxm"), name="my-accelerator")
    case = replace(_case("h100-sxm", "fp8"), device=dev)
    assert compute_rates(case, C).peak == dev.peak("fp8") * C.gemm_eff_fp8


def test_every_catalog_device_has_a_generation_and_every_generation_entry_a_device() -> None:
    # a device without a generation would silently take the "unknown" ratios (1.0); a name only here is stale
    from powertrain.hardware import load_catalog
    from powertrain.predict.precision import GENERATION

    catalog = load_catalog()
    assert sorted(set(catalog) - set(GENERATION)) == []
    assert sorted(set(GENERATION) - set(catalog)) == []


def test_a_spec_plans_fp8_with_its_recipe() -> None:
    # a spec states fp8 and its recipe for the predictor (the built-in trainer refuses fp8 by rule)
    from powertrain.predict import case_from_run_config, predict
    from powertrain.spec.run import RunConfig
    from powertrain.spec.validate import layout_violations

    def cfg(**knobs: object) -> RunConfig:
        return RunConfig(model="llama3-70b", layout={"tp": 4, "pp": 2}, knobs={"global_batch": 64, **knobs},
                         hardware={"devices_per_node": 8, "device": "h100"})

    bf16, fp8, blockwise = cfg(precision="bf16"), cfg(precision="fp8"), cfg(precision="fp8", fp8_recipe="blockwise")
    assert case_from_run_config(blockwise).recipe == "blockwise" and case_from_run_config(fp8).recipe == ""
    assert layout_violations(fp8) == []
    t = {name: predict(c).metrics["tokens_per_s"] for name, c in (("bf16", bf16), ("fp8", fp8), ("bw", blockwise))}
    assert t["bf16"] < t["bw"] < t["fp8"]  # Hopper: blockwise fp8 runs below delayed scaling, above bf16


def test_a_spec_states_fp16_for_predictions() -> None:
    # V100-era runs are fp16: a spec says so, predicted at the 16-bit tensor-core rate (refused by the trainer)
    from powertrain.predict import predict
    from powertrain.spec.run import RunConfig
    from powertrain.spec.validate import validate

    def cfg(prec: str) -> RunConfig:
        return RunConfig(model="gpt3-175b", layout={"tp": 8, "pp": 2}, knobs={"global_batch": 64, "precision": prec},
                         hardware={"nodes": 2, "devices_per_node": 8, "device": "v100"})

    assert "low_precision_unsupported" in {v.rule for v in validate(cfg("fp16"))}
    fp16, fp32 = (predict(cfg(p)).metrics["tokens_per_s"] for p in ("fp16", "fp32"))
    assert fp16 > 2 * fp32
