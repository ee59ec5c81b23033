"""Model FLOPs: THE definition the analysis layer imports for MFU and HFU.

Conventions (those of Megatron-LM's ``num_floating_point_operations`` and of PaLM's MFU):

* a multiply-add is 2 FLOPs; backward costs twice forward, so training = 3 × forward;
* counted per token: every GEMM of every layer (attention Q/K/V/O projections with grouped-query
  K/V widths; the MLP with 2 matrices, or 3 when gated/SwiGLU; for MoE the ``top_k`` routed
  experts plus shared experts plus the router), the attention core ``QKᵀ`` and ``AV``
  (``4·s·h`` per token per layer forward, **full, non-causal** sequence as Megatron counts it), and
  the output (logit) layer ``2·h·V``; embeddings lookups, norms and elementwise work are not FLOPs;
* **model FLOPs** do not count recomputation; **hardware FLOPs** do: full recompute repeats every
  layer's forward (not the logit layer), selective repeats the attention core.

**LoRA fine-tuning** (a shape with ``lora_rank`` > 0; adapters from :mod:`powertrain.core.lora`) counts
the work its step must do, not 6·N: the frozen weights' GEMMs (projections, MLP, logit layer) run
forward and compute activation gradients only, ``2 ×`` their forward (no weight gradients); the
attention core stays ``3 ×`` (it has no weights); each adapter's two GEMMs ``2·r·(d_in + d_out)`` per
token run forward, activation- and weight-gradient passes, ``3 ×``. Full recomputation repeats the
adapters' forward too. So a LoRA run's MFU is the useful work of *its* step over the peak, about
two-thirds of what the same tokens would count under full training.

MFU = model FLOPs per second ÷ (devices × dense peak at the run's precision);
HFU = hardware FLOPs per second ÷ the same peak.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

from powertrain.core.lora import Lora, adapter_flops_per_token


class Shape(NamedTuple):
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    seq_len: int
    experts: int
    top_k: int
    moe_ffn: int
    shared_experts: int
    gated: bool
    # modern attention/MoE (0: the plain transformer's value): see predict.Case
    head_dim: int = 0
    shared_ffn: int = 0
    dense_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0
    # one vocab×hidden matrix serves as embedding and head (its logit GEMM still runs): fewer parameters
    tied_embeddings: bool = False
    # LoRA fine-tuning (core.lora): adapters of this rank on these targets, every base weight frozen; 0: none
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()


def shape_of(model: Any, seq_len: int | None = None, lora: Lora | None = None) -> Shape:
    """A Shape from a ModelConfig, a predict Case, or anything with the same attributes.

    ``lora``: LoRA adapters to cost (a ModelConfig holds none: a run's ``task`` says); otherwise the
    model's own ``lora_rank``/``lora_targets`` (a Case's), if any."""
    if type(model) is Shape and (seq_len is None or seq_len == model.seq_len):
        return model if lora is None else model._replace(lora_rank=lora.rank, lora_targets=tuple(lora.targets))
    gated = getattr(model, "gated", None)
    if gated is None:
        gated = getattr(model, "family", "llama") in ("llama", "mixtral")
    experts = int(getattr(model, "experts", 1) or 1)
    moe_ffn = int(getattr(model, "moe_ffn", 0) or 0) or (model.ffn if experts > 1 else 0)
    def extra(k: str) -> int:
        return int(getattr(model, k, 0) or 0)

    # a ModelConfig's MoE `ffn` is the expert's width, its dense layers' width `dense_ffn` (a Case: ffn, moe_ffn)
    ffn = int(getattr(model, "dense_ffn", 0) or 0) or model.ffn
    return Shape(model.layers, model.hidden, ffn, model.heads, model.kv_heads, model.vocab,
                 int(seq_len or model.seq_len), experts, int(getattr(model, "top_k", 1) or 1), moe_ffn,
                 int(getattr(model, "shared_experts", 0) or 0), bool(gated), extra("head_dim"), extra("shared_ffn"),
                 extra("dense_layers"), extra("q_lora_rank"), extra("kv_lora_rank"), extra("qk_rope_dim"),
                 extra("v_head_dim"), extra("mtp_layers"), bool(getattr(model, "tied_embeddings", False)),
                 lora.rank if lora else extra("lora_rank"),
                 tuple(lora.targets if lora else getattr(model, "lora_targets", ()) or ()))


class LayerFlops(NamedTuple):
    """Forward FLOPs per token of one transformer layer, split by how they run."""

    dense_gemm: float  # attention projections + dense MLP (+ shared experts, router)
    expert_gemm: float  # routed experts (top_k of them)
    attention: float  # QKᵀ and AV, full sequence


def _attention_params(s: Shape) -> tuple[float, float]:
    """(projection parameters per layer, per-token attention-core width) of a layer's attention:
    grouped-query with head width ``head_dim`` (default hidden/heads), or MLA (``kv_lora_rank`` > 0):
    query down/up (or direct) projection, K/V down-projection with the shared rotary key, K/V
    up-projection and output. The core width is ``heads·(qk + v)`` (``2h`` for plain attention)."""
    h = s.hidden
    hd = s.head_dim or h // s.heads
    if s.kv_lora_rank:
        rope, vd = s.qk_rope_dim, s.v_head_dim or hd
        qk = s.heads * (hd + rope)
        q = (h * s.q_lora_rank + s.q_lora_rank * qk) if s.q_lora_rank else h * qk
        kv = h * (s.kv_lora_rank + rope) + s.kv_lora_rank * s.heads * (hd + vd)
        return float(q + kv + s.heads * vd * h), float(qk + s.heads * vd)
    q = s.heads * hd
    kvw = s.kv_heads * hd
    return float(h * (2 * q + 2 * kvw)), float(2 * q)


def shared_width(s: Shape) -> int:
    """Total FFN width of an MoE layer's shared experts."""
    return s.shared_ffn or s.ffn * s.shared_experts


