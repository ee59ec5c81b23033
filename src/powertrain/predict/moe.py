"""Mixture-of-experts layers: where experts sit, what they compute, what routing moves.

**Placement (parallel folding).** Megatron-Core lays out the expert layers on their own mesh,
``etp`` (expert tensor parallel) fastest, then ``ep``, then expert data parallel: an EP group is
``ep`` ranks ``etp`` apart and may span the attention's TP, CP and DP ranks (e.g. EP64 with DP32,
TP2, ETP1). A case without ``etp`` keeps the older placement: experts split like the dense layers
over ``tp`` and EP groups inside DP (ranks ``tp·cp`` apart).

**Compute.** Each EP×ETP group holds every expert once. Balanced, a rank's routed expert FLOPs are
``n·k·F_expert/tp`` whatever ep and etp are; what they change is the GEMM shape: ``E/ep`` local
experts, each a grouped-GEMM member of ``n·ep·etp·k/(tp·E)`` tokens by ``ffn_e/etp`` — the shape
factor of the GEMM model charges small experts and few tokens per expert. Dropless routing runs at
the busiest rank's load (``moe_imbalance``); a capacity factor ``cf`` pads every expert to
``cf`` × the mean instead (tokens beyond it are dropped). Shared experts have their own width
(DeepSeek-V3: one of 2048, not the dense 18432) and run at the TP split of the dense layers.

**Routing cost from memory traffic** (no fitted per-layer constant): the router GEMM, its softmax
and top-k over ``E`` scores, then permute and un-permute of every routed copy (read + write of
``h`` values each), gate scaling, and, with ETP > 1, the gather of tokens across the ETP group.
The host cost that remains is the dropless dispatcher's device-to-host sync of per-expert token
counts (one per MoE layer forward and backward): the GPU drains its queue and waits for the CPU
to launch the rest of the layer; ``moe_layer_overhead_s`` is that time, with a physical range of
20–400 µs (a CUDA sync round trip of ~10–20 µs plus tens of kernel launches of ~5 µs).

**All-to-all.** Dispatch and combine, forward and backward: each rank sends its ``n/tp`` tokens
(SP-sharded) × ``k`` copies × ``h`` values, ``(ep−1)/ep`` of it away, costed by
:func:`powertrain.predict.network.all_to_all` on the ranks' real placement. With EP dispatcher
overlap (Megatron's ``overlap_moe_expert_parallel_comm``/DeepEP-style 1F1B overlap) it hides
behind another micro-batch's compute; with shared experts, Megatron overlaps the shared expert's
GEMMs with the dispatch (``moe_shared_expert_overlap``).
"""

from __future__ import annotations

from powertrain.predict import network as net
from powertrain.predict.calibration import Coefficients
from powertrain.predict.case import Case

# Bytes moved per routed copy of a token per forward, in units of ``h`` activation values:
# permute (read + write), un-permute (read + write), gate scaling (read + write) — 6 passes.
PERMUTE_PASSES = 6.0


def ep_stride(case: Case) -> int:
    """Rank distance between members of an EP group (folded: etp; older placement: tp·cp)."""
    return case.etp if case.etp is not None else case.tp * case.cp


