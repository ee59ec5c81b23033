"""Step time: compute, memory-bound work, exposed communication and pipeline bubble.

Per layer and micro-batch on one device (tokens ``n = b·s/cp``):

* GEMMs: ``FLOPs / (peak[precision] · e[precision] · f(d))`` with the shape factor
  ``f(d) = d/(d + knee)`` on the smallest GEMM dimension ``d`` (tokens, or hidden/tp, or the
  expert FFN width), so thin GEMMs (high TP, small experts, tiny micro-batches) run slower;
* fused attention: causal ``QKᵀ``/``AV`` work (half the counted model FLOPs) at
  ``attn_eff_ratio`` × the 16-bit GEMM rate (fp8 recipes keep attention in 16-bit);
* elementwise work (norms, residuals, activation functions, MoE permutation) as bytes moved at
  ``mem_eff`` × HBM bandwidth, replicated over TP unless sequence parallel;
* TP collectives: 2 all-reduces (or all-gather + reduce-scatter with SP) of ``n·h`` 16-bit
  activations per layer forward and 2 backward, ring cost ``2(t−1)/t·S/B + 2(t−1)·α`` on the link the
  TP group actually crosses; TP-comm overlap hides all but ``tp_overlap_exposed`` of it;
* EP all-to-all: dispatch and combine forward and backward, ``n·k·h`` 16-bit values × (ep−1)/ep,
  split between intra-domain peers and NIC peers by placement, times the expert-load imbalance;
* CP: ring exchange of K/V chunks, hidden behind attention compute where it fits;
* recomputation: full repeats the layer forward (comm included) in backward; selective repeats the
  attention core;
* backward = 2 × forward compute and memory work; a host overhead per layer.

Pipeline: ``m`` micro-batches, per-rank time ``T_i = Σ chunks (fwd + bwd + p2p)``; step =
``m · max_i T_i + (pp−1)/v · mean_i T_i`` (1F1B and GPipe have the same bubble; interleaving
divides it by ``v``), the last stage carrying the logit layer and loss, the first the embedding.
DP gradient reduction (reduce-scatter + all-gather with a distributed optimizer, all-reduce
otherwise) and FSDP gathers per micro-batch are exposed beyond ``overlap_eff`` × the compute
window they can hide behind. The optimizer step moves ~32 bytes per local parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from powertrain.core.flops import Shape, layer_flops_per_token, parameter_counts, shape_of
from powertrain.predict.calibration import Coefficients
from powertrain.predict.case import Case
from powertrain.predict.memory import rank_layers

OPT_BYTES_PER_PARAM = 32.0  # Adam: read fp32 master, grad, m, v; write master, m, v and 16-bit copy
_ELEM_BYTES = {"fp8": 1.0, "fp4": 0.5, "fp32": 4.0, "tf32": 4.0}  # bytes per GEMM operand element
# Latencies a gloo collective call pays on top of its ring steps on a host CPU: the rendezvous
# round trip (announce, wait for the peer) before any data moves.
GLOO_CALL_LATENCIES = 2.0


@dataclass(slots=True)
class StepTime:
    """Seconds per optimizer step on the critical path, with the parts it is made of."""

    total_s: float
    breakdown: dict[str, float] = field(default_factory=dict)
    compute_s: float = 0.0  # per device: GEMM + attention time (mean device)
    memory_s: float = 0.0  # per device: memory-bound time
    critical_compute_s: float = 0.0  # compute on the critical path (what clock changes stretch)
    burst_s: float = 0.0  # longest uninterrupted compute stretch (one micro-batch fwd+bwd of a stage)


def _ring(size_bytes: float, group: int, bw: float, lat: float) -> float:
    """All-reduce-equivalent ring time for ``size_bytes`` over ``group`` ranks."""
    if group <= 1:
        return 0.0
    return 2 * (group - 1) / group * size_bytes / bw + 2 * (group - 1) * lat


def _half_ring(size_bytes: float, group: int, bw: float, lat: float) -> float:
    """All-gather or reduce-scatter ring time (half an all-reduce)."""
    if group <= 1:
        return 0.0
    return (group - 1) / group * size_bytes / bw + (group - 1) * lat


def _link(case: Case, c: Coefficients, stride: int, size: int) -> tuple[float, float]:
    """(bandwidth, latency) of a group of ``size`` ranks spaced ``stride`` apart."""
    node = case.device.node
    if size > 1 and stride * size > case._domain:  # the group leaves one NVLink domain
        return node.inter_node_bw_per_device * c.comm_eff_inter, node.inter_node_latency * c.comm_latency_scale
    return node.intra_node_bw * c.comm_eff_intra, node.intra_node_latency * c.comm_latency_scale


def step_time(case: Case, c: Coefficients, clock: float = 1.0, shape: Shape | None = None) -> StepTime:
    """Predict one step's time. ``clock`` (≤ 1) scales compute throughput (power/thermal limits)."""
    dev = case.device
    sh = shape or shape_of(case)
    lf = layer_flops_per_token(sh)
    tp, cp, ep, pp, vp = case.tp, case.cp, case.ep, case.pp, case.vp
    sp = case.sequence_parallel
    h = case.hidden
    n_tok = case.micro_batch * case.seq_len / cp  # tokens per micro-batch on this device
    imb = (case.moe_imbalance if case.moe_imbalance is not None else c.moe_imbalance) if case.is_moe else 1.0

    # --- compute rates ---------------------------------------------------------------------------
    prec = case.precision
    peak = dev.peak(prec) * c.gemm_eff(prec) * clock
    prec16 = "fp32" if prec in ("fp32", "tf32") else "bf16"
    peak16 = dev.peak(prec16) * c.gemm_eff(prec16) * clock
    knee = c.gemm_knee

    bw_mem = dev.memory_bw * c.mem_eff
    ab = 4.0 if prec in ("fp32", "tf32") else 2.0  # bytes per activation value
    eb_bw = _ELEM_BYTES.get(prec, 2.0) / bw_mem

    def gemm(m_: float, k_: float, n_: float) -> float:
        """Roofline time of an m×k by k×n GEMM: compute at the shape-scaled rate, or its traffic.

        The shape factor d/(d + knee) on the smallest dimension d models tile and wave quantisation.
        """
        d = m_ if m_ < k_ else k_
        d = d if d < n_ else n_
        flops = 2 * m_ * k_ * n_ * (d + knee) / (peak * d)
        traffic = (m_ * k_ + k_ * n_ + m_ * n_) * eb_bw
        return flops if flops > traffic else traffic

    kvw = case.kv_heads * (h // case.heads)
    mats = 3 if case.gated else 2
    t_dense = gemm(n_tok, h, (h + 2 * kvw) / tp) + gemm(n_tok, h / tp, h)
    if case.is_moe:
        t_dense += gemm(n_tok, h, case.experts)  # router
        if case.shared_experts:
            f_sh = case.ffn * case.shared_experts
            t_dense += gemm(n_tok, h, (mats - 1) * f_sh / tp) + gemm(n_tok, f_sh / tp, h)
    else:
        t_dense += gemm(n_tok, h, (mats - 1) * case.ffn / tp) + gemm(n_tok, case.ffn / tp, h)
    t_expert = 0.0
    if case.is_moe:
        local = max(1.0, case.experts / ep)
        m_exp = n_tok * case.top_k * imb / local  # tokens each local expert sees (busiest rank)
        fe = case.expert_ffn / tp
        t_expert = local * (gemm(m_exp, h, (mats - 1) * fe) + gemm(m_exp, fe, h))
    s_loc = case.seq_len / cp
    t_attn = 0.5 * lf.attention * n_tok / tp * (s_loc + knee) / (peak16 * c.attn_eff_ratio * s_loc)
    t_comp_f = t_dense + t_expert + t_attn

    # --- memory-bound (elementwise) work, 16-bit values ---------------------------------------------
    ffn_act = (3 if case.gated else 2) * (
        case.top_k * case.expert_ffn * imb + case.ffn * case.shared_experts if case.is_moe else case.ffn)
    elem = (16 * h / (tp if sp else 1) + ffn_act / tp) * c.elementwise_scale
    if case.is_moe:
        # dispatch/combine: permute, un-permute, gate scaling, casts, per routed copy of a token
        elem += c.moe_dispatch_passes * case.top_k * h * imb / (tp if sp else 1)
    t_mem_f = ab * n_tok * elem / bw_mem

    # --- communication inside a layer ---------------------------------------------------------------
    t_tp_f = 0.0
    if tp > 1:
        bw, lat = _link(case, c, 1, tp)
        t_tp_f = 2 * _ring(ab * n_tok * h, tp, bw, lat)
        if dev.transport == "gloo":
            # gloo on a host CPU: each collective call also pays a rendezvous round trip, and sequence
            # parallelism makes twice the calls (all-gather + reduce-scatter for each all-reduce)
            t_tp_f += 2 * (2 if sp else 1) * GLOO_CALL_LATENCIES * lat
        if case.overlap_tp:
            t_tp_f *= c.tp_overlap_exposed
    t_a2a_f = 0.0
    if case.is_moe and ep > 1:
        stride = tp * cp
        node = dev.node
        near = case.peers_in_domain(stride, ep)
        vol = ab * n_tok / (tp if tp > 1 else 1) * case.top_k * h * imb  # bytes of one all-to-all
        f_near = (near - 1) / (ep - 1)
        t_one = vol * (ep - 1) / ep * (
            f_near / (node.intra_node_bw * c.comm_eff_intra)
            + (1 - f_near) / (node.inter_node_bw_per_device * c.comm_eff_inter))
        t_one += ((node.intra_node_latency if near == ep else node.inter_node_latency) * c.comm_latency_scale
                  * math.log2(ep))
        t_a2a_f = 2 * t_one
    t_cp_f = 0.0
    if cp > 1:
        bw, lat = _link(case, c, tp, cp)
        kv_bytes = ab * n_tok * 2 * case.kv_heads * (h // case.heads) / tp
        t_cp_f = max(0.0, (cp - 1) * (kv_bytes / bw + lat) - c.overlap_eff * t_attn)
    t_ovh = c.layer_overhead_s + (c.moe_layer_overhead_s if case.is_moe else 0.0)
    layer_f = t_comp_f + t_mem_f + t_tp_f + t_a2a_f + t_cp_f + t_ovh
    # backward = activation gradients + weight gradients (2 × forward); LoRA skips weight gradients
    bwd = 1.0 if case.lora else 2.0
    layer_b = bwd * (t_comp_f + t_mem_f + t_cp_f + t_ovh) + t_tp_f + t_a2a_f
    comp_layer = (1 + bwd) * t_comp_f
    if case.recompute == "full":
        layer_b += layer_f
        comp_layer += t_comp_f
    elif case.recompute == "selective":
        layer_b += t_attn
        comp_layer += t_attn

    # --- first/last stage extras ---------------------------------------------------------------------
    t_head_comp = gemm(n_tok, h, case.vocab / tp)
    t_head_mem = n_tok * case.vocab / tp * 14 / bw_mem  # 16-bit logits, fp32 softmax and its grad
    head_f = t_head_comp + t_head_mem
    head_b = 2 * t_head_comp + t_head_mem
    emb = 2 * ab * n_tok * h / bw_mem

    # --- pipeline -----------------------------------------------------------------------------------
    layers = rank_layers(case)
    m = case.micro_batches
    p2p = 0.0
    if pp > 1:
        bw, lat = _link(case, c, tp * cp * case.dp, pp)
        p2p = ab * n_tok * h / (tp if sp else 1) / bw + lat
    # Per pipeline rank: its layers, plus the embedding on the first and the logit layer on the last.
    # Only the first, the last and the fullest middle rank can be the slowest one.
    per_layer = layer_f + layer_b
    p2p_rank = 2 * vp * p2p if pp > 1 else 0.0
    head = head_f + head_b
    n_first, n_last = layers[0], layers[-1]
    if pp == 1:
        t_first = t_last = n_first * per_layer + head + 3 * emb
        cands = [(t_first, n_first * comp_layer + 3 * t_head_comp)]
        total_t = t_first
        total_c = cands[0][1]
    else:
        t_first = n_first * per_layer + p2p_rank + 3 * emb
        t_last = n_last * per_layer + p2p_rank + head
        cands = [(t_first, n_first * comp_layer), (t_last, n_last * comp_layer + 3 * t_head_comp)]
        if pp > 2:
            n_mid = max(layers[1:-1])
            cands.append((n_mid * per_layer + p2p_rank, n_mid * comp_layer))
        total_t = case.layers * per_layer + pp * p2p_rank + head + 3 * emb
        total_c = case.layers * comp_layer + 3 * t_head_comp
    t_max, comp_crit = max(cands)
    t_mean = total_t / pp
    bubble = (pp - 1) / vp * t_mean if pp > 1 else 0.0
    busy = m * t_max
    critical_compute = m * comp_crit + ((pp - 1) / vp * total_c / pp if pp > 1 else 0.0)

    # --- data-parallel / FSDP collectives -----------------------------------------------------------
    p = parameter_counts(sh)
    n_stage = max(layers)
    dense_dev = (p["attention"] + p["mlp"] + p["router"] + p["norms"]) / case.layers * n_stage / tp
    dense_dev += (p["embedding"] + p["head"]) / tp / pp  # spread: first/last stage hold them
    expert_dev = p["experts"] / case.layers * n_stage / (tp * ep)
    d_dense = case.dp * cp
    d_exp = max(1, d_dense // ep)
    bw_d, lat_d = _link(case, c, tp, d_dense)
    bw_e, lat_e = _link(case, c, tp * cp * ep, d_exp)
    grad_b = 4.0
    t_f_stage = t_max / 3  # ~ forward share of one micro-batch on the critical rank
    t_b_stage = t_max - t_f_stage
    dp_exposed = 0.0
    fsdp_exposed = 0.0
    if case.lora:
        pass  # frozen weights: no gradient reduction (adapter gradients are negligible)
    elif case.fsdp:
        ag = _half_ring(dense_dev * 2, d_dense, bw_d, lat_d) + _half_ring(expert_dev * 2, d_exp, bw_e, lat_e)
        rs = _half_ring(dense_dev * grad_b, d_dense, bw_d, lat_d) + _half_ring(expert_dev * grad_b, d_exp, bw_e, lat_e)
        ovl = c.overlap_eff if case.overlap_fsdp else 0.0
        per_mb = max(0.0, ag - ovl * t_f_stage) + max(0.0, ag + rs - ovl * t_b_stage)
        fsdp_exposed = m * per_mb + ag / max(1, n_stage)  # the first layer's gather cannot hide
    else:
        if case.distributed_optimizer:
            rs = (_half_ring(dense_dev * grad_b, d_dense, bw_d, lat_d)
                  + _half_ring(expert_dev * grad_b, d_exp, bw_e, lat_e))
            ag = _half_ring(dense_dev * 2, d_dense, bw_d, lat_d) + _half_ring(expert_dev * 2, d_exp, bw_e, lat_e)
        else:
            rs = _ring(dense_dev * grad_b, d_dense, bw_d, lat_d) + _ring(expert_dev * grad_b, d_exp, bw_e, lat_e)
            ag = 0.0
        window = t_b_stage * (1 + (vp - 1) / vp * 0.5 * (pp > 1)) if case.overlap_dp else 0.0
        dp_exposed = max(0.0, rs - c.overlap_eff * window)
        if case.overlap_param_gather:
            dp_exposed += max(0.0, ag - c.overlap_eff * t_f_stage)
        else:
            dp_exposed += ag

    # --- optimizer ----------------------------------------------------------------------------------
    shard = d_dense if (case.fsdp or case.distributed_optimizer) else 1
    shard_e = d_exp if (case.fsdp or case.distributed_optimizer) else 1
    t_opt = ((dense_dev / shard + expert_dev / shard_e) * OPT_BYTES_PER_PARAM
             + (dense_dev + expert_dev) * grad_b) / bw_mem

    total = busy + bubble + dp_exposed + fsdp_exposed + t_opt + c.step_overhead_s
    n_layers_dev = case.layers / pp
    bd = {
        "compute_s": m * n_layers_dev * comp_layer,
        "memory_bound_s": m * n_layers_dev * 3 * t_mem_f,
        "tp_comm_exposed_s": m * n_layers_dev * (2 + (case.recompute == "full")) * t_tp_f,
        "ep_all_to_all_s": m * n_layers_dev * (2 + (case.recompute == "full")) * t_a2a_f,
        "cp_comm_exposed_s": m * n_layers_dev * 3 * t_cp_f,
        "pp_p2p_s": m * 2 * vp * p2p if pp > 1 else 0.0,
        "pp_bubble_s": bubble,
        "pp_stage_imbalance_s": m * (t_max - t_mean),
        "dp_comm_exposed_s": dp_exposed,
        "fsdp_comm_exposed_s": fsdp_exposed,
        "optimizer_s": t_opt,
        "overhead_s": c.step_overhead_s + m * n_layers_dev * 3 * t_ovh,
        "head_s": m * (head_f + head_b) / pp,
        "micro_batches": float(m),
    }
    compute_mean = m * total_c / pp
    memory_mean = m * (n_layers_dev * 3 * t_mem_f + 2 * t_head_mem / pp) + t_opt
    return StepTime(total_s=total, breakdown=bd, compute_s=compute_mean, memory_s=memory_mean,
                    critical_compute_s=critical_compute, burst_s=t_max / vp)