@lru_cache(maxsize=4096)
def layer_flops_per_token(s: Shape) -> LayerFlops:
    """Forward FLOPs per token of one (routed, for MoE) layer."""
    h = s.hidden
    attn_p, core_w = _attention_params(s)
    attn_proj = 2 * attn_p
    mats = 3 if s.gated else 2
    if s.experts > 1:
        dense = attn_proj + 2 * mats * h * shared_width(s) + 2 * h * s.experts
        expert: float = 2 * mats * h * s.moe_ffn * s.top_k
    else:
        dense = attn_proj + 2 * mats * h * s.ffn
        expert = 0.0
    return LayerFlops(float(dense), float(expert), float(2 * s.seq_len * core_w))


def _stack_flops(s: Shape, lf: LayerFlops) -> float:
    """Forward FLOPs per token of all layers: MoE models' leading dense layers have a dense MLP of
    width ``ffn``; each MTP module adds one more layer (its own logit layer is added by the caller)."""
    per = lf.dense_gemm + lf.expert_gemm + lf.attention
    if s.experts > 1 and s.dense_layers:
        mats = 3 if s.gated else 2
        dense_mlp = 2 * mats * s.hidden * s.ffn
        moe_mlp = 2 * mats * s.hidden * shared_width(s) + 2 * s.hidden * s.experts + lf.expert_gemm
        nd = min(s.dense_layers, s.layers)
        return s.layers * per + nd * (dense_mlp - moe_mlp) + s.mtp_layers * per
    return (s.layers + s.mtp_layers) * per


def logit_flops_per_token(s: Shape) -> float:
    return float(2 * s.hidden * s.vocab)


def _adapter_flops(s: Shape) -> float:
    """Forward FLOPs per token of the shape's LoRA adapters (0 without LoRA)."""
    return adapter_flops_per_token(s, Lora(s.lora_rank, s.lora_targets)) if s.lora_rank else 0.0


