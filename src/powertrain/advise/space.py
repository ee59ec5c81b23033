"""Every candidate configuration of a request, pruned by the planner's rules and by memory before any prediction.

The search space, per request (world ``W`` = nodes × GPUs per node):

* structure — TP, PP, CP among the divisors of ``W`` (DP = W / (TP·PP·CP)); PP schedule 1F1B, GPipe,
  or interleaved 1F1B with ``v`` virtual stages (``v`` dividing layers/PP, up to ``max_vp``); EP among
  the divisors of the expert count that divide DP·CP, and for the ``megatron`` engine with TP also
  parallel folding (ETP 1, EP among the divisors that divide TP·CP·DP); FSDP on/off; sequence parallel on/off (TP > 1);
  micro-batch among the divisors of global batch / DP;
* memory knobs — recompute none / selective / full; distributed optimizer (not with FSDP);
* overlap flags — TP-comm overlap (TP > 1), DP gradient-reduce overlap (DP > 1, no FSDP), FSDP
  prefetch (FSDP), parameter-gather overlap (distributed optimizer);
* power — each power cap and SM clock lock of the request.

Each structure × micro-batch is checked once with :func:`powertrain.spec.validate.validate` — the
same rules ``plan`` applies — on a RunConfig built for it (rules do not depend on the memory,
overlap or power knobs). For the ``megatron`` engine the rules that are limits of the built-in
trainer only (:data:`TRAINER_ONLY_RULES`) do not reject. Memory is checked with the predictor's
:func:`~powertrain.predict.memory_per_device` per structure × memory knobs (overlap and power do not
change it), against capacity × (1 − headroom). Only survivors become :class:`Candidate` s.

A clock lock is predicted as a lock (``Case.sm_clock_mhz``): the predictor's governor
(:mod:`powertrain.predict.governor`) runs a locked GPU at the lower of the lock's clock and what its power
limit (the site's ``--power-cap``, else the default limit) allows, stage by stage.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from powertrain.advise.request import Request
from powertrain.predict import Calibration, Case, Coefficients, memory_per_device
from powertrain.predict.case import case_from_run_config
from powertrain.spec.layout import Layout
from powertrain.spec.run import Hardware, Knobs, RunConfig, spec_precision
from powertrain.spec.validate import TRAINER_ONLY_RULES, validate

RECOMPUTE = ("none", "selective", "full")


@dataclass(slots=True)
class Candidate:
    """One configuration to predict: the flat Case plus what a spec needs that a Case does not hold."""

    case: Case
    layout: Layout  # resolved (dp set); pp_split even
    clock_lock: float | None = None  # fraction of the maximum SM clock, None: not locked

    def label(self) -> str:
        c = self.case
        parts = [self.layout.label()]
        if c.pp > 1:
            parts.append({"1f1b": "1F1B", "gpipe": "GPipe", "interleaved_1f1b": "I1F1B"}[c.pp_schedule])
        parts.append(f"mb{c.micro_batch}")
        parts.append({"none": "rc-none", "selective": "rc-sel", "full": "rc-full"}[c.recompute])
        if c.distributed_optimizer:
            parts.append("distopt")
        ov = [n for n, on in (("tp", c.overlap_tp and c.tp > 1), ("dp", c.overlap_dp and c.dp > 1 and not c.fsdp),
                              ("fsdp", c.overlap_fsdp and c.fsdp), ("pg", c.overlap_param_gather)) if on]
        if ov:
            parts.append("ov-" + "+".join(ov))
        if self.clock_lock is not None:
            parts.append(f"clk{self.clock_lock:.0%}")
        elif c.power_limit_w is not None:
            parts.append(f"{c.power_limit_w:.0f}W")
        return " ".join(parts)


def unique_labels(cands: list[Candidate]) -> list[str]:
    """Each candidate's :meth:`Candidate.label`, with the case fields that tell apart two rows that would share
    one appended (``field=value``): no two rows of an answer read the same."""
    from dataclasses import fields

    labels = [c.label() for c in cands]
    for label in set(labels):
        same = [i for i, lb in enumerate(labels) if lb == label]
        if len(same) < 2:
            continue
        cases = [cands[i].case for i in same]
        differ = [f.name for f in fields(cases[0]) if f.name != "device"
                  and len({repr(getattr(c, f.name)) for c in cases}) > 1]
        for i, c in zip(same, cases, strict=True):
            extra = " ".join(f"{k}={getattr(c, k)}" for k in differ) or f"#{i + 1}"
            labels[i] = f"{label} {extra}"
    return labels


def equivalent_groups(speeds: list[float], resolution: float) -> list[list[int]]:
    """Consecutive ranks (0-based, best first) whose predicted speeds are within ``resolution`` of their group's
    first: the model cannot order them (predict.validation.PREDICTED_TIE)."""
    groups: list[list[int]] = []
    for i, v in enumerate(speeds):
        if groups and speeds[groups[-1][0]] and abs(v / speeds[groups[-1][0]] - 1) < resolution:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@dataclass
class SpaceStats:
    """How many candidates the space held and where they were pruned (each counted once)."""

    enumerated: int = 0
    rejected_rules: int = 0
    rejected_memory: int = 0
    # caps/locks that predict exactly like another power point (a cap that cannot bind is the uncapped point;
    # a lock above the clock the site cap or default limit allows is that limit's point): not predicted twice
    same_as_uncapped: int = 0
    kept: int = 0
    rule_counts: dict[str, int] = field(default_factory=dict)
    smallest_memory: tuple[float, str] | None = None  # (bytes, label) of the least memory seen

    def to_dict(self) -> dict[str, Any]:
        return {"enumerated": self.enumerated, "rejected_by_rules": self.rejected_rules,
                "rejected_by_memory": self.rejected_memory, "caps_not_binding": self.same_as_uncapped,
                "predicted": self.kept, "rules": dict(sorted(self.rule_counts.items(), key=lambda kv: -kv[1]))}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _schedules(layers: int, pp: int, max_vp: int) -> list[tuple[str, int]]:
    if pp == 1:
        return [("1f1b", 1)]
    out = [("1f1b", 1), ("gpipe", 1)]
    out += [("interleaved_1f1b", v) for v in range(2, max_vp + 1) if layers % (pp * v) == 0]
    return out


def structures(req: Request) -> Iterator[dict[str, Any]]:
    """Layout degrees and schedule choices (before any rule): dicts of Layout keyword arguments."""
    m, w = req.model, req.world
    experts = m.experts if m.is_moe else 1
    for tp in divisors(w):
        for pp in divisors(w // tp):
            for cp in divisors(w // (tp * pp)):
                if cp > 1 and m.seq_len % (2 * cp):
                    continue  # CP splits each sequence in 2·cp chunks (load-balanced causal attention)
                dp = w // (tp * pp * cp)
                for sched, vp in _schedules(m.layers, pp, req.max_vp):
                    for ep, etp in _expert_placements(req, experts, tp, cp, dp):
                        for fsdp in (False, True) if dp * cp > 1 else (False,):
                            for sp in (False, True) if tp > 1 else (False,):
                                yield {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": ep, "etp": etp, "fsdp": fsdp,
                                       "sequence_parallel": sp, "pp_schedule": sched, "virtual_stages": vp}


def _expert_placements(req: Request, experts: int, tp: int, cp: int, dp: int) -> list[tuple[int, int | None]]:
    """(ep, etp) pairs: EP carved out of dp·cp (etp unset: experts split like the dense layers), and for
    the ``megatron`` engine with TP also parallel folding (etp 1: EP spans tp·cp·dp), which Megatron-Core
    runs and the built-in trainer does not."""
    out: list[tuple[int, int | None]] = [(ep, None) for ep in divisors(experts) if (dp * cp) % ep == 0]
    if experts > 1 and tp > 1 and req.engine == "megatron":
        out += [(ep, 1) for ep in divisors(experts) if ep > 1 and (tp * cp * dp) % ep == 0]
    return out


def _knob_variants(lay: dict[str, Any]) -> list[tuple[str, bool]]:
    """(recompute, distributed optimizer) pairs: the knobs that change memory."""
    dist = (False,) if lay["fsdp"] or lay["dp"] * lay["cp"] == 1 else (False, True)
    return [(rc, d) for rc in RECOMPUTE for d in dist]


def _overlaps(lay: dict[str, Any], dist: bool, engine: str = "megatron") -> list[dict[str, Any]]:
    """Overlap flag combinations that can matter for this layout (others stay at their default).

    Parameter-gather overlap is a Megatron distributed-optimizer flag: the built-in trainer has no such
    knob, so for ``builtin`` it is not a search axis (every knob real or refused)."""
    tp = (False, True) if lay["tp"] > 1 else (False,)
    dp = (False, True) if lay["dp"] * lay["cp"] > 1 and not lay["fsdp"] else (True,)
    fs = (False, True) if lay["fsdp"] else (True,)
    pg = (False, True) if dist and engine == "megatron" else (False,)
    return [{"overlap_tp": a, "overlap_dp": b, "overlap_fsdp": f, "overlap_param_gather": g}  # Any: for replace(**)
            for a in tp for b in dp for f in fs for g in pg]


PowerPoint = tuple[float | None, float | None, bool]  # (power cap, clock lock, predicted: not a repeat)


def _power_points(req: Request) -> list[PowerPoint]:
    """(power cap, clock lock, predicted) points. A point that predicts exactly like one before it has
    ``predicted`` False: it is counted (:attr:`SpaceStats.same_as_uncapped`), not predicted again.

    A cap at or above the device's default limit is the uncapped point. A clock lock is predicted as what it is
    (the predictor's governor runs the GPU at the lower of the lock's clock and what the limit — the site's
    ``--power-cap``, else the default — allows); a lock at the maximum clock is the limit's own point."""
    top = req.device.tdp_w
    site = req.constraints.power_cap_w
    seen: set[float | None] = set()
    pts: list[PowerPoint] = []
    for cap in req.power_caps:
        same = cap if cap is not None and cap < top else None  # a cap that cannot bind is the uncapped point
        pts.append((cap, None, same not in seen))
        seen.add(same)
    for r in req.clock_locks:
        pts.append((site, r, r < 1.0))
    return pts