def expert_dp(case: Case) -> tuple[int, int]:
    """(stride, size) of the group that holds replicas of one expert (reduces its gradients)."""
    etp, ep = case.expert_tp, case.ep
    stage = case.tp * case.cp * case.dp
    size = max(1, stage // (etp * ep))
    return etp * ep if case.etp is not None else case.tp * case.cp * ep, size


def routed_load(case: Case, c: Coefficients) -> float:
    """Tokens the busiest expert processes ÷ the balanced mean: capacity factor, else imbalance."""
    imb = case.moe_imbalance if case.moe_imbalance is not None else c.moe_imbalance
    if case.capacity_factor is not None:  # tokens past capacity are dropped: the load stops there
        return min(imb, max(1.0, case.capacity_factor))
    return imb


def tokens_per_expert(case: Case, n_tok: float) -> float:
    """Balanced tokens one local expert sees per micro-batch on one rank."""
    return n_tok * case.ep * case.expert_tp * case.top_k / (case.tp * case.experts)


def expert_gemm_time(case: Case, c: Coefficients, gemm: object, n_tok: float) -> float:
    """Routed experts' GEMMs of one MoE layer's forward on the busiest rank (grouped GEMM)."""
    local = max(1.0, case.experts / case.ep)
    m = tokens_per_expert(case, n_tok) * routed_load(case, c)
    fe = case.expert_ffn / case.expert_tp
    mats = 3 if case.gated else 2
    g = gemm  # Rates.gemm: one grouped launch of the local experts, whose tiles fill the waves together
    t = g(m, case.hidden, (mats - 1) * fe, local) + g(m, fe, case.hidden, local)  # type: ignore[operator]
    # a grouped GEMM reaches less than one dense GEMM of the same shape: per-expert tails, the
    # group's scheduling and (fp8) per-expert scaling (grouped_gemm_eff, 0.5-1.0)
    return t / c.grouped_gemm_eff if local > 1 else t


def shared_gemm_time(case: Case, gemm: object, n_tok: float) -> float:
    """Shared experts and router GEMMs of one MoE layer's forward (TP-split like the dense MLP)."""
    g = gemm
    h, tp = case.hidden, case.tp
    t = g(n_tok, h, case.experts)  # type: ignore[operator]  # router logits (replicated over TP)
    fs = case.shared_width
    if fs:
        mats = 3 if case.gated else 2
        t += g(n_tok, h, (mats - 1) * fs / tp) + g(n_tok, fs / tp, h)  # type: ignore[operator]
    return t


def routing_bytes(case: Case, c: Coefficients, ab: float, n_tok: float) -> float:
    """HBM bytes of routing in one MoE layer's forward on one rank: router softmax/top-k, permute,
    un-permute and gate scaling of every routed copy, and the ETP token gather."""
    sp = case.tp if case.sequence_parallel or case.etp is not None else 1
    tokens = n_tok / sp  # tokens this rank routes
    load = routed_load(case, c)
    b = tokens * case.experts * 4 * 3  # fp32 scores: write logits, softmax read/write, top-k read
    b += PERMUTE_PASSES * tokens * case.top_k * case.hidden * ab * load
    if case.expert_tp > 1:
        b += 2 * tokens * case.top_k * case.hidden * ab * (case.expert_tp - 1)
    return b


def all_to_all_time(case: Case, c: Coefficients, ab: float, n_tok: float, f: net.Fabric) -> float:
    """Dispatch + combine all-to-alls of one MoE layer's forward (the backward has as many)."""
    if not (case.is_moe and case.ep > 1):
        return 0.0
    sp = case.tp if case.sequence_parallel or case.etp is not None else 1
    vol = ab * n_tok / sp * case.top_k * case.hidden * routed_load(case, c)
    g = net.group(case, ep_stride(case), case.ep)
    return 2 * net.all_to_all(f, g, vol)


# Case fields a published record (or a user's model/parallel mapping) may state directly.
_MODEL_FIELDS = ("head_dim", "shared_ffn", "dense_layers", "q_lora_rank", "kv_lora_rank", "qk_rope_dim",
                 "v_head_dim", "mtp_layers")
_ALIASES = {"first_k_dense_replace": "dense_layers", "first_k_dense": "dense_layers", "moe_layer_freq": "",
            "qk_rope_head_dim": "qk_rope_dim", "qk_nope_head_dim": "head_dim", "num_nextn_predict_layers": "mtp_layers",
            "shared_expert_ffn": "shared_ffn", "shared_expert_intermediate_size": "shared_ffn"}


def enrich_case(case: Case, record: dict[str, object]) -> Case:
    """The architecture, recipe and layout details a published run states or implies, on its Case.

    From the record: model fields named like Case's (or their Hugging Face config names), else the
    details of a public model its name matches (:func:`powertrain.spec.model.architecture_details`);
    ``parallel.etp`` (parallel folding); ``parallel.ep_overlap`` (EP dispatcher overlap); the fp8/fp4
    recipe from the precision text; ``mtp``; ``moe_token_drop`` (capacity factor 1). A run that states no ``etp`` keeps the older placement
    (EP inside DP) unless only folding can hold its layout (``published._expert_placement``).
    """
    from dataclasses import replace

    from powertrain.predict.precision import recipe_from_text
    from powertrain.spec.model import architecture_details

    model = record.get("model") if isinstance(record.get("model"), dict) else {}
    par = record.get("parallel") if isinstance(record.get("parallel"), dict) else {}
    assert isinstance(model, dict) and isinstance(par, dict)
    upd: dict[str, object] = dict(architecture_details(str(model.get("name", ""))))
    for k, v in model.items():
        name = _ALIASES.get(k, k)
        if name in _MODEL_FIELDS and isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            upd[name] = int(v)
    mtp = record.get("mtp")
    if isinstance(mtp, int) and not isinstance(mtp, bool) and mtp >= 0:
        upd["mtp_layers"] = mtp
    elif mtp is False:
        upd["mtp_layers"] = 0
    if case.is_moe:
        etp = par.get("etp") or par.get("expert_tensor_parallel")
        if isinstance(etp, int) and etp > 0:
            upd["etp"] = etp
        if record.get("moe_token_drop") is True:
            upd["capacity_factor"] = 1.0
        if par.get("ep_overlap") is True:  # the EP all-to-all hidden behind another micro-batch (1F1B A2A overlap)
            upd["overlap_ep"] = True
    upd["recipe"] = recipe_from_text(str(record.get("precision", "")), case.precision)
    if par.get("zero") == 3 and "deepspeed" in str(record.get("framework", "")).lower():
        upd["fsdp_per_param"] = True
    hd = upd.get("head_dim")
    if isinstance(hd, int) and not upd.get("kv_lora_rank") and hd * case.heads == case.hidden:
        upd.pop("head_dim")  # the plain width: nothing to change
    return replace(case, **upd)  # type: ignore[arg-type]
