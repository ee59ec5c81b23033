"""Step time: compute, memory-bound work, exposed communication and pipeline bubble.

Per layer and micro-batch on one device (tokens ``n = b·s/cp``):

* GEMMs: ``FLOPs / (peak[precision] · e[precision] · f(m, k, n))`` with ``f`` the shape's tile and wave
  quantisation on the device's SMs (predict/kernel_shape.py: the library's best tile, the last wave's idle
  SMs, each tile's fill), so thin GEMMs (high TP, few tokens per expert, small micro-batches) run slower;
  the routed experts' grouped GEMM fills its waves with every local expert's tiles together;
* fused attention: causal ``QKᵀ``/``AV`` work (half the counted model FLOPs) at
  ``attn_eff_ratio`` × the 16-bit GEMM rate (fp8 recipes keep attention in 16-bit), × the share of its
  last wave its (sequence, head, query block) thread blocks fill;
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

from dataclasses import dataclass, field

from powertrain.core.flops import LayerFlops, Shape, layer_flops_per_token, parameter_counts, shape_of
from powertrain.predict import engines, kernel_shape, lora, moe, precision
from powertrain.predict import network as net
from powertrain.predict.calibration import Coefficients
from powertrain.predict.case import Case
from powertrain.predict.memory import rank_layers
from powertrain.predict.timeline import PassWork, StageWork, StepWork, compose_step

GRAD_BYTES = 4.0  # bytes per gradient value reduced across data-parallel ranks (fp32)
ZERO3_GRAD_BYTES = 2.0  # DeepSpeed ZeRO-3: gradients reduce-scattered in the 16-bit training dtype
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
    work: StepWork | None = None  # the parts by kind and pipeline stage, at the maximum clock (predict/timeline.py)
    clock: float = 1.0  # the clock ratio the total is at


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
    """(bandwidth, latency) of a group of ``size`` ranks spaced ``stride`` apart, as its bus sees it.

    Kept for callers of the old API; the step time itself costs collectives with
    :mod:`powertrain.predict.network` (all NICs of a node striped, NVLS, trees)."""
    f = net.fabric(case, c)
    g = net.group(case, stride, size)
    if g.domains > 1:
        return net._scale_out_bw(f, g), f.out_lat
    return f.up_bw, f.up_lat


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
    sms: int | None  # SMs (CUs) the kernels' thread blocks fill wave by wave; None: no wave model (a host CPU)
    bw_mem: float  # bytes/s memory-bound kernels reach
    ab: float  # bytes per activation value
    eb_bw: float  # seconds of memory traffic per GEMM operand element
    q: float = 0.0  # seconds of quantisation traffic per GEMM input (activation) value (fp8/fp4 recipes)

    def gemm(self, m_: float, k_: float, n_: float, groups: float = 1.0) -> float:
        """Roofline time of ``groups`` m×k by k×n GEMMs in one launch (a grouped GEMM's groups share their
        waves): compute at the shape's rate (kernel_shape.gemm_efficiency), or its traffic."""
        f = kernel_shape.gemm_efficiency(m_, k_, n_, self.sms, groups) if self.sms else 1.0
        flops = 2 * m_ * k_ * n_ * groups / (self.peak * f)
        traffic = (m_ * k_ + k_ * n_ + m_ * n_) * groups * self.eb_bw
        return (flops if flops > traffic else traffic) + m_ * k_ * groups * self.q


