"""LoRA adapters: the target vocabulary, and each adapter's shape, parameters and FLOPs.

LoRA (Hu et al. 2021) leaves a linear layer's weight ``W`` (``d_out × d_in``) frozen and trains a
low-rank update beside it: ``y = W x + (α/r)·B A x`` with ``A`` (``r × d_in``) and ``B``
(``d_out × r``). Targets name a layer's linear maps model-neutrally, with the Hugging Face / PEFT
names: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (attention), ``gate_proj``, ``up_proj``,
``down_proj`` (MLP; a GELU MLP has no gate), and ``qkv_proj``, one adapter on the *fused* Q/K/V
projection (Megatron-Core's ``linear_qkv``, the MLPerf Llama-2-70B reference's ``qkv_proj``), whose
``A`` the three share and whose ``B`` has the fused width ``(heads + 2·kv_heads)·head_dim``.

MLP targets of an MoE layer adapt every expert's matrix (one adapter per expert, ``top_k`` of them
per token) and the shared experts'; attention targets need plain (not MLA) attention.

This module is part of ``core``: it reads a shape by attribute (``powertrain.core.flops.Shape``, a
``ModelConfig`` or a predict ``Case``) and imports nothing of powertrain, so ``flops`` can use it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION_TARGETS + MLP_TARGETS
# base layers tensor parallelism splits by rows of the weight (their input): the rest split their output
ROW_PARALLEL = frozenset({"o_proj", "down_proj"})
# The MLPerf Llama-2-70B LoRA reference (mlcommons/training llama2_70b_lora: --lora_r 16 --lora_alpha 32
# --lora_target_modules "qkv_proj,o_proj" on a fused-QKV checkpoint), which NVIDIA's and AMD's NeMo
# recipes reproduce with linear_qkv and linear_proj adapters.
MLPERF_RANK, MLPERF_ALPHA, MLPERF_TARGETS = 16, 32.0, ("qkv_proj", "o_proj")


class Lora(NamedTuple):
    """A LoRA configuration as the cost formulas need it (the scale α/r changes no cost)."""

    rank: int
    targets: tuple[str, ...]


class Adapter(NamedTuple):
    """One adapter of a layer: its base map's sizes and how a token reaches it."""

    target: str
    d_in: int
    d_out: int
    row_parallel: bool  # its base layer is split over TP by input rows (o_proj, down_proj)
    routed: bool  # an expert's matrix: ``copies`` adapters, ``top_k`` of them per token
    copies: int  # adapters of this kind in the layer (experts for a routed matrix, else 1)
    per_token: int  # adapters a token passes through (top_k for a routed matrix, else 1)


def _dim(s: Any, name: str) -> int:
    return int(getattr(s, name, 0) or 0)


def check_targets(targets: tuple[str, ...] | list[str]) -> None:
    """Raise ``ValueError`` naming the fix for an empty list, an unknown name, a repeat, or ``qkv_proj``
    together with one of ``q_proj``/``k_proj``/``v_proj`` (the fused adapter already covers them)."""
    if not targets:
        raise ValueError(f"LoRA targets are empty: list at least one of {', '.join(TARGETS)}")
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"unknown LoRA target {', '.join(map(repr, unknown))}: use {', '.join(TARGETS)}")
    if len(set(targets)) != len(targets):
        raise ValueError(f"LoRA targets {list(targets)} name a layer twice: list each once")
    split = [t for t in ("q_proj", "k_proj", "v_proj") if t in targets]
    if "qkv_proj" in targets and split:
        raise ValueError(f"qkv_proj (one adapter on the fused Q/K/V projection) overlaps {', '.join(split)}: "
                         "use qkv_proj alone, or q_proj/k_proj/v_proj without it")


