"""LoRA fine-tuning in the predictor: the adapters' parameters on one device and their share of a step.

A LoRA case (``Case.lora_rank`` > 0) trains only adapters beside frozen base weights
(:mod:`powertrain.core.lora` holds their shapes). What that changes, and where it is costed:

* memory (:func:`powertrain.predict.memory.memory_per_device`): the frozen weights are held once in
  their training dtype (Megatron-Core / NeMo keep no fp32 master copy, gradient or optimizer state
  for a frozen weight; FSDP still shards and gathers them); the adapters add weights, fp32 gradients
  and optimizer states like any trained parameter (:func:`adapter_parameters_on`);
* a layer's backward (:func:`backward_factor`, used by ``steptime.layer_time``): the frozen GEMMs
  compute activation gradients only (1 × their forward instead of 2 ×); the attention core, the
  elementwise work, the CP exchange and the host time keep their full backward; the adapters' GEMMs
  run forward and backward (activation and weight gradients: 3 × their forward) with their
  tensor-parallel collectives (:func:`adapter_tp_time`);
* the optimizer step and the data-parallel reduction cover the adapters only (``steptime.optimizer_time``,
  ``steptime.data_parallel_time``).

Adapters are split over tensor parallelism as Megatron-Core's ``ParallelLinearAdapter`` and the
built-in trainer split them (``workload.parallel.tensor_parallel``): a column-parallel base's ``A``
split along the rank with its output gathered, its ``B`` split like the base; a row-parallel base's
``A`` split along the input with its output all-reduced, its ``B`` split along the output and
gathered. Each adapter weight is thus 1/tp per device (1/etp for an expert's, over ``experts/ep``
local experts).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from powertrain.core.flops import shape_of
from powertrain.core.lora import Lora, layer_adapters
from powertrain.core.lora import adapter_parameters as model_adapter_parameters
from powertrain.predict import moe
from powertrain.predict import network as net
from powertrain.predict.calibration import Coefficients
from powertrain.predict.case import Case

if TYPE_CHECKING:
    from powertrain.predict.steptime import Rates


def of(case: Case) -> Lora:
    """The case's adapters (rank and targets); only meaningful where ``case.lora``."""
    return Lora(case.lora_rank, case.lora_targets)


def adapter_parameters_on(case: Case, layers: float) -> tuple[float, float]:
    """(dense, expert) adapter parameters one device holds for ``layers`` of its layers: the model's mean
    per layer, dense ones split over tp, expert ones over etp × ep (as the base weights are)."""
    if not case.lora:
        return 0.0, 0.0
    p = model_adapter_parameters(shape_of(case), of(case))
    per_layer = 1.0 / max(1, case.layers)
    return (p["dense"] * per_layer * layers / case.tp,
            p["experts"] * per_layer * layers / (case.expert_tp * case.ep))


def adapter_forward_time(case: Case, c: Coefficients, r: Rates, dense: bool = False) -> float:
    """One layer's adapters, forward, one micro-batch on one device: both GEMMs of each adapter at the
    GEMM roofline (a rank-r GEMM is thin, so mostly its traffic) plus the scale-and-add of the update
    into the base output (read both, write one). ``dense``: a dense layer of an MoE model."""
    rank = case.lora_rank
    n = case.micro_batch * case.seq_len / case.cp
    # adapters are plain linear layers in the activations' dtype (no fp8/fp4 recipe: Megatron-Core's and
    # PEFT's are bf16 modules), so their GEMMs run at the 16-bit rate and move 16-bit operands
    r = replace(r, peak=r.peak16, eb_bw=r.ab / r.bw_mem, q=0.0)
    t = 0.0
    for a in layer_adapters(shape_of(case), case.lora_targets, case.is_moe and not dense):
        if a.routed:  # every local expert's adapter, on the tokens routed to it (the busiest expert's)
            split, m = case.expert_tp, moe.tokens_per_expert(case, n) * moe.routed_load(case, c)
            count = a.copies / case.ep
        else:
            split, m, count = case.tp, n, 1.0
        if a.row_parallel:  # A on the input shard the base holds; B split along the output, then gathered
            gemms = r.gemm(m, a.d_in / split, rank) + r.gemm(m, rank, a.d_out / split)
            # added to the base's reduced output: whole on every rank, or its sequence shard under SP
            added = m * a.d_out / (split if case.sequence_parallel or a.routed else 1)
        else:  # A split along the rank (its output gathered); B split along the output like the base
            gemms = r.gemm(m, a.d_in, rank / split) + r.gemm(m, rank, a.d_out / split)
            added = m * a.d_out / split
        t += count * (gemms + 3 * r.ab * added / r.bw_mem)
    return t