def compute_rates(case: Case, c: Coefficients, clock: float = 1.0) -> Rates:
    """The device's rates for ``case``; ``clock`` (≤ 1) scales compute throughput."""
    dev = case.device
    prec = case.precision
    prec16 = "fp32" if prec in ("fp32", "tf32") else "bf16"
    gen = precision.generation(dev.name)
    r16 = precision.sixteen_bit_ratio(dev.name) if prec16 == "bf16" else 1.0
    peak16 = dev.peak(prec16) * c.gemm_eff(prec16) * r16 * clock
    bw_mem = dev.memory_bw * c.mem_eff
    q = 0.0
    if gen != "unknown" and prec in ("fp8", "fp4") and dev.peak(prec) > dev.peak("bf16"):
        # a generation we know: the low-precision efficiency is the 16-bit one × the literature ratio
        # for the generation and recipe (× the calibration's scale), plus quantisation traffic
        rec = precision.recipe_of(prec, case.recipe, gen)
        eff = c.gemm_eff_16 * r16 * precision.relative_efficiency(dev.name, prec, rec) * c.gemm_lowp_scale
        peak = dev.peak(prec) * eff * clock
        q = precision.quantize_bytes_per_value(prec, rec) / bw_mem
    else:
        # fp8/fp4 on a device without those units run at the 16-bit rate and efficiency
        lowp_missing = prec in ("fp8", "fp4") and "bf16" in dev.peak_flops and dev.peak(prec) <= dev.peak("bf16")
        eff_p = "bf16" if lowp_missing else prec
        peak = dev.peak(prec) * c.gemm_eff(eff_p) * (r16 if eff_p in ("bf16", "fp16") else 1.0) * clock
    ab = 4.0 if prec in ("fp32", "tf32") else 2.0
    return Rates(peak=peak, peak16=peak16, sms=dev.compute_units, bw_mem=bw_mem, ab=ab,
                 eb_bw=_ELEM_BYTES.get(prec, 2.0) / bw_mem, q=q)


# --- one layer, one micro-batch ---------------------------------------------------------------------

def attention_gemm_time(case: Case, r: Rates, n_tok: float) -> tuple[float, float]:
    """(time, longest single GEMM) of the Q/K/V/O projections of one layer's forward: grouped-query, own
    head width, or MLA.

    MLA (DeepSeek-V2/V3, Kimi K2): down-projections of the query (``q_lora_rank``) and of K/V
    (``kv_lora_rank`` + the shared rotary key) are replicated over TP; the up-projections to
    ``heads × (head_dim + rope)`` queries/keys and ``heads × v_head_dim`` values are split."""
    tp, h = case.tp, case.hidden
    gemm = r.gemm
    hd = case.head_dim or h // case.heads
    if case.kv_lora_rank:
        rope, vd = case.qk_rope_dim, case.v_head_dim or hd
        qk = case.heads * (hd + rope)
        ts = [gemm(n_tok, h, case.kv_lora_rank + rope), gemm(n_tok, case.kv_lora_rank, case.heads * (hd + vd) / tp)]
        if case.q_lora_rank:
            ts += [gemm(n_tok, h, case.q_lora_rank), gemm(n_tok, case.q_lora_rank, qk / tp)]
        else:
            ts.append(gemm(n_tok, h, qk / tp))
        ts.append(gemm(n_tok, case.heads * vd / tp, h))
        return sum(ts), max(ts)
    q = case.heads * hd
    kv = case.kv_heads * hd
    t_qkv, t_o = gemm(n_tok, h, (q + 2 * kv) / tp), gemm(n_tok, q / tp, h)
    return t_qkv + t_o, max(t_qkv, t_o)


def attention_core_time(case: Case, c: Coefficients, r: Rates, lf: LayerFlops, n_tok: float) -> float:
    """Fused causal attention (half the counted full-sequence work) at ``attn_eff_ratio`` × the 16-bit rate, ×
    the share of its last wave its thread blocks fill (kernel_shape.attention_efficiency)."""
    s_loc = case.seq_len / case.cp
    rate = (r.peak16 * c.attn_eff_ratio * precision.attention_ratio(case.device.name)
            * precision.attention_kernel_ratio(case.device.name, case.attention_kernel))
    if r.sms:
        rate *= kernel_shape.attention_efficiency(case.micro_batch, case.heads / case.tp, s_loc, r.sms)
    return 0.5 * lf.attention * n_tok / case.tp / rate


def layer_compute(case: Case, c: Coefficients, r: Rates, lf: LayerFlops,
                  dense: bool = False) -> tuple[float, float, float]:
    """(GEMM + attention time, attention-core time, longest single compute kernel) of one layer's forward on
    one device. The longest kernel (a GEMM, or the fused attention) is what a short power-sensor window can
    see alone (predict/timeline.py).

    ``dense``: a dense layer of an MoE model (its leading ``dense_layers``), MLP of width ``ffn``."""
    tp, h = case.tp, case.hidden
    n_tok = tokens_per_micro_batch(case)
    gemm = r.gemm
    mats = 3 if case.gated else 2
    t, longest = attention_gemm_time(case, r, n_tok)
    if case.is_moe and not dense:
        shared, experts = moe.shared_gemm_time(case, gemm, n_tok), moe.expert_gemm_time(case, c, gemm, n_tok)
        t += shared + experts
        longest = max(longest, shared / 2, experts / 2)  # up and down projections: one grouped GEMM each
    else:
        up, down = gemm(n_tok, h, (mats - 1) * case.ffn / tp), gemm(n_tok, case.ffn / tp, h)
        t += up + down
        longest = max(longest, up, down)
    t_attn = attention_core_time(case, c, r, lf, n_tok)
    return t + t_attn, t_attn, max(longest, t_attn)


