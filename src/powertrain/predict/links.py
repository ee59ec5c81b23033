"""Bytes each device sends per step over each kind of link, and the share of the link's bandwidth that is.

The collectives are the step-time model's own (:mod:`powertrain.predict.steptime`, costed by
:mod:`powertrain.predict.network`), counted here in bytes rather than seconds, per device:

* tensor parallelism: two all-reduces of the layer's ``n·h`` activations per layer and pass (forward,
  backward, a recomputed forward) — all-gather + reduce-scatter with sequence parallelism; a ring sends
  ``2(g−1)/g·S`` per rank, NVLink SHARP (in-switch reduction) ``S``;
* expert parallelism: dispatch and combine all-to-alls per MoE layer and pass, ``(g−1)/g`` of the routed
  volume leaving the rank;
* context parallelism: the K/V ring, ``cp − 1`` exchanges per layer forward, twice that backward;
* pipeline parallelism: one activation (forward) and one gradient (backward) per chunk boundary;
* data parallelism: the gradients' reduction (and the distributed optimizer's parameter gather), FSDP's
  gathers and reduce-scatters.

A group whose members share the device's NVLink domain talks over NVLink; the share of its peers outside
it goes over the node's NICs (the PCIe path to them carries the same bytes). The utilisation is defined as
the measured metric (docs/metrics.md ``link_bw_share``): a device's bytes ÷ the step ÷ its peak bandwidth
per direction on that link (NVLink: the catalog's ``intra_node_bw``; NIC: the node's NICs ÷ its devices).
TP combined with PP moves small, chunked transfers — a pipeline send is one micro-batch's activations once
per chunk — so such layouts show low utilisation where the step is long and the transfers few.
"""

from __future__ import annotations

from dataclasses import dataclass

from powertrain.predict import moe
from powertrain.predict import network as net
from powertrain.predict.case import Case
from powertrain.predict.memory import rank_layers


@dataclass(frozen=True, slots=True)
class LinkTraffic:
    """Bytes one device sends per step over NVLink (its scale-up domain) and over the NICs, and their shares."""

    nvlink_bytes: float
    nic_bytes: float
    nvlink_share: float | None  # of the device's NVLink bandwidth per direction over the step
    nic_share: float | None  # of the device's share of the node's NICs
    by_kind: dict[str, tuple[float, float]]  # parallelism → (NVLink bytes, NIC bytes) per device per step

    def to_dict(self) -> dict[str, object]:
        return {"nvlink_tx_bytes_per_device": self.nvlink_bytes, "nic_tx_bytes_per_device": self.nic_bytes,
                "nvlink_bw_share": self.nvlink_share, "nic_bw_share": self.nic_share,
                "by_kind": {k: {"nvlink_bytes": v[0], "nic_bytes": v[1]} for k, v in self.by_kind.items()}}


def _split(case: Case, stride: int, size: int, per_rank: float) -> tuple[float, float]:
    """(NVLink, NIC) bytes of ``per_rank`` bytes a rank sends spread evenly over a group's other members."""
    if size <= 1 or per_rank <= 0:
        return 0.0, 0.0
    g = net.group(case, stride, size)
    near = (g.in_domain - 1) / (size - 1)
    return per_rank * near, per_rank * (1 - near)


def _ring(size: int, nbytes: float) -> float:
    """Bytes a rank sends in a ring all-reduce of ``nbytes`` (reduce-scatter + all-gather)."""
    return 2 * (size - 1) / size * nbytes if size > 1 else 0.0


def link_traffic(case: Case, step_s: float, dense_params: float, expert_params: float) -> LinkTraffic:
    """Per-device bytes per step over NVLink and NICs (module docstring). ``dense_params``/``expert_params``: the
    parameters one device holds (:func:`powertrain.predict.steptime.local_parameters`)."""
    ab = 4.0 if case.precision in ("fp32", "tf32") else 2.0
    n_tok = case.micro_batch * case.seq_len / case.cp
    m = case.micro_batches
    layers = sum(rank_layers(case)) / case.pp  # the mean stage's
    passes = 3 if case.recompute == "full" else 2
    out: dict[str, tuple[float, float]] = {}
    tp = case.tp
    if tp > 1:
        act = ab * n_tok * case.hidden
        g = net.group(case, 1, tp)
        nvls = case.device.node.nvls and case.device.transport == "nccl" and g.domains <= 1 and tp > 2
        per = act if nvls and not case.sequence_parallel else _ring(tp, act)
        out["tp"] = tuple(x * 2 * passes * layers * m for x in _split(case, 1, tp, per))  # type: ignore[assignment]
    if case.is_moe and case.ep > 1:
        sp = case.tp if case.sequence_parallel or case.etp is not None else 1
        vol = ab * n_tok / sp * case.top_k * case.hidden
        per = 2 * vol * (case.ep - 1) / case.ep  # dispatch + combine
        moe_layers = case.moe_layers * layers / case.layers
        out["ep"] = tuple(x * passes * moe_layers * m for x in _split(case, moe.ep_stride(case), case.ep, per))  # type: ignore[assignment]
    if case.cp > 1:
        hd = case.head_dim or case.hidden // case.heads
        kv_w = (case.kv_lora_rank + case.qk_rope_dim) if case.kv_lora_rank else 2 * case.kv_heads * hd
        kv = ab * n_tok * kv_w / case.tp * (case.cp - 1)
        near, far = _split(case, case.tp, case.cp, kv)
        out["cp"] = (near * 3 * layers * m, far * 3 * layers * m)
    if case.pp > 1:
        p2p = ab * n_tok * case.hidden / (tp if case.sequence_parallel else 1)
        crosses = net.group(case, tp * case.cp * case.dp, 2).domains > 1
        per_step = 2 * p2p * case.vp * m * (case.pp - 1) / case.pp  # the last stage sends no activation onward
        out["pp"] = (0.0, per_step) if crosses else (per_step, 0.0)
    d = case.dp * case.cp
    if d > 1 and not case.lora:
        grads = dense_params * 4.0
        if case.fsdp:
            per = (2 * (d - 1) / d * dense_params * 2.0 + (d - 1) / d * grads) * m  # gathers forward + backward, reduce
        else:
            per = _ring(d, grads) if not case.distributed_optimizer else (d - 1) / d * (grads + dense_params * 2.0)
        out["dp"] = _split(case, case.tp, d, per)
    if expert_params and case.is_moe:
        e_stride, e_size = moe.expert_dp(case)
        if e_size > 1 and not case.lora:
            out["dp_experts"] = _split(case, e_stride, e_size, _ring(e_size, expert_params * 4.0))
    nv = sum(v[0] for v in out.values())
    nic = sum(v[1] for v in out.values())
    node = case.device.node
    nv_peak = node.intra_node_bw if case.world > 1 and case.devices_per_node > 1 else 0.0
    nic_peak = node.nic_count * node.nic_bw / max(1, case.devices_per_node)
    return LinkTraffic(nvlink_bytes=nv, nic_bytes=nic,
                       nvlink_share=nv / step_s / nv_peak if nv_peak and step_s > 0 else None,
                       nic_share=nic / step_s / nic_peak if nic_peak and case.nodes > 1 and step_s > 0 else None,
                       by_kind=out)
