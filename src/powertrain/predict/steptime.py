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

Each part is its own function, usable alone: :func:`compute_rates` (what the device sustains),
:func:`layer_time` (one layer and micro-batch: :func:`layer_compute`, :func:`layer_memory`,
:func:`tp_comm_time`, :func:`ep_all_to_all_time`, :func:`cp_comm_time`), :func:`head_time`,
:func:`pipeline_time`, :func:`local_parameters`, :func:`data_parallel_time` (DP or FSDP) and
:func:`optimizer_time`; :func:`step_time` composes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from powertrain.core.flops import LayerFlops, Shape, layer_flops_per_token, parameter_counts, shape_of
from powertrain.predict.calibration import Coefficients
from powertrain.predict.case import Case
from powertrain.predict.memory import rank_layers

OPT_BYTES_PER_PARAM = 32.0  # Adam: read fp32 master, grad, m, v; write master, m, v and 16-bit copy
GRAD_BYTES = 4.0  # bytes per gradient value reduced across data-parallel ranks (fp32)
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


def tokens_per_micro_batch(case: Case) -> float:
    """Tokens of one micro-batch on one device (context parallelism splits the sequence)."""
    return case.micro_batch * case.seq_len / case.cp


def moe_imbalance(case: Case, c: Coefficients) -> float:
    """Busiest expert rank ÷ mean: the case's own, else the calibration's; 1 for a dense model."""
    return (case.moe_imbalance if case.moe_imbalance is not None else c.moe_imbalance) if case.is_moe else 1.0


# --- compute rates -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Rates:
    """What one device sustains at a clock: GEMM rates, memory bandwidth and value sizes."""

    peak: float  # FLOP/s of large GEMMs in the case's precision
    peak16: float  # FLOP/s of large 16-bit (fp32 for fp32/tf32 runs) GEMMs: attention's rate
    knee: float  # GEMM dimension at which efficiency halves
    bw_mem: float  # bytes/s memory-bound kernels reach
    ab: float  # bytes per activation value
    eb_bw: float  # seconds of memory traffic per GEMM operand element

    def gemm(self, m_: float, k_: float, n_: float) -> float:
        """Roofline time of an m×k by k×n GEMM: compute at the shape-scaled rate, or its traffic.

        The shape factor d/(d + knee) on the smallest dimension d models tile and wave quantisation.
        """
        d = m_ if m_ < k_ else k_
        d = d if d < n_ else n_
        flops = 2 * m_ * k_ * n_ * (d + self.knee) / (self.peak * d)
        traffic = (m_ * k_ + k_ * n_ + m_ * n_) * self.eb_bw
        return flops if flops > traffic else traffic


def compute_rates(case: Case, c: Coefficients, clock: float = 1.0) -> Rates:
    """The device's rates for ``case``; ``clock`` (≤ 1) scales compute throughput."""
    dev = case.device
    prec = case.precision
    peak = dev.peak(prec) * c.gemm_eff(prec) * clock
    prec16 = "fp32" if prec in ("fp32", "tf32") else "bf16"
    peak16 = dev.peak(prec16) * c.gemm_eff(prec16) * clock
    bw_mem = dev.memory_bw * c.mem_eff
    ab = 4.0 if prec in ("fp32", "tf32") else 2.0
    return Rates(peak=peak, peak16=peak16, knee=c.gemm_knee, bw_mem=bw_mem, ab=ab,
                 eb_bw=_ELEM_BYTES.get(prec, 2.0) / bw_mem)


# --- one layer, one micro-batch ---------------------------------------------------------------------

def layer_compute(case: Case, c: Coefficients, r: Rates, lf: LayerFlops) -> tuple[float, float]:
    """(GEMM + attention time, attention-core time) of one layer's forward on one device."""
    tp, h = case.tp, case.hidden
    n_tok = tokens_per_micro_batch(case)
    gemm = r.gemm
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
        local = max(1.0, case.experts / case.ep)
        m_exp = n_tok * case.top_k * moe_imbalance(case, c) / local  # tokens each local expert sees (busiest rank)
        fe = case.expert_ffn / tp
        t_expert = local * (gemm(m_exp, h, (mats - 1) * fe) + gemm(m_exp, fe, h))
    s_loc = case.seq_len / case.cp
    t_attn = 0.5 * lf.attention * n_tok / tp * (s_loc + r.knee) / (r.peak16 * c.attn_eff_ratio * s_loc)
    return t_dense + t_expert + t_attn, t_attn