def layer_adapters(s: Any, targets: tuple[str, ...], moe_layer: bool = False) -> list[Adapter]:
    """The adapters ``targets`` put in one layer of shape ``s`` (``moe_layer``: a routed-MLP layer of an
    MoE model; otherwise the MLP is dense, width ``ffn``)."""
    h, heads, kv = _dim(s, "hidden"), _dim(s, "heads"), _dim(s, "kv_heads")
    hd = _dim(s, "head_dim") or h // max(1, heads)
    if _dim(s, "kv_lora_rank") and any(t in ATTENTION_TARGETS for t in targets):
        raise ValueError("LoRA attention targets name plain Q/K/V/O projections; this model's attention is MLA "
                         "(kv_lora_rank set): target the MLP only (gate_proj, up_proj, down_proj)")
    attn = {"q_proj": (h, heads * hd), "k_proj": (h, kv * hd), "v_proj": (h, kv * hd),
            "qkv_proj": (h, (heads + 2 * kv) * hd), "o_proj": (heads * hd, h)}
    gated = bool(getattr(s, "gated", True))
    out: list[Adapter] = []
    for t in targets:
        if t in attn:
            d_in, d_out = attn[t]
            out.append(Adapter(t, d_in, d_out, t in ROW_PARALLEL, False, 1, 1))
            continue
        if t == "gate_proj" and not gated:
            continue  # a GELU MLP has no gate; spec.validate refuses naming it for such a model
        widths: list[tuple[int, bool, int, int]] = []  # (width, routed, copies, per token)
        if moe_layer:
            widths.append((_dim(s, "moe_ffn") or _dim(s, "ffn"), True, _dim(s, "experts"), _dim(s, "top_k") or 1))
            shared = _dim(s, "shared_ffn") or _dim(s, "ffn") * _dim(s, "shared_experts")
            if shared:
                widths.append((shared, False, 1, 1))
        else:
            widths.append((_dim(s, "ffn"), False, 1, 1))
        for f, routed, copies, per_token in widths:
            d_in, d_out = (f, h) if t == "down_proj" else (h, f)
            out.append(Adapter(t, d_in, d_out, t in ROW_PARALLEL, routed, copies, per_token))
    return out


def _layer_counts(s: Any) -> tuple[int, int]:
    """(dense-MLP layers, routed-MLP layers) of the model, multi-token-prediction modules included."""
    n_all = _dim(s, "layers") + _dim(s, "mtp_layers")
    if _dim(s, "experts") > 1:
        nd = min(_dim(s, "dense_layers"), _dim(s, "layers"))
        return nd, n_all - nd
    return n_all, 0


def adapter_parameters(s: Any, lora: Lora) -> dict[str, float]:
    """Adapter parameters of the whole model: ``dense`` (attention, dense and shared MLPs) and
    ``experts`` (the routed experts' adapters), each ``r·(d_in + d_out)`` per adapter."""
    out = {"dense": 0.0, "experts": 0.0}
    for n, moe_layer in zip(_layer_counts(s), (False, True), strict=True):
        if not n:
            continue
        for a in layer_adapters(s, lora.targets, moe_layer):
            out["experts" if a.routed else "dense"] += n * a.copies * lora.rank * (a.d_in + a.d_out)
    return out


def layer_adapter_parameters(s: Any, lora: Lora, moe_layer: bool = False) -> tuple[float, float]:
    """(dense, routed-expert) adapter parameters of one layer, whole (before any sharding)."""
    dense = expert = 0.0
    for a in layer_adapters(s, lora.targets, moe_layer):
        n = a.copies * lora.rank * (a.d_in + a.d_out)
        if a.routed:
            expert += n
        else:
            dense += n
    return dense, expert


def adapter_flops_per_token(s: Any, lora: Lora) -> float:
    """Forward FLOPs per token of every adapter of the model: ``2·r·(d_in + d_out)`` per adapter a token
    passes through (``A x`` then ``B (A x)``); the scale-and-add is elementwise, not counted."""
    total = 0.0
    for n, moe_layer in zip(_layer_counts(s), (False, True), strict=True):
        if not n:
            continue
        for a in layer_adapters(s, lora.targets, moe_layer):
            total += n * a.per_token * 2 * lora.rank * (a.d_in + a.d_out)
    return total


def smallest_dimension(s: Any, targets: tuple[str, ...]) -> tuple[int, str]:
    """(the smallest ``d_in`` or ``d_out`` among the targeted maps, the target it belongs to): a rank above
    it is no longer low-rank (LoRA's update would have more parameters than the full matrix's rank allows)."""
    best: tuple[int, str] | None = None
    for moe_layer in (False, True) if _dim(s, "experts") > 1 else (False,):
        for a in layer_adapters(s, targets, moe_layer):
            d = min(a.d_in, a.d_out)
            if best is None or d < best[0]:
                best = (d, a.target)
    return best if best is not None else (0, "")
