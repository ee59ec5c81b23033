"""Which training stack runs the configuration: the kernels its memory-bound work and optimizer use.

The engine is an input (DESIGN.md), never implied. Two are modelled:

* ``megatron`` — Megatron-Core / NeMo and stacks with its fused kernels (Transformer Engine norms and
  activations, fused Adam over fp32 master weights with 16-bit parameters, fused cross-entropy): the
  elementwise traffic of :func:`powertrain.predict.steptime.layer_memory`, 32 bytes of optimizer work per
  (sharded) parameter plus reading the gradients. What the published runs describe and what the
  shipped calibration is fitted on.
* ``builtin`` — powertrain's own trainer (src/powertrain/workload/), what ``powertrain run`` runs and
  what every RunConfig describes: eager PyTorch with fp32 master weights under bf16 autocast (every
  Linear casts its weight and input each pass), RoPE in fp32, repeated K/V heads, unfused SwiGLU and
  residuals, an fp32 cross-entropy, ``torch.optim.AdamW``'s multi-tensor step, and PyTorch's SDPA
  (FlashAttention-2 class). Its bytes are **counted, not fitted**: ``benchmarks/builtin_traffic.py`` runs
  the real models under a dispatch-level byte counter and writes the bytes per shape term to
  ``data/builtin_traffic.yaml`` (RMSNorm counted as CUDA's fused kernel); the test re-counts fresh
  shapes against the table.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from powertrain.core.yamlfile import load_yaml
from powertrain.predict.case import ENGINES, Case

__all__ = ["ENGINES", "builtin_head_bytes", "builtin_layer_bytes", "optimizer_bytes"]
TRAFFIC_FILE = Path(__file__).with_name("data") / "builtin_traffic.yaml"
MEGATRON_OPT_BYTES = 32.0  # fused Adam: read fp32 master, grad, m, v; write master, m, v and the 16-bit copy
GRAD_BYTES = 4.0  # reading each local fp32 gradient once more (unsharded)


@cache
def _table() -> dict[str, Any]:
    raw = load_yaml(TRAFFIC_FILE.read_text(), TRAFFIC_FILE) or {}
    fams = raw.get("families") or {}
    if not fams:
        raise ValueError(f"{TRAFFIC_FILE}: no families; rerun benchmarks/builtin_traffic.py --write")
    return fams


def _coefficients(case: Case) -> dict[str, Any]:
    fams = _table()
    family = "mixtral" if case.is_moe else ("llama" if case.gated else "gpt")
    prec = "fp32" if case.precision in ("fp32", "tf32") else "bf16"
    return fams[family][prec]


def _terms(case: Case, dense: bool = False) -> dict[str, float]:
    """One layer's (``dense``: an MoE model's dense layer) shape terms on one device, per micro-batch, with the
    tensor-parallel split: queries, keys/values, MLP widths and weights are split over TP; the hidden-width
    work (norms, input casts, residuals) only with sequence parallelism."""
    tp = case.tp
    n = case.micro_batch * case.seq_len / case.cp
    h = case.hidden
    hd = case.head_dim or h // case.heads
    hq, hkv = case.heads * hd, case.kv_heads * hd
    mats = 3 if case.gated else 2
    moe = case.is_moe and not dense
    f = case.expert_ffn if moe else case.ffn
    experts = case.experts / case.ep if moe else 1.0  # local experts
    params = (h * hq + 2 * h * hkv + hq * h) / tp + experts * mats * h * f / (case.expert_tp if moe else tp)
    out = {"nh": n * h / (tp if case.sequence_parallel else 1), "nhq": n * hq / tp, "nhkv": n * hkv / tp,
           "params": params}
    if moe:
        routed = n * case.top_k / (tp if case.sequence_parallel else 1)
        out.update(nkh=routed * h, nkf=routed * f / case.expert_tp,
                   expert_selects=experts * experts * mats * h * f / case.expert_tp)
    else:
        out["nf"] = n * f / tp
    return out


def builtin_layer_bytes(case: Case, dense: bool = False) -> tuple[float, float]:
    """(forward, backward) bytes of one layer's memory-bound work per micro-batch on one device, counted from
    the built-in trainer's ops (``data/builtin_traffic.yaml``)."""
    co = _coefficients(case)
    t = _terms(case, dense)
    fwd = sum(co["forward"].get(k, 0.0) * v for k, v in t.items())
    bwd = sum(co["backward"].get(k, 0.0) * v for k, v in t.items())
    if case.lora:  # frozen base weights: no weight-gradient casts
        bwd -= co["backward"].get("params", 0.0) * t["params"]
    return max(0.0, fwd), max(0.0, bwd)


def builtin_head_bytes(case: Case) -> tuple[float, float]:
    """(forward, backward) bytes of the model's ends (logits, loss, embedding and output weights, final norm)
    per micro-batch, on the last pipeline stage."""
    co = _coefficients(case)
    n = case.micro_batch * case.seq_len / case.cp
    terms = {"end_nV": n * case.vocab / case.tp, "end_Vh": case.vocab * case.hidden / case.tp,
             "end_nh": n * case.hidden / (case.tp if case.sequence_parallel else 1)}
    fwd = sum(co["forward"].get(k, 0.0) * v for k, v in terms.items())
    bwd = sum(co["backward"].get(k, 0.0) * v for k, v in terms.items())
    return max(0.0, fwd), max(0.0, bwd)


def optimizer_bytes(case: Case) -> tuple[float, float]:
    """(bytes per sharded parameter, bytes per local parameter) of the optimizer step on one device."""
    if case.engine == "builtin":
        return float(_coefficients(case)["optimizer_bytes_per_param"]), 0.0  # the count reads the gradients too
    return MEGATRON_OPT_BYTES, GRAD_BYTES