def layer_memory(case: Case, c: Coefficients, r: Rates, dense: bool = False) -> float:
    """Memory-bound (elementwise) time of one layer's forward: 16-bit values over HBM."""
    tp, h = case.tp, case.hidden
    sp = case.sequence_parallel
    mats = 3 if case.gated else 2
    n_tok = tokens_per_micro_batch(case)
    if case.is_moe and not dense:
        ffn_act = mats * (case.top_k * case.expert_ffn * moe.routed_load(case, c) * case.tp / case.expert_tp
                          + case.shared_width)
    else:
        ffn_act = mats * case.ffn
    elem = (16 * h / (tp if sp else 1) + ffn_act / tp) * c.elementwise_scale
    t = r.ab * n_tok * elem / r.bw_mem
    if case.is_moe and not dense:
        t += moe.routing_bytes(case, c, r.ab, n_tok) / r.bw_mem
    return t


def tp_comm_time(case: Case, c: Coefficients, r: Rates) -> float:
    """Exposed tensor-parallel communication of one layer's forward (the backward has as much)."""
    tp = case.tp
    if tp <= 1:
        return 0.0
    f = net.fabric(case, c)
    g = net.group(case, 1, tp)
    act = r.ab * tokens_per_micro_batch(case) * case.hidden
    if case.sequence_parallel:  # all-gather + reduce-scatter for each of the 2 all-reduces (no NVLS gain)
        t = 2 * (net.all_gather(f, g, act) + net.reduce_scatter(f, g, act))
    else:  # 2 all-reduces of n·h activations
        t = 2 * net.all_reduce(f, g, act)
    lat = f.up_lat
    if case.device.transport == "gloo":
        # gloo on a host CPU: each collective call also pays a rendezvous round trip, and sequence
        # parallelism makes twice the calls (all-gather + reduce-scatter for each all-reduce)
        t += 2 * (2 if case.sequence_parallel else 1) * GLOO_CALL_LATENCIES * lat
    if case.overlap_tp:
        t *= c.tp_overlap_exposed
    return t


def ep_all_to_all_time(case: Case, c: Coefficients, r: Rates) -> float:
    """Expert-parallel dispatch + combine all-to-alls of one MoE layer's forward (see predict/moe.py)."""
    return moe.all_to_all_time(case, c, r.ab, tokens_per_micro_batch(case), net.fabric(case, c))


def cp_comm_time(case: Case, c: Coefficients, r: Rates, t_attn: float) -> float:
    """Context-parallel K/V ring exchange of one layer's forward, beyond what attention hides."""
    cp = case.cp
    if cp <= 1:
        return 0.0
    f = net.fabric(case, c)
    crosses = net.group(case, case.tp, cp).domains > 1
    hd = case.head_dim or case.hidden // case.heads
    kv_w = (case.kv_lora_rank + case.qk_rope_dim) if case.kv_lora_rank else 2 * case.kv_heads * hd
    kv_bytes = r.ab * tokens_per_micro_batch(case) * kv_w / case.tp
    return max(0.0, (cp - 1) * net.send_recv(f, crosses, kv_bytes) - c.overlap_eff * t_attn)


@dataclass(frozen=True, slots=True)
class LayerTime:
    """One transformer layer, one micro-batch, one device (seconds; ``*_f``: forward only; ``b_*``: the
    backward by kind of work, recomputation included). The kinds are what the power model draws for:
    compute (GEMMs, attention: clock-bound), memory-bound kernels, exposed communication, and host time
    (the GPU waits)."""

    compute_f: float  # GEMMs + attention
    attention_f: float  # the attention core (what selective recompute repeats)
    memory_f: float  # elementwise work
    tp_f: float  # exposed TP collectives
    a2a_f: float  # EP all-to-all
    cp_f: float  # exposed CP exchange
    overhead_f: float  # host/launch overhead (the GPU waits)
    forward: float
    backward: float  # including recomputation
    compute: float  # compute of forward + backward + recomputation
    b_compute: float = 0.0
    b_memory: float = 0.0
    b_comm: float = 0.0
    b_host: float = 0.0
    longest_f: float = 0.0  # the longest single compute kernel of the forward (a backward GEMM is as long)

    @property
    def comm_f(self) -> float:
        return self.tp_f + self.a2a_f + self.cp_f


