"""GEMM efficiency by architecture generation, precision and low-precision recipe.

Large-GEMM efficiency (achieved ÷ dense data-sheet peak) is not one number per precision: it
depends on the generation's tensor cores and on how the recipe scales its operands. The table
below holds, per generation, each precision's efficiency *relative to the same generation's 16-bit
GEMMs*, from published GEMM benchmarks; a calibration's ``gemm_eff_16`` sets the 16-bit level and
``gemm_eff_fp8`` / ``gemm_eff_fp4`` scale the low-precision ones around these ratios (1.0 = the
literature ratio), so fitting never replaces the generation structure by one global ratio.

Sources (large square-ish GEMMs, cuBLAS/cuBLASLt/hipBLASLt, 2023–2025):

* Hopper (H100/H200): bf16 ≈ 750–800 of 989 TFLOP/s; fp8 with per-tensor scaling ≈ 1,450–1,550 of
  1,979 — fp8 reaches about 0.95 of bf16's *fraction* of peak (cuBLAS 12.x GEMM benchmarks, NVIDIA
  Transformer Engine docs, Colfax/DeepGEMM reports). Blockwise (1×128 / 128×128) scaling has no
  tensor-core support on Hopper: the scales are applied on CUDA cores (DeepSeek-V3 report §3.3;
  DeepGEMM), ≈ 0.8 of bf16's fraction.
* Blackwell (B200/GB200) and Blackwell Ultra (B300/GB300): tensor cores apply MX block scales
  natively, so fp8, mxfp8 and bf16 reach about the same fraction of their peaks; nvfp4 ≈ 0.9 of
  bf16's fraction (NVIDIA Blackwell architecture brief; cuBLAS 12.8/12.9 release notes).
  These ratios are approximate (±10 %): the calibration's ``gemm_lowp_scale`` may move them together
  within ±25 %.
* 16-bit itself differs by generation (:func:`sixteen_bit_ratio`): older, smaller tensor cores are
  easier to keep fed (A100 reaches a larger fraction of its peak than H100, H100 than B200).
* Ampere (A100) and Volta (V100): 16-bit only (fp8 runs at the 16-bit rate through the
  catalog's fallback).
* CDNA3 (MI300X): fp8 ≈ 0.85 of bf16's fraction (hipBLASLt benchmarks, AMD ROCm docs).

Recipes also add memory traffic the GEMM does not see: writing the quantised copy of each input,
and current scaling's extra amax pass over the input (delayed scaling reuses the previous step's
amax). :func:`quantize_bytes_per_value` returns those bytes per GEMM input value.
"""

from __future__ import annotations

# Generation of each catalog device (name → generation). Unknown devices use "unknown" (ratios 1.0).
GENERATION = {
    "v100-sxm2-32gb": "volta", "v100-sxm2-16gb": "volta", "a100-sxm4-40gb": "ampere", "a100-sxm4-80gb": "ampere", "a40": "ampere",
    "h100-sxm": "hopper", "h100-sxm-96gb": "hopper", "h100-pcie": "hopper", "h200": "hopper", "gh200": "hopper",
    "b200": "blackwell", "gb200": "blackwell", "b300": "blackwell_ultra", "gb300": "blackwell_ultra",
    "a100-pcie-80gb": "ampere", "a100-pcie-40gb": "ampere", "a800-sxm4-80gb": "ampere",
    "h100-nvl": "hopper", "h200-nvl": "hopper", "h800": "hopper", "h20": "hopper",
    "l40s": "ada",  # no ratios known for Ada Lovelace: 1.0, as for an unknown generation (catalog note)
    "v100-pcie-32gb": "volta", "p100-pcie-16gb": "pascal", "quadro-rtx-6000": "turing",
    "mi250x": "cdna2", "mi300x": "cdna3", "mi325x": "cdna3", "mi350x": "cdna4", "mi355x": "cdna4",
}

# Per generation: efficiency of each precision/recipe relative to the generation's 16-bit GEMMs.
RATIO: dict[str, dict[str, float]] = {
    "volta": {"16": 1.10}, "ampere": {"16": 1.14},
    "hopper": {"16": 1.0, "fp8:delayed": 0.96, "fp8:current": 0.96, "fp8:blockwise": 0.80, "fp8:mxfp8": 0.80},
    "blackwell": {"16": 0.94, "fp8:delayed": 1.0, "fp8:current": 1.0, "fp8:blockwise": 1.0, "fp8:mxfp8": 1.0,
                  "fp4:nvfp4": 0.90},
    "blackwell_ultra": {"16": 0.94, "attn": 1.3, "fp8:delayed": 1.0, "fp8:current": 1.0, "fp8:blockwise": 1.0,
                        "fp8:mxfp8": 1.0, "fp4:nvfp4": 0.90},
    "cdna3": {"fp8:delayed": 0.85, "fp8:current": 0.85},
    "cdna4": {"fp8:delayed": 0.90, "fp8:current": 0.90, "fp4:nvfp4": 0.80},
}

# The recipe a precision uses when a run does not name one, per generation.
DEFAULT_RECIPE = {"fp8": {"blackwell": "mxfp8", "blackwell_ultra": "mxfp8"}, "fp4": {}}


def generation(device_name: str) -> str:
    return GENERATION.get(device_name, "unknown")


def recipe_of(precision: str, recipe: str, gen: str) -> str:
    """The recipe a run uses: its own, else the generation's usual one for the precision."""
    if precision == "fp4":
        return "nvfp4"
    if precision != "fp8":
        return ""
    return recipe or DEFAULT_RECIPE["fp8"].get(gen, "delayed")