def layer_memory(case: Case, c: Coefficients, r: Rates) -> float:
    """Memory-bound (elementwise) time of one layer's forward: 16-bit values over HBM."""
    tp, h = case.tp, case.hidden
    sp = case.sequence_parallel
    imb = moe_imbalance(case, c)
    ffn_act = (3 if case.gated else 2) * (
        case.top_k * case.expert_ffn * imb + case.ffn * case.shared_experts if case.is_moe else case.ffn)
    elem = (16 * h / (tp if sp else 1) + ffn_act / tp) * c.elementwise_scale
    if case.is_moe:
        # dispatch/combine: permute, un-permute, gate scaling, casts, per routed copy of a token
        elem += c.moe_dispatch_passes * case.top_k * h * imb / (tp if sp else 1)
    return r.ab * tokens_per_micro_batch(case) * elem / r.bw_mem


def tp_comm_time(case: Case, c: Coefficients, r: Rates) -> float:
    """Exposed tensor-parallel communication of one layer's forward (the backward has as much)."""
    tp = case.tp
    if tp <= 1:
        return 0.0
    bw, lat = _link(case, c, 1, tp)
    t = 2 * _ring(r.ab * tokens_per_micro_batch(case) * case.hidden, tp, bw, lat)
    if case.device.transport == "gloo":
        # gloo on a host CPU: each collective call also pays a rendezvous round trip, and sequence
        # parallelism makes twice the calls (all-gather + reduce-scatter for each all-reduce)
        t += 2 * (2 if case.sequence_parallel else 1) * GLOO_CALL_LATENCIES * lat
    if case.overlap_tp:
        t *= c.tp_overlap_exposed
    return t


def ep_all_to_all_time(case: Case, c: Coefficients, r: Rates) -> float:
    """Expert-parallel dispatch + combine all-to-alls of one MoE layer's forward."""
    ep, tp = case.ep, case.tp
    if not (case.is_moe and ep > 1):
        return 0.0
    stride = tp * case.cp
    node = case.device.node
    near = case.peers_in_domain(stride, ep)
    # bytes of one all-to-all
    vol = r.ab * tokens_per_micro_batch(case) / (tp if tp > 1 else 1) * case.top_k * case.hidden * moe_imbalance(case, c)
    f_near = (near - 1) / (ep - 1)
    t_one = vol * (ep - 1) / ep * (
        f_near / (node.intra_node_bw * c.comm_eff_intra)
        + (1 - f_near) / (node.inter_node_bw_per_device * c.comm_eff_inter))
    t_one += ((node.intra_node_latency if near == ep else node.inter_node_latency) * c.comm_latency_scale
              * math.log2(ep))
    return 2 * t_one