def model_flops_per_token(model: Any, seq_len: int | None = None) -> float:
    """Training model FLOPs per token (forward + backward, no recomputation); LoRA as the module docstring says."""
    s = shape_of(model, seq_len)
    lf = layer_flops_per_token(s)
    stack, logits = _stack_flops(s, lf), (1 + s.mtp_layers) * logit_flops_per_token(s)
    if not s.lora_rank:
        return 3.0 * (stack + logits)
    attention = (s.layers + s.mtp_layers) * lf.attention
    return 2.0 * (stack - attention + logits) + 3.0 * attention + 3.0 * _adapter_flops(s)


def model_flops_per_step(model: Any, global_batch: int, seq_len: int | None = None) -> float:
    """Model FLOPs of one optimizer step of ``global_batch`` sequences."""
    s = shape_of(model, seq_len)
    return model_flops_per_token(model, s.seq_len) * global_batch * s.seq_len


def recompute_flops_per_token(model: Any, recompute: str, seq_len: int | None = None) -> float:
    """Extra forward FLOPs per token that recomputation adds (full: every layer; selective: attention core)."""
    s = shape_of(model, seq_len)
    lf = layer_flops_per_token(s)
    if recompute == "full":
        return _stack_flops(s, lf) + _adapter_flops(s)
    if recompute == "selective":
        return s.layers * lf.attention
    if recompute in ("none", None):
        return 0.0
    raise ValueError(f"recompute must be none, selective or full, not {recompute!r}")


def hardware_flops_per_token(model: Any, recompute: str = "none", seq_len: int | None = None) -> float:
    """Training FLOPs per token actually executed, recomputation included."""
    return model_flops_per_token(model, seq_len) + recompute_flops_per_token(model, recompute, seq_len)


def hardware_flops_per_step(model: Any, global_batch: int, recompute: str = "none",
                            seq_len: int | None = None) -> float:
    s = shape_of(model, seq_len)
    return hardware_flops_per_token(model, recompute, s.seq_len) * global_batch * s.seq_len


def parameter_counts(model: Any) -> dict[str, float]:
    """Parameters by part: ``attention``, ``mlp`` (dense/shared), ``experts`` (all routed), ``router``,
    ``norms`` (all per model, summed over layers) and ``embedding``/``head``."""
    tied = bool(getattr(model, "tied_embeddings", False))
    return dict(_parameter_counts(shape_of(model), tied))


@lru_cache(maxsize=4096)
def _parameter_counts(s: Shape, tied: bool) -> tuple[tuple[str, float], ...]:
    h = s.hidden
    mats = 3 if s.gated else 2
    attn, _ = _attention_params(s)
    n_all = s.layers + s.mtp_layers
    if s.experts > 1:
        nd = min(s.dense_layers, s.layers)
        n_moe = n_all - nd
        mlp = n_moe * mats * h * shared_width(s) + nd * mats * h * s.ffn
        experts = n_moe * mats * h * s.moe_ffn * s.experts
        router = n_moe * h * s.experts
    else:
        mlp, experts, router = n_all * mats * h * s.ffn, 0, 0
    return (
        ("attention", float(n_all * attn)), ("mlp", float(mlp)),
        ("experts", float(experts)), ("router", float(router)),
        ("norms", float(s.layers * 2 * h + h)), ("embedding", float(s.vocab * h)),
        ("head", 0.0 if tied else float(s.vocab * h)),
    )


def active_parameters(model: Any) -> float:
    """Parameters a token touches (routed experts counted top_k times)."""
    s = shape_of(model)
    p = parameter_counts(model)
    act_experts = p["experts"] * s.top_k / s.experts if s.experts > 1 else 0.0
    return p["attention"] + p["mlp"] + act_experts + p["router"] + p["norms"] + p["embedding"] + p["head"]
