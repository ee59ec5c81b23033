"""Model FLOPs of a training step and the peak FLOP/s they are measured against (MFU, HFU).

**Model FLOPs per token** (training: forward + backward = 3 × forward), following the PaLM
appendix convention used by Megatron/torchtitan MFU:

    6 · (N_layers_active + hidden · vocab) + 12 · layers · hidden · seq_len

where ``N_layers_active`` counts the weights a token touches in the transformer blocks — attention
``2·h² + 2·h·kv_heads·head_dim`` and the MLP (GELU: ``2·h·ffn``; SwiGLU: ``3·h·ffn``; MoE:
``top_k · 3·h·ffn + h·experts`` for the router) — the LM head adds ``h · vocab`` and the attention
score/value products add ``12 · L · h · s`` (full, not causal-halved, as in PaLM). Embedding lookups
are not FLOPs. **Hardware FLOPs** add what recomputation repeats: ``full`` one more forward of the
blocks (``2·N_layers_active + 4·L·h·s`` per token), ``selective`` the attention core only
(``4·L·h·s``).

Model FLOPs come from ``powertrain.predict.flops`` when that module is installed (one source of
truth with the predictor); until then from :func:`_model_flops_per_token_local`, which implements the
formula above. ``flops_source`` in a summary says which.

**Peak FLOP/s per device** comes from the hardware catalog (``powertrain.hardware``) for the run's
device type and precision. For CPUs there is no honest data-sheet number for "this container's
share of a host", so it is *measured*: a short float32 matmul probe on the analysing host (best of
several 1024×1024 products), divided among the ranks that share the host, and labelled
``"measured peak (probe)"``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from powertrain.spec.model import ModelConfig, get_model

_PROBE_CACHE: dict[str, float] = {}


def _layer_params_active(m: ModelConfig) -> float:
    h = m.hidden
    attn = 2 * h * h + 2 * h * m.kv_heads * m.head_dim
    if m.family == "gpt":
        mlp = 2 * h * m.ffn
    elif m.is_moe:
        mlp = m.top_k * 3 * h * m.ffn + h * m.experts
    else:
        mlp = 3 * h * m.ffn
    return float(attn + mlp)


def _model_flops_per_token_local(m: ModelConfig) -> float:
    """Training model FLOPs per token (see module docstring)."""
    n = m.layers * _layer_params_active(m) + m.hidden * m.vocab
    return 6.0 * n + 12.0 * m.layers * m.hidden * m.seq_len


def _recompute_flops_per_token(m: ModelConfig, recompute: str) -> float:
    attn_core = 4.0 * m.layers * m.hidden * m.seq_len
    if recompute == "full":
        return 2.0 * m.layers * _layer_params_active(m) + attn_core
    if recompute == "selective":
        return attn_core
    return 0.0


def model_flops_per_token(model: Any) -> tuple[float, str]:
    """(training FLOPs per token, source) for a model name, dict or ModelConfig."""
    m = get_model(model)
    try:
        from powertrain.predict import flops as pf  # the predictor's definition, when present

        value = float(pf.model_flops_per_token(m))
        return value, "powertrain.predict.flops.model_flops_per_token"
    except (ImportError, AttributeError, TypeError):
        return _model_flops_per_token_local(m), "powertrain.analyze.work._model_flops_per_token_local"


def hardware_flops_per_token(model: Any, recompute: str) -> float:
    """Training FLOPs per token including what recomputation repeats (predictor's definition if present)."""
    m = get_model(model)
    try:
        from powertrain.predict import flops as pf

        return float(pf.hardware_flops_per_token(m, recompute))
    except (ImportError, AttributeError, TypeError):
        return _model_flops_per_token_local(m) + _recompute_flops_per_token(m, recompute)


def cpu_probe_peak_flops(n: int = 1024, repeats: int = 5) -> float:
    """Measured float32 matmul FLOP/s of this host (all cores numpy's BLAS uses), best of ``repeats``."""
    key = f"{n}x{repeats}"
    if key in _PROBE_CACHE:
        return _PROBE_CACHE[key]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm the BLAS threads and caches
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    _PROBE_CACHE[key] = 2.0 * n**3 / best
    return _PROBE_CACHE[key]


def peak_flops_per_device(device: str | None, precision: str, ranks_per_host: int = 1) -> tuple[float | None, str]:
    """(peak FLOP/s of one device, where the number comes from) — ``None`` with the reason if unknown."""
    if not device:
        return None, "the run's configuration names no device type"
    try:
        import powertrain.hardware as hw  # the hardware catalog (one source of truth)
    except ImportError:
        hw = None  # type: ignore[assignment]
    if device.lower() == "cpu":
        share = max(ranks_per_host, 1)
        if hw is not None:
            peak = hw.get_device("cpu").peak(precision) / share
        else:
            peak = cpu_probe_peak_flops() / share
        return peak, f"measured peak (probe): fp32 matmul on the analysing host, shared by {share} ranks"
    if hw is None:
        return None, f"no hardware catalog installed to look up the peak FLOP/s of {device!r}"
    try:
        spec = hw.get_device(device)
        return float(spec.peak(precision)), f"hardware catalog: {spec.name} {precision} dense peak"
    except KeyError as exc:
        return None, f"hardware catalog: {exc.args[0] if exc.args else exc}"


def peak_link_bw(device: str | None) -> float | None:
    """Peak intra-node link bandwidth (bytes/s per device per direction) from the hardware catalog."""
    if not device or device.lower() == "cpu":
        return None
    try:
        import powertrain.hardware as hw

        return float(hw.get_device(device).node.intra_node_bw)
    except (ImportError, KeyError, AttributeError):
        return None
