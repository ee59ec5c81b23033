"""Memory per device: parameters, gradients, optimizer states, activations, framework overhead.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", §4) term by term, per layer and micro-batch of ``b`` sequences of ``s``
tokens (``s`` already divided by context parallelism), 16-bit activations:

* replicated across TP unless sequence parallel (then ÷ tp): norms' inputs, the inputs of the QKV
  and first MLP GEMMs, dropout masks: ``10·s·b·h``;
* attention, ÷ tp: Q, K, V (K and V at grouped-query width ``g = kv_heads/heads``) and the output
  projection's input: ``s·b·h·(4 + 4g)``; fused (flash) attention stores no ``s×s`` matrices;
* MLP, ÷ tp: GELU stores ``4·s·b·f`` (fc1 output and activation output), SwiGLU ``6·s·b·f``
  (gate, up, product);
* selective (op-level, as PyTorch's selective activation checkpointing in torchtitan): the layer
  input plus every other GEMM output (Q, K, V, attention output, projections, fc1 outputs) is
  kept, everything else recomputed;
* MoE: each token visits ``top_k`` experts: ``4·s·b·k·h`` (dispatched input, combine buffer) plus
  the expert MLP term at the expert FFN width; shared experts count as a dense MLP;
* full recomputation keeps only each layer's input ``2·s·b·h`` (÷ tp with SP) plus one layer's
  full activations while it is recomputed.

Micro-batches in flight on the first pipeline stage: 1F1B ``min(pp, m)``; interleaved 1F1B
``pp·(1 + (pp−1)/(pp·v))`` (Narayanan et al. 2021); GPipe all ``m``. The last stage also holds the
logits of one micro-batch (``6·s·b·V/tp`` bytes: 16-bit logits and their fp32 softmax).

States per parameter (mixed precision, Adam): 16-bit weights 2 B, fp32 gradients 4 B, fp32 master
weights + two moments 12 B; fp32 training 4 + 4 + 8. DDP replicates all; a distributed optimizer
(ZeRO-1) shards the 12 B over data parallel; FSDP (ZeRO-3) shards all three and holds the current and
the prefetched layer's gathered 16-bit weights. LoRA fine-tuning holds the frozen base weights once, in
their training dtype (as Megatron-Core and NeMo do: no gradient, optimizer state or fp32 master copy for
them; FSDP shards and gathers them as ever), and its adapters (``predict.lora``) with the states of any
trained parameter; activations are costed as in full training (an upper bound: a framework may drop
inputs kept only for a frozen weight's gradient, and the adapters' own ``n·r`` values are negligible).
Dense parameters shard over dp·cp, expert parameters over dp·cp/ep. Framework overhead: a fixed term (CUDA context, communicator buffers) plus an
allocator-fragmentation factor (calibration coefficients). The fixed term is a GPU's: a host-CPU
"device" has no CUDA context and no NCCL buffers, so a CPU rank pays only the fragmentation factor
(its interpreter and torch's own footprint are not model memory and are not counted).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from powertrain.core.flops import Shape, parameter_counts
from powertrain.predict import lora, moe
from powertrain.predict.calibration import Calibration, Coefficients, load_calibration
from powertrain.predict.case import Case, case_from_run_config


def stage_layers(case: Case) -> list[int]:
    """Layers per (virtual) pipeline stage, in order, for the case's split rule."""
    split = case.pp_split
    return list(_stage_layers(case.layers, case.pp, case.vp, tuple(split) if isinstance(split, list) else split))


def rank_layers(case: Case) -> tuple[int, ...]:
    """Layers held by each pipeline rank (its virtual stages summed)."""
    split = case.pp_split
    return _rank_layers(case.layers, case.pp, case.vp, tuple(split) if isinstance(split, list) else split)


@cache
def _rank_layers(layers: int, pp: int, vp: int, split: str | tuple[int, ...]) -> tuple[int, ...]:
    st = _stage_layers(layers, pp, vp, split)
    return tuple(sum(st[r::pp]) for r in range(pp))