def validation_config(req: Request, lay: dict[str, Any], mb: int) -> RunConfig:
    """The RunConfig the planner's rules are checked on for one structure and micro-batch."""
    layout = Layout(**{k: v for k, v in lay.items() if k != "dp"})
    knobs = Knobs(micro_batch=mb, global_batch=req.global_batch, precision=spec_precision(req.precision))
    hw = Hardware(nodes=req.nodes, devices_per_node=req.devices_per_node, device=req.device_name)
    return RunConfig(name="advise", model=req.model, layout=layout, knobs=knobs, hardware=hw)


def rule_failures(req: Request, cfg: RunConfig) -> list[str]:
    """Rules ``cfg`` breaks for this request's engine (trainer-only limits ignored for megatron)."""
    rules = [v.rule for v in validate(cfg)]
    if req.engine == "megatron":
        rules = [r for r in rules if r not in TRAINER_ONLY_RULES]
    return rules


def enumerate_candidates(req: Request, calibration: Calibration, stats: SpaceStats | None = None
                         ) -> Iterator[Candidate]:
    """Every candidate of ``req`` that the rules and memory allow; ``stats`` counts the rest.

    The request is flattened once (device — for a CPU the calibration's host probe —, model sizes,
    precision); structures are applied with ``dataclasses.replace``, far cheaper than a RunConfig
    per candidate.
    """
    st = stats if stats is not None else SpaceStats()
    coeffs = calibration.coefficients
    power = _power_points(req)
    n_power = len(power)
    capacity = req.device.memory_bytes * (1 - req.constraints.mem_headroom)
    base: Case | None = None
    knob_cache: dict[tuple[Any, ...], list[str]] = {}
    for lay in structures(req):
        local = req.global_batch // lay["dp"] if req.global_batch % lay["dp"] == 0 else 0
        for mb in divisors(local) if local else [1]:
            knob_vars = _knob_variants(lay)
            per_mem = [len(_overlaps(lay, d, req.engine)) for _, d in knob_vars]
            n_here = sum(per_mem) * n_power
            st.enumerated += n_here
            cfg = validation_config(req, lay, mb)
            broken = rule_failures(req, cfg)
            if broken:
                st.rejected_rules += n_here
                for r in set(broken):
                    st.rule_counts[r] = st.rule_counts.get(r, 0) + n_here
                continue
            if base is None:
                base = case_from_run_config(cfg, calibration=calibration)
                top_mhz = req.device.max_sm_clock_mhz  # the user's --max-sm-clock-mhz, where given
                if top_mhz != base.device.max_sm_clock_mhz:
                    base = replace(base, device=replace(base.device, max_sm_clock_mhz=top_mhz))
            layout = cfg.layout.resolve(req.world)
            for (rc, dist), n_ov in zip(knob_vars, per_mem, strict=True):
                case = _with(base, req, lay, mb, rc, dist)
                need = memory_per_device(case, coeffs)[0]
                if st.smallest_memory is None or need < st.smallest_memory[0]:
                    st.smallest_memory = (need, f"{layout.label()} mb{mb} recompute {rc}")
                if need > capacity:
                    st.rejected_memory += n_ov * n_power
                    continue
                for ov in _overlaps(lay, dist, req.engine):
                    for cap, lock, predicted in power:
                        knob_broken = knob_rules(req, cfg, lay, rc, dist, ov, cap, knob_cache)
                        if knob_broken:
                            st.rejected_rules += 1
                            for r in knob_broken:
                                st.rule_counts[r] = st.rule_counts.get(r, 0) + 1
                            continue
                        if not predicted:
                            st.same_as_uncapped += 1
                            continue
                        st.kept += 1
                        top = req.device.max_sm_clock_mhz  # known wherever a lock is searched (Request refuses)
                        locked = lock * top if lock is not None and top else None
                        yield Candidate(replace(case, power_limit_w=cap, sm_clock_mhz=locked, **ov), layout, lock)