def sixteen_bit_ratio(device_name: str) -> float:
    """16-bit large-GEMM efficiency of the device's generation ÷ Hopper's (the calibration's reference).

    cuBLAS large bf16/fp16 GEMMs: V100 ≈ 105 of 125 TFLOP/s (0.84), A100 ≈ 270 of 312 (0.87),
    H100 SXM ≈ 750 of 989 (0.76), B200/GB200 ≈ 1,600-1,800 of 2,250-2,500 (0.71)."""
    return RATIO.get(generation(device_name), {}).get("16", 1.0)


def attention_ratio(device_name: str) -> float:
    """Fused-attention rate of the generation ÷ Hopper's, at equal 16-bit GEMM rate.

    Blackwell Ultra doubles the special-function (exp) throughput that bounds softmax in flash
    attention on Blackwell (NVIDIA Blackwell Ultra brief: "2x attention-layer acceleration"; FA4 notes
    the exp units as Blackwell's attention bottleneck): about 1.3x end to end, fwd + bwd."""
    return RATIO.get(generation(device_name), {}).get("attn", 1.0)


# FlashAttention-2's rate ÷ the fused (cuDNN / FlashAttention-3 class) kernel's, per generation, fwd + bwd.
# Hopper: FA2 uses none of Hopper's asynchronous tensor-core (wgmma) and TMA paths and reaches 35-40 % of
# peak; FA3 and cuDNN's fused attention reach 60-75 % — FA3 is 1.5-2.0x faster forward and 1.5-1.75x
# backward (Shah et al., "FlashAttention-3", NeurIPS 2024, §4.1) → about 1/1.65 = 0.6. Blackwell: FA2 runs
# the same pre-Hopper instruction path, so at least Hopper's gap is assumed (no published FA2 figure on
# B200 found). Ampere and Volta: FA2 is the fused kernel there (cuDNN's is no faster): 1.0.
FLASH2_RATIO = {"hopper": 0.6, "blackwell": 0.6, "blackwell_ultra": 0.6}
ATTENTION_KERNELS = ("fused", "flash2")


def attention_kernel_ratio(device_name: str, kernel: str) -> float:
    """Rate of the attention ``kernel`` on the device's generation ÷ the fused kernel's (1.0 for "fused")."""
    if kernel == "fused":
        return 1.0
    if kernel != "flash2":
        raise ValueError(f"attention kernel {kernel!r} is not one of {ATTENTION_KERNELS}")
    return FLASH2_RATIO.get(generation(device_name), 1.0)


def relative_efficiency(device_name: str, precision: str, recipe: str = "") -> float:
    """GEMM efficiency of ``precision``/``recipe`` on the device's generation ÷ its 16-bit efficiency."""
    if precision not in ("fp8", "fp4"):
        return 1.0
    gen = generation(device_name)
    rec = recipe_of(precision, recipe, gen)
    return RATIO.get(gen, {}).get(f"{precision}:{rec}", 1.0)


def quantize_bytes_per_value(precision: str, recipe: str) -> float:
    """HBM bytes per GEMM input value spent quantising it (0 for 16/32-bit GEMMs).

    Transformer Engine fuses the cast into the kernel that produced the input (norm, activation), so a
    recipe pays the write of the low-precision copy: 1 B (fp8) or 0.5 B + scales (fp4); current scaling
    reads the input once more for its amax (+2 B); MX/blockwise recipes also write the transposed copy
    the backward GEMM needs (+1 B; fp4: +0.5 B).
    """
    if precision == "fp8":
        return 1.0 + {"current": 2.0, "mxfp8": 1.0, "blockwise": 1.0}.get(recipe, 0.0)
    if precision == "fp4":
        return 1.0 + 0.1  # row- and column-wise 4-bit copies and their scales
    return 0.0


def recipe_from_text(text: str, precision: str | None = None) -> str:
    """A recipe name from free text ("fp8-cs", "mxfp8 (32x32)", "fp8 (Transformer Engine, delayed scaling)").

    Every block-scaled fp4 recipe (NVFP4, MXFP4) reads as ``nvfp4``: the tensor cores run both at the fp4 rate,
    and the ratios of ``RATIO`` are per precision and scaling kind, not per scale format.

    ``precision``, when the text's precision is already read, keeps the recipe to one that applies to it: an fp8
    run's remark that names fp4 ("fp8 (… config not '_fp4')") is not an fp4 recipe, and 16-bit runs have none.
    """
    t = (text or "").lower().replace(" ", "")
    if precision is not None and precision not in ("fp8", "fp4"):
        return ""
    if precision == "fp4" or (precision is None and ("nvfp4" in t or "fp4" in t)):
        return "nvfp4"
    if "mxfp8" in t or "fp8-mx" in t or ("mx" in t and "fp8" in t):
        return "mxfp8"
    if "block" in t or "fp8-bs" in t or "deepseek" in t:
        return "blockwise"
    # torchao's float8 (tensorwise, rowwise/axiswise) and dynamic scaling compute the scale from this step's amax
    # ("dynamic loss scaling" is fp16's, not a recipe: spaces are gone here, so it reads "dynamiclossscal")
    if any(w in t for w in ("fp8-cs", "current", "tensorwise", "float8", "rowwise", "row-wise", "axiswise",
                            "dynamicscal")):
        return "current"
    if "delayed" in t or "fp8" in t:
        return "delayed"
    return ""