@cache
def _stage_layers(layers: int, pp: int, vp: int, split: str | tuple[int, ...]) -> tuple[int, ...]:
    n = pp * vp
    if isinstance(split, tuple):
        if len(split) != n or sum(split) != layers:
            raise ValueError(f"pp_split {list(split)} must list {n} stages summing to {layers} layers")
        return split
    base, extra = divmod(layers, n)
    out = [base + (1 if i < extra else 0) for i in range(n)]
    if split == "study_uneven" and n > 1:
        # The study's split: even-indexed stages one layer more, odd-indexed one fewer.
        for i in range(0, n - 1, 2):
            if out[i + 1] > 1:
                out[i] += 1
                out[i + 1] -= 1
    return tuple(out)


def _bytes_per_param(case: Case) -> tuple[float, float, float]:
    if case.precision in ("fp32", "tf32"):
        return 4.0, 4.0, 8.0
    return 2.0, 4.0, 12.0


def activation_bytes_per_layer(case: Case, recompute: str | None = None) -> float:
    """Stored activation bytes of one layer for one micro-batch (Korthikanti et al. 2022, extended)."""
    rc = recompute or case.recompute
    b, s, h, t = case.micro_batch, case.seq_len / case.cp, case.hidden, case.tp
    # the formulas count 16-bit values; fp32 training stores twice the bytes
    sbh = s * b * h * (2 if case.precision in ("fp32", "tf32") else 1)
    rep = 10 * sbh / (t if case.sequence_parallel else 1)
    if rc == "full":
        return 2 * sbh / (t if case.sequence_parallel else 1)
    g = case.kv_heads / case.heads
    k = case.top_k if case.is_moe else 1
    f_tok = case.expert_ffn * k + case.ffn * case.shared_experts if case.is_moe else case.ffn
    mats = 3 if case.gated else 2
    if rc == "selective":
        # PyTorch-native selective (op-level) checkpointing: keep the layer input and every other
        # GEMM output (Q/K/V, attention output, projections, fc1 outputs), recompute the rest
        gemm_out = 2 * sbh * (1 + 2 * g) + 2 * sbh + 2 * sbh + 2 * s * b * (mats - 1) * f_tok / 1 + 2 * sbh * k
        return 2 * sbh / (t if case.sequence_parallel else 1) + 0.5 * gemm_out / t
    attn = sbh * (4 + 4 * g) / t
    act_mult = 6 if case.gated else 4
    if case.is_moe:
        mlp = 4 * sbh * k + act_mult * s * b * k * case.expert_ffn / t
        if case.shared_experts:
            mlp += act_mult * s * b * case.ffn * case.shared_experts / t
    else:
        mlp = act_mult * s * b * case.ffn / t
    return rep + attn + mlp


def in_flight_microbatches(case: Case) -> float:
    """Micro-batches whose activations the first pipeline stage holds at the peak."""
    m = case.micro_batches
    if case.pp == 1:
        return 1.0
    if case.pp_schedule == "gpipe":
        return float(m)
    if case.vp > 1:
        return min(float(m), case.pp * (1 + (case.pp - 1) / (case.pp * case.vp)))
    return float(min(case.pp, m))