def knob_rules(req: Request, cfg: RunConfig, lay: dict[str, Any], rc: str, dist: bool, ov: dict[str, Any],
               cap: float | None, cache: dict[tuple[Any, ...], list[str]]) -> list[str]:
    """Rules the knobs break (async TP where PyTorch has none, a power limit outside the device's range, …):
    plan's rules on the structure's RunConfig with these knobs, minus what the structure alone breaks.

    Cached by what such rules can see of the structure (TP > 1, data parallel, FSDP) and the knobs, so
    ``validate`` runs a few dozen times per search rather than once per candidate."""
    key = (lay["tp"] > 1, lay["dp"] * lay["cp"] > 1, lay["fsdp"], rc, dist, tuple(sorted(ov.items())), cap)
    got = cache.get(key)
    if got is None:
        overlap = cfg.knobs.overlap.model_copy(update={"async_tp": bool(ov["overlap_tp"]),
                                                       "grad_reduce_in_backward": bool(ov["overlap_dp"]),
                                                       "fsdp_prefetch": bool(ov["overlap_fsdp"])})
        knobs = cfg.knobs.model_copy(update={"recompute": rc, "overlap": overlap, "power_limit_w": cap})
        layout = cfg.layout.model_copy(update={"distributed_optimizer": dist})
        with_knobs = cfg.model_copy(update={"knobs": knobs, "layout": layout})
        got = [r for r in rule_failures(req, with_knobs) if r not in rule_failures(req, cfg)]
        cache[key] = got
    return got