def cp_comm_time(case: Case, c: Coefficients, r: Rates, t_attn: float) -> float:
    """Context-parallel K/V ring exchange of one layer's forward, beyond what attention hides."""
    cp = case.cp
    if cp <= 1:
        return 0.0
    bw, lat = _link(case, c, case.tp, cp)
    h = case.hidden
    kv_bytes = r.ab * tokens_per_micro_batch(case) * 2 * case.kv_heads * (h // case.heads) / case.tp
    return max(0.0, (cp - 1) * (kv_bytes / bw + lat) - c.overlap_eff * t_attn)


@dataclass(frozen=True, slots=True)
class LayerTime:
    """One transformer layer, one micro-batch, one device (seconds; ``*_f``: forward only)."""

    compute_f: float  # GEMMs + attention
    attention_f: float  # the attention core (what selective recompute repeats)
    memory_f: float  # elementwise work
    tp_f: float  # exposed TP collectives
    a2a_f: float  # EP all-to-all
    cp_f: float  # exposed CP exchange
    overhead_f: float  # host/launch overhead
    forward: float
    backward: float  # including recomputation
    compute: float  # compute of forward + backward + recomputation


def layer_time(case: Case, c: Coefficients, r: Rates, lf: LayerFlops) -> LayerTime:
    """Forward and backward time of one layer (backward = 2 × forward's compute; LoRA: 1 ×)."""
    t_comp_f, t_attn = layer_compute(case, c, r, lf)
    t_mem_f = layer_memory(case, c, r)
    t_tp_f = tp_comm_time(case, c, r)
    t_a2a_f = ep_all_to_all_time(case, c, r)
    t_cp_f = cp_comm_time(case, c, r, t_attn)
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
    return LayerTime(compute_f=t_comp_f, attention_f=t_attn, memory_f=t_mem_f, tp_f=t_tp_f, a2a_f=t_a2a_f,
                     cp_f=t_cp_f, overhead_f=t_ovh, forward=layer_f, backward=layer_b, compute=comp_layer)


# --- first/last stage extras --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class HeadTime:
    """The logit layer and loss (last stage) and the embedding (first stage), one micro-batch."""

    compute: float  # the logit GEMM, forward
    memory: float  # 16-bit logits, fp32 softmax and its gradient
    forward: float
    backward: float
    embedding: float  # one embedding pass (forward, backward and the gradient update make 3)


def head_time(case: Case, r: Rates) -> HeadTime:
    n_tok = tokens_per_micro_batch(case)
    h, tp = case.hidden, case.tp
    t_head_comp = r.gemm(n_tok, h, case.vocab / tp)
    t_head_mem = n_tok * case.vocab / tp * 14 / r.bw_mem  # 16-bit logits, fp32 softmax and its grad
    return HeadTime(compute=t_head_comp, memory=t_head_mem, forward=t_head_comp + t_head_mem,
                    backward=2 * t_head_comp + t_head_mem, embedding=2 * r.ab * n_tok * h / r.bw_mem)


# --- pipeline ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PipelineTime:
    """Per micro-batch times of the pipeline ranks, and the step's busy time and bubble."""

    p2p: float  # one activation send between stages
    slowest_rank: float  # one micro-batch (fwd + bwd) on the slowest pipeline rank
    mean_rank: float  # the same, mean over pipeline ranks
    compute_all_ranks: float  # compute of one micro-batch summed over the pipeline ranks
    busy: float  # micro-batches × slowest rank
    bubble: float  # fill and drain: (pp − 1)/v × mean rank


def pipeline_time(case: Case, c: Coefficients, r: Rates, layer: LayerTime, head: HeadTime) -> PipelineTime:
    """Step time of the pipeline without DP/optimizer work: ``m · max_i T_i + (pp−1)/v · mean_i T_i``.

    Per pipeline rank: its layers, plus the embedding on the first and the logit layer on the last.
    Only the first, the last and the fullest middle rank can be the slowest one.
    """
    tp, cp, pp, vp = case.tp, case.cp, case.pp, case.vp
    layers = rank_layers(case)
    p2p = 0.0
    if pp > 1:
        bw, lat = _link(case, c, tp * cp * case.dp, pp)
        p2p = r.ab * tokens_per_micro_batch(case) * case.hidden / (tp if case.sequence_parallel else 1) / bw + lat
    per_layer = layer.forward + layer.backward
    p2p_rank = 2 * vp * p2p if pp > 1 else 0.0
    head_fb = head.forward + head.backward
    emb = head.embedding
    n_first, n_last = layers[0], layers[-1]
    if pp == 1:
        t_first = n_first * per_layer + head_fb + 3 * emb
        cands = [t_first]
        total_t = t_first
        total_c = n_first * layer.compute + 3 * head.compute
    else:
        t_first = n_first * per_layer + p2p_rank + 3 * emb
        t_last = n_last * per_layer + p2p_rank + head_fb
        cands = [t_first, t_last]
        if pp > 2:
            cands.append(max(layers[1:-1]) * per_layer + p2p_rank)
        total_t = case.layers * per_layer + pp * p2p_rank + head_fb + 3 * emb
        total_c = case.layers * layer.compute + 3 * head.compute
    t_max = max(cands)
    t_mean = total_t / pp
    return PipelineTime(p2p=p2p, slowest_rank=t_max, mean_rank=t_mean, compute_all_ranks=total_c,
                        busy=case.micro_batches * t_max, bubble=(pp - 1) / vp * t_mean if pp > 1 else 0.0)


# --- data-parallel / FSDP collectives ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LocalParameters:
    """Parameters one device holds (fullest pipeline stage) and the groups that replicate them."""

    dense: float
    expert: float
    dense_group: int  # ranks holding a replica of the dense parameters (dp × cp)
    expert_group: int  # ranks holding a replica of one expert's parameters (dense group ÷ ep)


def local_parameters(case: Case, sh: Shape) -> LocalParameters:
    tp, ep, pp = case.tp, case.ep, case.pp
    p = parameter_counts(sh)
    n_stage = max(rank_layers(case))
    dense_dev = (p["attention"] + p["mlp"] + p["router"] + p["norms"]) / case.layers * n_stage / tp
    dense_dev += (p["embedding"] + p["head"]) / tp / pp  # spread: first/last stage hold them
    expert_dev = p["experts"] / case.layers * n_stage / (tp * ep)
    d_dense = case.dp * case.cp
    return LocalParameters(dense=dense_dev, expert=expert_dev, dense_group=d_dense, expert_group=max(1, d_dense // ep))


def data_parallel_time(case: Case, c: Coefficients, params: LocalParameters, slowest_rank: float) -> tuple[float, float]:
    """(exposed DP gradient reduction, exposed FSDP gathers and reductions) of one step.

    They hide behind ``overlap_eff`` × the compute window of the slowest pipeline rank's micro-batch
    (``slowest_rank``: about one third forward, two thirds backward).
    """
    tp, cp, ep, pp, vp = case.tp, case.cp, case.ep, case.pp, case.vp
    dense_dev, expert_dev = params.dense, params.expert
    d_dense, d_exp = params.dense_group, params.expert_group
    bw_d, lat_d = _link(case, c, tp, d_dense)
    bw_e, lat_e = _link(case, c, tp * cp * ep, d_exp)
    grad_b = GRAD_BYTES
    t_f_stage = slowest_rank / 3  # ~ forward share of one micro-batch on the critical rank
    t_b_stage = slowest_rank - t_f_stage
    dp_exposed = 0.0
    fsdp_exposed = 0.0
    if case.lora:
        pass  # frozen weights: no gradient reduction (adapter gradients are negligible)
    elif case.fsdp:
        ag = _half_ring(dense_dev * 2, d_dense, bw_d, lat_d) + _half_ring(expert_dev * 2, d_exp, bw_e, lat_e)
        rs = _half_ring(dense_dev * grad_b, d_dense, bw_d, lat_d) + _half_ring(expert_dev * grad_b, d_exp, bw_e, lat_e)
        ovl = c.overlap_eff if case.overlap_fsdp else 0.0
        per_mb = max(0.0, ag - ovl * t_f_stage) + max(0.0, ag + rs - ovl * t_b_stage)
        fsdp_exposed = case.micro_batches * per_mb + ag / max(1, max(rank_layers(case)))  # the first layer's gather cannot hide
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
    return dp_exposed, fsdp_exposed


# --- optimizer ------------------------------------------------------------------------------------------

def optimizer_time(case: Case, params: LocalParameters, r: Rates) -> float:
    """The optimizer step: ~32 bytes per local (sharded) parameter plus reading the gradients."""
    sharded = case.fsdp or case.distributed_optimizer
    shard = params.dense_group if sharded else 1
    shard_e = params.expert_group if sharded else 1
    return ((params.dense / shard + params.expert / shard_e) * OPT_BYTES_PER_PARAM
            + (params.dense + params.expert) * GRAD_BYTES) / r.bw_mem


# --- the step -----------------------------------------------------------------------------------------

def step_time(case: Case, c: Coefficients, clock: float = 1.0, shape: Shape | None = None) -> StepTime:
    """Predict one step's time. ``clock`` (≤ 1) scales compute throughput (power/thermal limits)."""
    sh = shape or shape_of(case)
    r = compute_rates(case, c, clock)
    layer = layer_time(case, c, r, layer_flops_per_token(sh))
    head = head_time(case, r)
    pipe = pipeline_time(case, c, r, layer, head)
    params = local_parameters(case, sh)
    dp_exposed, fsdp_exposed = data_parallel_time(case, c, params, pipe.slowest_rank)
    t_opt = optimizer_time(case, params, r)
    total = pipe.busy + pipe.bubble + dp_exposed + fsdp_exposed + t_opt + c.step_overhead_s
    m, pp = case.micro_batches, case.pp
    n_layers_dev = case.layers / pp
    compute_mean = m * pipe.compute_all_ranks / pp
    memory_mean = m * (n_layers_dev * 3 * layer.memory_f + 2 * head.memory / pp) + t_opt
    return StepTime(total_s=total, breakdown=_breakdown(case, c, layer, head, pipe, dp_exposed, fsdp_exposed, t_opt),
                    compute_s=compute_mean, memory_s=memory_mean, burst_s=pipe.slowest_rank / case.vp)


def _breakdown(case: Case, c: Coefficients, layer: LayerTime, head: HeadTime, pipe: PipelineTime,
               dp_exposed: float, fsdp_exposed: float, t_opt: float) -> dict[str, float]:
    """The step's parts (seconds, summed over micro-batches on the mean pipeline rank)."""
    m, pp, vp = case.micro_batches, case.pp, case.vp
    n_layers_dev = case.layers / pp
    comm_passes = 2 + (case.recompute == "full")  # forward, backward and a recomputed forward
    return {
        "compute_s": m * n_layers_dev * layer.compute,
        "memory_bound_s": m * n_layers_dev * 3 * layer.memory_f,
        "tp_comm_exposed_s": m * n_layers_dev * comm_passes * layer.tp_f,
        "ep_all_to_all_s": m * n_layers_dev * comm_passes * layer.a2a_f,
        "cp_comm_exposed_s": m * n_layers_dev * 3 * layer.cp_f,
        "pp_p2p_s": m * 2 * vp * pipe.p2p if pp > 1 else 0.0,
        "pp_bubble_s": pipe.bubble,
        "pp_stage_imbalance_s": m * (pipe.slowest_rank - pipe.mean_rank),
        "dp_comm_exposed_s": dp_exposed,
        "fsdp_comm_exposed_s": fsdp_exposed,
        "optimizer_s": t_opt,
        "overhead_s": c.step_overhead_s + m * n_layers_dev * 3 * layer.overhead_f,
        "head_s": m * (head.forward + head.backward) / pp,
        "micro_batches": float(m),
    }