def layer_time(case: Case, c: Coefficients, r: Rates, lf: LayerFlops, dense: bool = False) -> LayerTime:
    """Forward and backward time of one layer (backward = 2 × forward's compute; LoRA: 1 ×).

    ``dense``: one of an MoE model's leading dense layers (no routing, no all-to-all)."""
    moe_layer = case.is_moe and not dense
    t_comp_f, t_attn, longest = layer_compute(case, c, r, lf, dense)
    if case.engine == "builtin":  # its own eager kernels, counted op by op (predict/engines.py)
        f_bytes, b_bytes = engines.builtin_layer_bytes(case, dense)
        t_mem_f, t_mem_b = f_bytes / r.bw_mem, b_bytes / r.bw_mem
    else:
        t_mem_f = layer_memory(case, c, r, dense)
        t_mem_b = None
    t_tp_f = tp_comm_time(case, c, r)
    t_a2a_f = ep_all_to_all_time(case, c, r) if moe_layer else 0.0
    if t_a2a_f and case.overlap_ep:
        # dispatcher overlap: the all-to-all runs while another micro-batch computes
        t_a2a_f = max(0.0, t_a2a_f - c.overlap_eff * t_comp_f)
    elif t_a2a_f and case.shared_width:
        # the shared expert's GEMMs run while the dispatch is in flight
        t_a2a_f = max(0.5 * t_a2a_f, t_a2a_f - c.overlap_eff * moe.shared_gemm_time(case, r.gemm, tokens_per_micro_batch(case)))
    t_cp_f = cp_comm_time(case, c, r, t_attn)
    t_ovh = c.layer_overhead_s
    layer_f = t_comp_f + t_mem_f + t_tp_f + t_a2a_f + t_cp_f + t_ovh
    # backward = activation gradients + weight gradients (2 × forward); LoRA skips weight gradients
    bwd = lora.backward_factor(case, c, r, t_comp_f, t_attn, t_cp_f + t_ovh + (t_mem_f if t_mem_b is None else 0.0), dense) if case.lora else 2.0
    b_mem = bwd * t_mem_f if t_mem_b is None else t_mem_b
    b_comp, b_comm, b_host = bwd * t_comp_f, t_tp_f + t_a2a_f + bwd * t_cp_f, bwd * t_ovh
    if moe_layer:
        # dropless routing syncs token counts to the host; the GPU then waits for the CPU to launch the
        # rest of the layer: a layer pass takes the longer of its GPU work and that host time
        # (launch-bound at small micro-batches, hidden at large ones)
        host = c.moe_layer_overhead_s
        t_ovh += max(0.0, host - layer_f)
        layer_f = max(layer_f, host)
        b_host += max(0.0, host - (b_comp + b_mem + b_comm + b_host))
    if case.recompute == "full":  # the forward again, communication included, before its backward
        b_comp, b_mem, b_comm, b_host = b_comp + t_comp_f, b_mem + t_mem_f, b_comm + t_tp_f + t_a2a_f + t_cp_f, b_host + t_ovh
    elif case.recompute == "selective":
        b_comp += t_attn
    return LayerTime(compute_f=t_comp_f, attention_f=t_attn, memory_f=t_mem_f, tp_f=t_tp_f, a2a_f=t_a2a_f,
                     cp_f=t_cp_f, overhead_f=t_ovh, forward=layer_f, backward=b_comp + b_mem + b_comm + b_host,
                     compute=t_comp_f + b_comp, b_compute=b_comp, b_memory=b_mem, b_comm=b_comm, b_host=b_host,
                     longest_f=longest)


def mean_layer(case: Case, c: Coefficients, r: Rates, lf: LayerFlops) -> LayerTime:
    """The mean layer of the model: an MoE model's leading dense layers weighed in by their count."""
    routed = layer_time(case, c, r, lf)
    nd = min(case.dense_layers, case.layers) if case.is_moe else 0
    if not nd:
        return routed
    dense = layer_time(case, c, r, lf, dense=True)
    w = nd / case.layers
    vals = {k: (1 - w) * getattr(routed, k) + w * getattr(dense, k) for k in LayerTime.__dataclass_fields__}
    return LayerTime(**vals)