def _with(base: Case, req: Request, lay: dict[str, Any], mb: int, rc: str, dist: bool) -> Case:
    return replace(base, tp=lay["tp"], pp=lay["pp"], cp=lay["cp"], dp=lay["dp"], ep=lay["ep"], etp=lay["etp"],
                   fsdp=lay["fsdp"],
                   sequence_parallel=lay["sequence_parallel"], pp_schedule=lay["pp_schedule"],
                   vp=lay["virtual_stages"], pp_split="even", micro_batch=mb, global_batch=req.global_batch,
                   recompute=rc, distributed_optimizer=dist, owner_broadcast_optimizer=req.engine == "builtin",
                   precision=req.precision,
                   devices_per_node=req.devices_per_node, measured_steps=1,
                   # the stack the advice is for (a RunConfig's case is powertrain's own trainer's): its kernels'
                   # memory traffic, attention kernel and step's fixed time (predict/engines.py)
                   engine=req.engine, attention_kernel="flash2" if req.engine == "builtin" else "fused")


def count_space(req: Request, coeffs: Coefficients) -> int:
    """How many candidates :func:`enumerate_candidates` will enumerate (for a progress bar's total)."""
    n_power = len(_power_points(req))
    total = 0
    for lay in structures(req):
        local = req.global_batch // lay["dp"] if req.global_batch % lay["dp"] == 0 else 0
        n_mb = len(divisors(local)) if local else 1
        total += n_mb * n_power * sum(len(_overlaps(lay, d, req.engine)) for _, d in _knob_variants(lay))
    return total