def memory_per_device(case: Case, coeffs: Coefficients | None = None,
                      shape: Shape | None = None) -> tuple[float, dict[str, float]]:
    """Peak bytes on the busiest device (the larger of the first and the last pipeline stage)."""
    c = coeffs or Coefficients()
    p = parameter_counts(shape or case)
    per_rank = rank_layers(case)
    dense_layer = (p["attention"] + p["mlp"] + p["router"] + p["norms"]) / case.layers / case.tp
    # experts split over etp·ep ranks and replicated over the expert-data-parallel group: the same
    # placement the step time costs (moe.expert_dp), folded (etp given) or not
    expert_layer = p["experts"] / case.layers / (case.expert_tp * case.ep)
    w_b, g_b, o_b = _bytes_per_param(case)
    dp_shard = case.dp * case.cp
    ep_shard = moe.expert_dp(case)[1]
    act_layer = activation_bytes_per_layer(case)
    inflight = in_flight_microbatches(case)
    best: dict[str, float] | None = None
    for stage in {0, case.pp - 1}:
        n = per_rank[stage]
        dense = dense_layer * n + (p["embedding"] / case.tp if stage == 0 else 0.0)
        dense += p["head"] / case.tp if stage == case.pp - 1 else 0.0
        if stage == case.pp - 1 and p["head"] == 0.0 and case.pp > 1:
            dense += p["embedding"] / case.tp  # tied weights: the last stage keeps a copy
        experts = expert_layer * n
        # what trains: every weight, or with LoRA the adapters alone beside the frozen base weights, which
        # are held once in their training dtype (no gradient, optimizer state or fp32 master copy)
        t_dense, t_experts = lora.adapter_parameters_on(case, n) if case.lora else (dense, experts)
        if case.lora:
            dense, experts = dense + t_dense, experts + t_experts
        if case.fsdp:
            weights = (dense / dp_shard + experts / ep_shard) * w_b
            grads = (t_dense / dp_shard + t_experts / ep_shard) * g_b
            optim = (t_dense / dp_shard + t_experts / ep_shard) * o_b
            # the current and the prefetched layer's gathered 16-bit weights; without resharding after the
            # forward every layer's stay gathered until its backward
            gathered = (2 if case.fsdp_reshard else n) * (dense_layer + expert_layer) * w_b
        else:
            weights = (dense + experts) * w_b
            grads = (t_dense + t_experts) * g_b
            if case.distributed_optimizer:
                optim = (t_dense / dp_shard + t_experts / ep_shard) * o_b
            else:
                optim = (t_dense + t_experts) * o_b
            gathered = 0.0
        inflight_here = inflight if (case.pp > 1 and stage == 0) else 1.0
        acts = act_layer * n * inflight_here
        if case.recompute == "full":
            acts += activation_bytes_per_layer(case, "none")  # the layer being recomputed
        logits = (8 if case.precision in ("fp32", "tf32") else 6) * case.micro_batch * case.seq_len / case.cp * case.vocab / case.tp if stage == case.pp - 1 else 0.0
        subtotal = weights + grads + optim + gathered + acts + logits
        overhead = (0.0 if case.device.is_host_cpu else c.mem_overhead_bytes) + subtotal * (c.mem_fragmentation - 1)
        bd = {"weights": weights, "gradients": grads, "optimizer": optim, "fsdp_gathered": gathered,
              "activations": acts, "logits": logits, "overhead": overhead, "total": subtotal + overhead,
              "stage": float(stage), "in_flight_microbatches": inflight_here}
        if best is None or bd["total"] > best["total"]:
            best = bd
    assert best is not None
    return best["total"], best


def fits(run_config: Any, calibration: Calibration | str | None = None) -> tuple[bool, float, dict[str, float]]:
    """Whether ``run_config`` (a RunConfig or a Case) fits in device memory.

    Returns ``(fits, bytes_per_device, breakdown)``; the breakdown adds ``capacity_bytes``. The planner
    calls this to reject runs before launch.
    """
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    case = run_config if isinstance(run_config, Case) else case_from_run_config(run_config, calibration=cal)
    total, bd = memory_per_device(case, cal.coefficients)
    bd = dict(bd, capacity=case.device.memory_bytes, capacity_bytes=case.device.memory_bytes)
    return total <= case.device.memory_bytes, total, bd


def least_recompute_that_fits(case: Case, coeffs: Coefficients | None = None) -> str:
    """The cheapest recompute mode (none, then selective, then full) under which ``case`` fits.

    For runs whose recompute setting is not stated: a framework that has to fit recomputes.
    Returns ``full`` when nothing fits (the caller then reports the run as not fitting).
    """
    from dataclasses import replace

    for mode in ("none", "selective", "full"):
        if memory_per_device(replace(case, recompute=mode), coeffs)[0] <= case.device.memory_bytes:
            return mode
    return "full"