def adapter_tp_time(case: Case, c: Coefficients, r: Rates, dense: bool = False) -> float:
    """The adapters' tensor-parallel collectives of one layer, forward and backward (the dense layers'
    adapters; an expert's adapters work on tokens already dispatched to it).

    Column-parallel base: the gather of ``A x`` (n·r values) forward, the all-reduce of its gradient
    backward. Row-parallel base: the all-reduce of the partial ``A x`` and the gather of the update
    (n·d_out values) forward, the all-reduce of ``A x``'s gradient backward. On gloo each call also pays
    a rendezvous, as in ``steptime.tp_comm_time``. Not overlapped: TP-communication overlap (Transformer
    Engine's userbuffers) covers the base layers' GEMMs only."""
    tp = case.tp
    if tp <= 1:
        return 0.0
    from powertrain.predict.steptime import GLOO_CALL_LATENCIES  # steptime imports this module

    f, g = net.fabric(case, c), net.group(case, 1, tp)
    n = case.micro_batch * case.seq_len / case.cp
    small = r.ab * n * case.lora_rank
    t, calls = 0.0, 0
    for a in layer_adapters(shape_of(case), case.lora_targets, case.is_moe and not dense):
        if a.routed:
            continue
        if a.row_parallel:
            t += 2 * net.all_reduce(f, g, small) + net.all_gather(f, g, r.ab * n * a.d_out)
            calls += 3
        else:
            t += net.all_gather(f, g, small) + net.all_reduce(f, g, small)
            calls += 2
    if case.device.transport == "gloo":
        t += calls * GLOO_CALL_LATENCIES * f.up_lat
    return t


def backward_factor(case: Case, c: Coefficients, r: Rates, t_comp_f: float, t_attn: float, t_rest: float,
                    dense: bool = False) -> float:
    """The multiplier ``bwd`` that ``steptime.layer_time`` applies to a LoRA layer's forward parts to get
    its backward: ``t_comp_f`` (GEMMs and attention core, of which ``t_attn`` the core) and ``t_rest``
    (the other forward parts it scales the same way: CP exchange, host time and, unless the engine
    costs the backward's memory traffic apart, the elementwise work). ``bwd · (t_comp_f + t_rest)`` =

    * the frozen GEMMs' activation gradients, ``1 ×`` their forward ``(t_comp_f − t_attn)``,
    * the attention core's backward, ``2 × t_attn`` (no weights there: as in full training),
    * the rest's backward, ``2 × t_rest`` (as in full training),
    * the adapters' GEMMs, forward and backward ``3 ×`` :func:`adapter_forward_time`, and their TP
      collectives :func:`adapter_tp_time` — carried in the backward because the layer's forward
      (``steptime.layer_compute``) costs the base model.

    One factor for all those parts keeps the layer's total (forward + backward, what a pipeline stage
    and the step add up) exact; the split of its backward between compute and the rest is then
    approximate (compute slightly over, the rest under, by ``(2 − bwd) · t_rest``). Full recomputation
    repeats the base layer's forward only: the adapters' own forward again (about 1 % of a layer at
    TP 1) is left out.
    """
    fwd = t_comp_f + t_rest
    if fwd <= 0:
        return 1.0
    base = (t_comp_f - t_attn) + 2 * t_attn + 2 * t_rest
    adapters = 3 * adapter_forward_time(case, c, r, dense) + adapter_tp_time(case, c, r, dense)
    return (base + adapters) / fwd