# --- first/last stage extras --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class HeadTime:
    """The logit layer and loss (last stage) and the embedding (first stage), one micro-batch."""

    compute: float  # the logit GEMM, forward
    memory: float  # 16-bit logits, fp32 softmax and its gradient
    forward: float
    backward: float
    embedding: float  # one embedding pass (forward, backward and the gradient update make 3)
    memory_b: float = 0.0  # the backward's memory-bound part (the built-in engine's differs from the forward's)


def head_time(case: Case, r: Rates) -> HeadTime:
    n_tok = tokens_per_micro_batch(case)
    h, tp = case.hidden, case.tp
    t_head_comp = r.gemm(n_tok, h, case.vocab / tp)
    if case.engine == "builtin":  # counted: bf16 and fp32 logits, the loss, weight casts, final norm
        f_bytes, b_bytes = engines.builtin_head_bytes(case)
        mem_f, mem_b = f_bytes / r.bw_mem, b_bytes / r.bw_mem
    else:
        mem_f = mem_b = n_tok * case.vocab / tp * 14 / r.bw_mem  # 16-bit logits, fp32 softmax and its grad
    return HeadTime(compute=t_head_comp, memory=mem_f, forward=t_head_comp + mem_f,
                    backward=2 * t_head_comp + mem_b, embedding=2 * r.ab * n_tok * h / r.bw_mem, memory_b=mem_b)


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
        crosses = net.group(case, tp * cp * case.dp, 2).domains > 1
        p2p = net.send_recv(net.fabric(case, c), crosses,
                            r.ab * tokens_per_micro_batch(case) * case.hidden / (tp if case.sequence_parallel else 1))
    per_layer = layer.forward + layer.backward
    p2p_rank = 2 * vp * p2p if pp > 1 else 0.0
    # multi-token prediction: each MTP module (one more layer and logit head) runs on the last stage
    head_fb = (head.forward + head.backward) * (1 + case.mtp_layers) + case.mtp_layers * (layer.forward + layer.backward)
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
    tp, pp = case.tp, case.pp
    p = parameter_counts(sh)
    n_stage = max(rank_layers(case))
    dense_dev = (p["attention"] + p["mlp"] + p["router"] + p["norms"]) / case.layers * n_stage / tp
    # spread: the first/last stage hold them; tied weights over several stages keep a copy on the last
    head = p["head"] or (p["embedding"] if pp > 1 else 0.0)
    dense_dev += (p["embedding"] + head) / tp / pp
    expert_dev = p["experts"] / case.layers * n_stage / (case.expert_tp * case.ep)
    d_dense = case.dp * case.cp
    return LocalParameters(dense=dense_dev, expert=expert_dev, dense_group=d_dense,
                           expert_group=moe.expert_dp(case)[1] if case.is_moe else max(1, d_dense // case.ep))


def data_parallel_time(case: Case, c: Coefficients, params: LocalParameters, slowest_rank: float) -> tuple[float, float]:
    """(exposed DP gradient reduction, exposed FSDP gathers and reductions) of one step.

    Collectives are costed by :mod:`powertrain.predict.network` on the groups' real placement
    (dense replicas ``tp`` apart over dp·cp; expert replicas over the expert-DP group). Overlap by
    mechanism: DDP and the distributed optimizer reduce gradients bucket by bucket during the last
    micro-batch's backward (all but the last bucket can hide; with interleaving, chunks finish
    during the cool-down, half a micro-batch more per extra chunk); the distributed optimizer's
    parameter all-gather hides behind the next step's first forward; FSDP prefetches each layer's
    gather behind the previous layer's compute, every micro-batch, the first layer's gather exposed.
    LoRA reduces (and a distributed optimizer gathers) the adapters only, small enough to sit in the
    last bucket, so exposed; FSDP gathers the frozen weights as ever.
    ``slowest_rank``: one micro-batch (fwd + bwd) on the critical rank, ~1/3 forward.
    """
    pp, vp = case.pp, case.vp
    dense_dev, expert_dev = params.dense, params.expert
    # what trains, so has its gradients reduced (and, with a distributed optimizer, is gathered again): every
    # weight, or with LoRA the adapters alone; FSDP still gathers the frozen weights for both passes
    train_d, train_e = lora.adapter_parameters_on(case, max(rank_layers(case))) if case.lora else (dense_dev, expert_dev)
    f = net.fabric(case, c)
    g_d = net.group(case, case.tp, params.dense_group)
    e_stride = moe.expert_dp(case)[0] if case.is_moe else case.tp * case.cp * case.ep
    g_e = net.group(case, e_stride, params.expert_group)
    # DeepSpeed ZeRO-3 reduce-scatters gradients in the model's 16-bit dtype (its communication_data_type
    # defaults to the parameters' dtype); Megatron and FSDP2 reduce fp32 gradients
    grad_b = ZERO3_GRAD_BYTES if case.fsdp_per_param else GRAD_BYTES
    t_f_stage = slowest_rank / 3  # ~ forward share of one micro-batch on the critical rank
    t_b_stage = slowest_rank - t_f_stage

    def half(nbytes_dense: float, nbytes_expert: float) -> float:
        return net.reduce_scatter(f, g_d, nbytes_dense) + net.reduce_scatter(f, g_e, nbytes_expert)

    if case.fsdp and case.fsdp_per_param and g_d.domains > 1:
        # one channel per small collective: a ring per rank on its own NIC share (in_domain = 1)
        g_d = net.Group(g_d.size, 1, g_d.span, g_d.size)
    if case.fsdp:
        ag = half(dense_dev * 2, expert_dev * 2)
        rs = half(train_d * grad_b, train_e * grad_b)
        # FSDP prefetches the next layer's gather; DeepSpeed ZeRO-3 too (stage3_prefetch_bucket_size, its
        # overlap_comm defaults on for stage 3: ZeRO-Infinity's overlap-centric design, SC'21 §6)
        ovl = c.overlap_eff if case.overlap_fsdp else 0.0
        ag_b = ag if case.fsdp_reshard else 0.0  # weights kept gathered from the forward need no second gather
        per_mb = max(0.0, ag - ovl * t_f_stage) + max(0.0, ag_b + rs - ovl * t_b_stage)
        return 0.0, case.micro_batches * per_mb + ag / max(1, max(rank_layers(case)))
    if case.distributed_optimizer and not case.owner_broadcast_optimizer:
        rs = half(train_d * grad_b, train_e * grad_b)
        ag = half(train_d * 2, train_e * 2)
    else:
        rs = net.all_reduce(f, g_d, train_d * grad_b) + net.all_reduce(f, g_e, train_e * grad_b)
        ag = owner_broadcasts(case, f, g_d, g_e, train_d, train_e) if case.distributed_optimizer else 0.0
    if case.overlap_dp:
        window = t_b_stage * (1 + (vp - 1) / vp * 0.5 * (pp > 1))
        last_bucket = rs * min(1.0, case.dp_bucket_params / max(1.0, train_d + train_e))
        dp_exposed = max(last_bucket, rs - c.overlap_eff * window)
    else:
        dp_exposed = rs
    if case.overlap_param_gather:
        dp_exposed += max(0.0, ag - c.overlap_eff * t_f_stage)
    else:
        dp_exposed += ag
    return dp_exposed, 0.0


def owner_broadcasts(case: Case, f: net.Fabric, g_d: net.Group, g_e: net.Group, dense_dev: float,
                     expert_dev: float) -> float:
    """powertrain's trainer's ZeRO-1 after the step: every parameter tensor broadcast from its owner.

    The volume of an all-gather of the rank's parameters (in their training dtype), but one collective
    call per tensor, each paying one message latency: the calls come back to back from the same loop
    in every rank, so they do not wait on a late peer the way in-step collectives do. A rank's
    tensors: per layer the four attention projections, two or three MLP matrices (stacked over a
    layer's local experts, plus the router, in an MoE layer) and two norms; the embedding, final norm
    and head spread over the pipeline stages.
    """
    if g_d.size <= 1 and g_e.size <= 1:
        return 0.0
    pbytes = 4.0 if case.precision in ("fp32", "tf32") else 2.0
    mats = 3 if case.gated else 2
    per_layer = 4 + mats + 2 + (1 if case.is_moe else 0)
    tensors = max(1.0, case.layers / case.pp * per_layer + 3 / case.pp)
    vol = net.all_gather(f, g_d, dense_dev * pbytes) + net.all_gather(f, g_e, expert_dev * pbytes)
    return vol + tensors * f.up_lat


# --- optimizer ------------------------------------------------------------------------------------------

def optimizer_time(case: Case, params: LocalParameters, r: Rates) -> float:
    """The optimizer step: ~32 bytes per local (sharded) parameter plus reading the gradients (LoRA: the
    adapters' only)."""
    sharded = case.fsdp or case.distributed_optimizer
    shard = params.dense_group if sharded else 1
    shard_e = params.expert_group if sharded else 1
    per_param, grads = engines.optimizer_bytes(case)  # the engine's optimizer kernels (predict/engines.py)
    # what the optimizer updates: every local parameter, or with LoRA the adapters alone (a frozen weight has no
    # gradient and no state)
    dense, expert = lora.adapter_parameters_on(case, max(rank_layers(case))) if case.lora else (params.dense, params.expert)
    return ((dense / shard + expert / shard_e) * per_param + (dense + expert) * grads) / r.bw_mem


# --- the step -----------------------------------------------------------------------------------------

def step_time(case: Case, c: Coefficients, clock: float = 1.0, shape: Shape | None = None) -> StepTime:
    """Predict one step's time at clock ratio ``clock`` (≤ 1: a power limit, a lock or heat lowers the SM
    clock). The parts are costed at the maximum clock; :func:`~powertrain.predict.timeline.compose_step`
    puts them together at the clock (compute-bound time ÷ clock, the rest as is), the one formula for the
    step at any clock — also when pipeline stages run at different clocks (predict/governor.py)."""
    sh = shape or shape_of(case)
    r = compute_rates(case, c)
    layer = mean_layer(case, c, r, layer_flops_per_token(sh))
    head = head_time(case, r)
    pipe = pipeline_time(case, c, r, layer, head)
    params = local_parameters(case, sh)
    dp_exposed, fsdp_exposed = data_parallel_time(case, c, params, pipe.slowest_rank)
    t_opt = optimizer_time(case, params, r)
    work = step_work(case, c, layer, head, pipe, dp_exposed, fsdp_exposed, t_opt)
    m, pp = case.micro_batches, case.pp
    n_layers_dev = case.layers / pp
    full = StepTime(total_s=compose_step(work, 1.0).total_s,
                    breakdown=_breakdown(case, c, layer, head, pipe, dp_exposed, fsdp_exposed, t_opt),
                    compute_s=m * pipe.compute_all_ranks / pp,
                    memory_s=m * (n_layers_dev * (layer.memory_f + layer.b_memory) + 2 * head.memory / pp) + t_opt,
                    work=work, clock=1.0)
    return full if clock == 1.0 else at_clocks(full, clock)


def at_clocks(full: StepTime, clocks: dict[str, float] | float) -> StepTime:
    """The step ``full`` (costed at the maximum clock) with its pipeline stages at ``clocks`` (a number: all at
    it): :func:`~powertrain.predict.timeline.compose_step` for the total, the clock-bound parts of the breakdown
    stretched by the ranks' mean 1/clock."""
    work = full.work
    assert work is not None
    composed = compose_step(work, clocks)
    ranks = sum(s.ranks for s in work.stages)
    inv = sum(s.ranks / float(clocks if isinstance(clocks, float | int) else clocks.get(s.name, 1.0))
              for s in work.stages) / ranks
    bd = dict(full.breakdown)
    bd["compute_s"] = bd["compute_s"] * inv
    bd["pp_bubble_s"] = composed.bubble_s
    mean_mb = sum(s.ranks * s.mean_scale * composed.micro_batch_s[s.name] for s in work.stages) / work.pp
    bd["pp_stage_imbalance_s"] = composed.busy_s - work.micro_batches * mean_mb
    return StepTime(total_s=composed.total_s, breakdown=bd, compute_s=full.compute_s * inv, memory_s=full.memory_s,
                    work=work, clock=1.0 / inv)


def step_work(case: Case, c: Coefficients, layer: LayerTime, head: HeadTime, pipe: PipelineTime,
              dp_exposed: float, fsdp_exposed: float, t_opt: float) -> StepWork:
    """The step's work by kind, per kind of pipeline stage (the first, the fullest middle rank, the last; one
    kind without pipelining), per chunk — the parts :func:`pipeline_time` sums, so that
    ``compose_step(step_work(...), 1)`` is that step exactly.

    A stage of ``n`` layers: its layers' forward and backward parts; the last adds the logit layer, the loss
    and any multi-token-prediction modules; the first the embedding (forward, backward, update). A chunk is
    a micro-batch's share of one virtual stage (÷ v)."""
    m, pp, vp = case.micro_batches, case.pp, case.vp
    layers = rank_layers(case)
    mtp = case.mtp_layers
    sends = 2 * pipe.p2p if pp > 1 else 0.0

    def kind(name: str, ranks: int, n: float, first: bool, last: bool, scale: float = 1.0) -> StageWork:
        n_eff = n + (mtp if last else 0)  # MTP modules run one more layer each on the last stage
        hc = head.compute * (1 + mtp) if last else 0.0
        hm = head.memory * (1 + mtp) if last else 0.0
        hm_b = head.memory_b * (1 + mtp) if last else 0.0
        emb = head.embedding if first else 0.0
        longest = max(layer.longest_f, head.compute if last else 0.0)
        fwd = PassWork(compute=(n_eff * layer.compute_f + hc) / vp, memory=(n_eff * layer.memory_f + hm + emb) / vp,
                       comm=n_eff * layer.comm_f / vp, host=n_eff * layer.overhead_f / vp, longest=longest,
                       passes=max(1.0, n_eff / vp))
        bwd = PassWork(compute=(n_eff * layer.b_compute + 2 * hc) / vp,
                       memory=(n_eff * layer.b_memory + hm_b + 2 * emb) / vp, comm=n_eff * layer.b_comm / vp,
                       host=n_eff * layer.b_host / vp, longest=max(longest, 2 * layer.attention_f),
                       passes=max(1.0, n_eff / vp))
        return StageWork(name=name, ranks=ranks, fwd=fwd, bwd=bwd, sends=sends, mean_scale=scale)

    if pp == 1:
        stages: tuple[StageWork, ...] = (kind("all", 1, layers[0], True, True),)
    else:
        stages = (kind("first", 1, layers[0], True, False),)
        if pp > 2:
            mids = layers[1:-1]
            full = max(mids)
            per_layer = layer.forward + layer.backward
            scale = (sum(mids) * per_layer + len(mids) * vp * sends) / (len(mids) * (full * per_layer + vp * sends))
            stages += (kind("middle", pp - 2, full, False, False, scale),)
        stages += (kind("last", 1, layers[-1], False, True),)
    return StepWork(stages=stages, micro_batches=m, pp=pp, vp=vp, in_run_comm=fsdp_exposed, tail_comm=dp_exposed,
                    optimizer=t_opt, fixed=c.step_overhead_s, memory_floor=c.memory_clock_floor)


def _breakdown(case: Case, c: Coefficients, layer: LayerTime, head: HeadTime, pipe: PipelineTime,
               dp_exposed: float, fsdp_exposed: float, t_opt: float) -> dict[str, float]:
    """The step's parts (seconds, summed over micro-batches on the mean pipeline rank)."""
    m, pp, vp = case.micro_batches, case.pp, case.vp
    n_layers_dev = case.layers / pp
    comm_passes = 2 + (case.recompute == "full")  # forward, backward and a recomputed forward
    return {
        "compute_s": m * n_layers_dev * layer.compute,
        "memory_bound_s": m * n_layers_dev * (layer.memory_f + layer.b_memory),
        "tp_comm_exposed_s": m * n_layers_dev * comm_passes * layer.tp_f,
        "ep_all_to_all_s": m * n_layers_dev * comm_passes * layer.a2a_f,
        "cp_comm_exposed_s": m * n_layers_dev * 3 * layer.cp_f,
        "pp_p2p_s": m * 2 * vp * pipe.p2p if pp > 1 else 0.0,
        "pp_bubble_s": pipe.bubble,
        "pp_stage_imbalance_s": m * (pipe.slowest_rank - pipe.mean_rank),
        "dp_comm_exposed_s": dp_exposed,
        "fsdp_comm_exposed_s": fsdp_exposed,
        "optimizer_s": t_opt,
        # host time inside each micro-batch's stretch of work; the step's fixed time outside it is apart, so
        # the power model does not count it in a GEMM burst
        "overhead_s": m * n_layers_dev * (layer.overhead_f + layer.b_host),
        "step_overhead_s": c.step_overhead_s,
        "head_s": m * (head.forward + head.backward) / pp,
        "micro_batches": float(m),
    }
