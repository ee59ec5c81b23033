"""Predict every candidate, keep those inside the limits, rank them by the objective.

:func:`advise` is the search: :func:`~powertrain.advise.space.enumerate_candidates` (rules and
memory first), one :func:`powertrain.predict.predict` per survivor, the constraints (power, node and
rack budgets, temperature, throttling), then the objective's score. It returns an :class:`Advice`
holding every feasible point (for the Pareto front and the figure), the ranked top N with their
full predictions, and why the first beats the second (:func:`explain`).

When nothing is feasible, :class:`NoFeasibleLayout` says why in one line and names the nearest
feasible change (the limit that pruned the most, and by how much it would have to move).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powertrain.advise.anchors import family, profile_anchors
from powertrain.advise.request import Request, impossible
from powertrain.advise.space import Candidate, SpaceStats, count_space, enumerate_candidates
from powertrain.predict import Calibration, Prediction, load_calibration, predict
from powertrain.predict.calibration import Coefficients
from powertrain.predict.power import node_power_w

Progress = Callable[[int, int], None]


class NoFeasibleLayout(ValueError):
    """No configuration satisfies the request; the message is one line with the nearest change."""


@dataclass(slots=True)
class Point:
    """One feasible candidate's headline numbers (the full Prediction is kept only for the top N)."""

    cand: Candidate
    tokens_per_s: float
    j_per_token: float | None
    power_peak_w: float | None
    power_mean_w: float | None
    node_peak_w: float | None
    temp_peak_c: float | None
    throttle_share: float | None  # share of device time thermally slowed (what --no-throttle refuses)
    mem_bytes: float
    mfu: float
    step_s: float
    score: float = 0.0
    capped_share: float | None = None  # share of device time the power limit holds the clock
    anchor: float = 1.0  # measured/predicted tokens/s of the profile's runs of this family (1: not anchored)


@dataclass
class Ranked:
    point: Point
    prediction: Prediction
    interval: tuple[float, float, str]  # tokens/s low, high, where the width comes from


@dataclass
class Advice:
    request: Request
    calibration: str
    stats: SpaceStats
    points: list[Point]
    top: list[Ranked]
    pareto: list[Point]
    explanation: list[str]
    seconds: float
    notes: list[str] = field(default_factory=list)


def throughput_interval(pred: Prediction, is_moe: bool) -> tuple[float, float, str]:
    """The prediction interval of tokens/s: the predictor's own 80 % interval (from the profile's
    leave-one-source-out residuals) where the profile has one; else ± the profile's validation error
    for the architecture, else ± its fit error (a CPU profile) — each labelled with where it comes from."""
    from powertrain.predict.output import prediction_interval

    tps = float(pred.metrics["tokens_per_s"])
    own = prediction_interval(pred, "tokens_per_s", "80")
    if own is not None:
        return own[0], own[1], f"80 % prediction interval of profile {pred.calibration!r} (leave-one-source-out)"
    err = pred.model_error or {}
    key = "throughput_mape_moe" if is_moe else "throughput_mape_dense"
    for k, what in ((key, "in-sample validation error"), ("step_time_mape", "fit error on its runs, in-sample")):
        rel = err.get(k)
        if isinstance(rel, (int, float)) and rel > 0:
            return tps / (1 + rel), tps * (1 + rel), f"± profile {pred.calibration!r} {k} {rel:.1%} ({what})"
    return tps, tps, f"profile {pred.calibration!r} states no error: interval unknown"


def _point(cand: Candidate, pred: Prediction, req: Request, c: Coefficients) -> Point:
    m = pred.metrics
    peak = m["power_peak_w"]
    # a node's budget is a breaker's, over seconds: the 1 s field's peak, not the instantaneous field's overshoot
    phys = pred.physics
    sustained = phys.peaks["average"].power_w if phys is not None else None
    node = node_power_w(req.devices_per_node * sustained, 1, req.device, ranks_per_node=req.devices_per_node) \
        if sustained is not None else None
    return Point(cand, m["tokens_per_s"], m["j_per_token"], peak, m["power_mean_w"], node, m["temp_peak_c"],
                 m["throttle_share_thermal_sw"], m["mem_per_device_bytes"], m["mfu"], m["step_time_mean_s"],
                 capped_share=m["throttle_share_power_cap"])


def violates(p: Point, req: Request) -> str | None:
    """The first limit ``p`` breaks (a short key), or None."""
    c = req.constraints
    if c.node_kw is not None and p.node_peak_w is not None and p.node_peak_w > c.node_kw * 1000:
        return "node_kw"
    if c.rack_kw is not None and p.node_peak_w is not None and \
            p.node_peak_w * (c.nodes_per_rack or req.nodes) > c.rack_kw * 1000:
        return "rack_kw"
    if c.max_temp_c is not None and p.temp_peak_c is not None and p.temp_peak_c > c.max_temp_c:
        return "max_temp"
    if c.no_throttle and p.throttle_share:
        return "no_throttle"
    return None


def score(p: Point, req: Request, c: Coefficients) -> float:
    """Lower is better, in the objective's unit (negated tokens/s for throughput and Pareto)."""
    o = req.objective
    if o.kind in ("throughput", "pareto"):
        return -p.tokens_per_s
    if o.kind == "energy":
        return p.j_per_token if p.j_per_token is not None else math.inf
    seconds = (o.tokens or 0) / p.tokens_per_s
    if o.kind == "time":
        return seconds
    # cost: GPU-hours plus the energy of the whole nodes (devices' mean power + host, at the wall) over the run;
    # make_request refuses a cost objective on a device without a power model, so the power is known here
    assert p.power_mean_w is not None
    node_w = node_power_w(p.power_mean_w * req.world, req.nodes, req.device, ranks_per_node=req.devices_per_node)
    # make_request refuses a cost objective on a node whose host the catalog does not describe
    assert node_w is not None
    return seconds / 3600 * req.world * (o.gpu_hour_price or 0) + node_w * seconds / 3.6e6 * (o.kwh_price or 0)


def pareto_front(points: list[Point]) -> list[Point]:
    """Points no other point beats on both tokens/s (higher) and J/token (lower), fastest first."""
    pts = sorted((p for p in points if p.j_per_token is not None), key=lambda p: (-p.tokens_per_s, p.j_per_token))
    front: list[Point] = []
    best = math.inf
    for p in pts:
        assert p.j_per_token is not None
        if p.j_per_token < best:
            front.append(p)
            best = p.j_per_token
    return front


def _anchored(p: Point, factor: float) -> None:
    """Correct a point by its family's measured/predicted ratio (see :mod:`powertrain.advise.anchors`)."""
    p.anchor = factor
    p.tokens_per_s *= factor
    p.mfu *= factor
    p.step_s /= factor
    if p.j_per_token is not None:
        p.j_per_token /= factor


def advise(req: Request, calibration: Calibration | str | None = None, top_n: int = 5,
           progress: Progress | None = None, anchors: bool = True) -> Advice:
    """Search ``req``'s space (see :mod:`powertrain.advise.space`) and rank what fits its limits.

    With ``anchors``, families the profile's own runs measured are corrected by them
    (:mod:`powertrain.advise.anchors`)."""
    t0 = time.perf_counter()
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    why = impossible(req)
    if why:
        raise NoFeasibleLayout(why)
    stats = SpaceStats()
    total = count_space(req, cal.coefficients)
    points: list[Point] = []
    broke: dict[str, list[Point]] = {}
    anch = profile_anchors(cal, req.world, req.device.transport) if anchors else {}
    for i, cand in enumerate(enumerate_candidates(req, cal, stats)):
        p = _point(cand, predict(cand.case, cal), req, cal.coefficients)
        a = anch.get(family(cand.case)) if anch else None
        if a is not None:
            _anchored(p, a.factor)
        bad = violates(p, req)
        if bad:
            broke.setdefault(bad, []).append(p)
        else:
            p.score = score(p, req, cal.coefficients)
            points.append(p)
        if progress is not None and i % 2048 == 0:
            progress(stats.enumerated, total)
    if progress is not None:
        progress(stats.enumerated, total)
    if not points:
        raise NoFeasibleLayout(nearest_change(req, stats, broke))
    front = pareto_front(points)
    if req.objective.kind == "pareto":
        chosen = front[:top_n]
    else:
        points.sort(key=lambda p: (p.score, -p.tokens_per_s))
        chosen = _distinct(points, top_n)
    top = []
    for p in chosen:
        pred = predict(p.cand.case, cal)
        lo, hi, how = throughput_interval(pred, p.cand.case.is_moe)
        top.append(Ranked(p, pred, (lo * p.anchor, hi * p.anchor, how)))
    lines = explain(top[0], top[1], req) if len(top) > 1 else ["only one feasible configuration"]
    runner = _first_clearly_behind(points, top[0].point) if req.objective.kind != "pareto" else None
    tie = len(top) > 1 and abs(top[1].point.score / top[0].point.score - 1) < 0.005
    if tie and runner is not None and runner is not top[1].point:
        pred = predict(runner.cand.case, cal)
        lines += ["#1 and #2 are a tie within 0.5 %; against the first configuration clearly behind (> 1 %):"]
        lines += explain(top[0], Ranked(runner, pred, throughput_interval(pred, runner.cand.case.is_moe)), req,
                       "runner-up")
    notes = [f"anchored to the profile's measured runs: {a.text()}" for a in anch.values()]
    return Advice(request=req, calibration=cal.name, stats=stats, points=points, top=top, pareto=front,
                  explanation=lines, seconds=time.perf_counter() - t0, notes=notes)


def _first_clearly_behind(ranked: list[Point], first: Point) -> Point | None:
    """The best-ranked point whose score is more than 1 % worse than ``first``'s (lists are short-circuited)."""
    for p in ranked:
        if abs(p.score - first.score) > 0.01 * abs(first.score):
            return p
    return None


def _distinct(points: list[Point], n: int) -> list[Point]:
    """The best ``n`` points whose predictions differ (ties of equal prediction — an overlap flag that
    changes nothing here — are shown once)."""
    out: list[Point] = []
    seen: set[tuple[float, float | None, float]] = set()
    for p in points:
        key = (round(p.step_s, 9), p.j_per_token and round(p.j_per_token, 9), round(p.mem_bytes))
        if key in seen:
            continue
        seen.add(key)
        out.append(p)
        if len(out) == n:
            break
    return out


TERM_NAMES = {"compute_s": "GEMM/attention compute", "memory_bound_s": "memory-bound (elementwise) work",
              "tp_comm_exposed_s": "exposed TP communication", "ep_all_to_all_s": "EP all-to-all",
              "cp_comm_exposed_s": "exposed CP communication", "pp_p2p_s": "pipeline send/recv",
              "pp_bubble_s": "pipeline bubble", "pp_stage_imbalance_s": "pipeline stage imbalance",
              "dp_comm_exposed_s": "exposed DP gradient reduction", "fsdp_comm_exposed_s": "exposed FSDP gathers",
              "optimizer_s": "optimizer step", "overhead_s": "host/launch overhead",
              "step_overhead_s": "fixed time per step", "head_s": "logit layer and loss"}


def step_term_differences(a: Prediction, b: Prediction) -> list[tuple[str, float, float]]:
    """(term, a's seconds, b's seconds) for every step-time term, largest |difference| first."""
    sa, sb = a.breakdown.get("step_time", {}), b.breakdown.get("step_time", {})
    terms = [(k, float(sa.get(k, 0.0)), float(sb.get(k, 0.0))) for k in TERM_NAMES if k in sa or k in sb]
    return sorted(terms, key=lambda t: -abs(t[1] - t[2]))


def explain(first: Ranked, second: Ranked, req: Request, second_name: str = "#2") -> list[str]:
    """Why the top configuration beats the next one: the step-time terms that differ most, and power."""
    a, b = first.prediction, second.prediction
    ta, tb = first.point.step_s, second.point.step_s
    lines = [f"#1 {first.point.cand.label()}  vs  {second_name} {second.point.cand.label()}: step {ta:.4g} s vs {tb:.4g} s "
             f"({(ta / tb - 1):+.1%})"]
    diffs = [d for d in step_term_differences(a, b) if abs(d[1] - d[2]) > 1e-3 * max(ta, tb)][:3]
    for k, va, vb in diffs:
        lines.append(f"  {TERM_NAMES[k]}: {va:.4g} s vs {vb:.4g} s ({va - vb:+.3g} s per step)")
    if not diffs:
        lines.append("  the step-time terms are the same: they differ only in power or memory")
    ja, jb = first.point.j_per_token, second.point.j_per_token
    if ja is not None and jb is not None:
        lines.append(f"  energy: {ja:.4g} vs {jb:.4g} J/token; mean power {first.point.power_mean_w:.0f} vs "
                     f"{second.point.power_mean_w:.0f} W per GPU (estimates)")
    ia, ib = first.interval, second.interval
    if ia[1] > ib[0] and ib[1] > ia[0] and req.objective.kind in ("throughput", "time"):
        lines.append("  their throughput intervals overlap: the model cannot tell them apart with confidence; "
                     "confirm with a sweep of the top N (--emit)")
    return lines


def nearest_change(req: Request, stats: SpaceStats, broke: dict[str, list[Point]]) -> str:
    """One line: why nothing is feasible and the smallest change that would admit a configuration."""
    c = req.constraints
    if stats.kept == 0:
        if stats.smallest_memory is not None:
            need, label = stats.smallest_memory
            cap = req.device.memory_bytes
            head = f" with --mem-headroom {c.mem_headroom:g}" if c.mem_headroom else ""
            gpus = math.ceil(need / (cap * (1 - c.mem_headroom)) * req.world / req.devices_per_node) \
                * req.devices_per_node
            return (f"no layout fits in memory{head}: the smallest, {label}, needs {need / 2**30:.1f} GiB of "
                    f"{cap * (1 - c.mem_headroom) / 2**30:.1f} GiB per GPU; use about {gpus} GPUs, a device with "
                    f"more memory, a smaller global batch or sequence, or lower --mem-headroom")
        top = next(iter(stats.to_dict()["rules"].items()), ("?", 0))
        return (f"no layout passes the planner's rules for {req.world} GPUs and global batch {req.global_batch} "
                f"(most common: {top[0]}); try a GPU count or global batch with more divisors (e.g. powers of 2)")
    fixes = []
    if "node_kw" in broke:
        need = min(p.node_peak_w or math.inf for p in broke["node_kw"])
        fixes.append(f"raise --node-kw to {math.ceil(need / 100) / 10:g} kW (lowest predicted node peak), or try "
                     "lower --power-caps")
    if "rack_kw" in broke:
        need = min(p.node_peak_w or math.inf for p in broke["rack_kw"]) * (c.nodes_per_rack or req.nodes)
        fixes.append(f"raise --rack-kw to {math.ceil(need / 100) / 10:g} kW")
    if "max_temp" in broke:
        need = min(p.temp_peak_c or math.inf for p in broke["max_temp"])
        fixes.append(f"raise --max-temp to {math.ceil(need):g} °C (coolest predicted hottest GPU)")
    if "no_throttle" in broke:
        fixes.append("drop --no-throttle or try lower --power-caps (a capped GPU runs cooler)")
    counts = ", ".join(f"{k}: {len(v)}" for k, v in broke.items())
    return f"none of {stats.kept} predicted configurations keeps the limits ({counts}); nearest change: " + \
        "; or ".join(fixes)


def as_dict(adv: Advice) -> dict[str, Any]:
    """The advice as JSON-ready data (top N with their metrics and intervals, the front, the counts)."""
    return {
        "request": {"model": adv.request.model.name, "device": adv.request.device.name, "gpus": adv.request.world,
                    "nodes": adv.request.nodes, "global_batch": adv.request.global_batch,
                    "seq_len": adv.request.model.seq_len, "precision": adv.request.precision,
                    "engine": adv.request.engine, "objective": adv.request.objective.kind},
        "profile": adv.calibration, "seconds": adv.seconds, "space": adv.stats.to_dict(),
        "top": [{"rank": i + 1, "label": r.point.cand.label(), "score": r.point.score,
                 "tokens_per_s_interval": list(r.interval[:2]), "interval_from": r.interval[2],
                 "metrics": r.prediction.metrics} for i, r in enumerate(adv.top)],
        "pareto": [{"label": p.cand.label(), "tokens_per_s": p.tokens_per_s, "j_per_token": p.j_per_token,
                    "power_peak_w": p.power_peak_w} for p in adv.pareto],
        "explanation": adv.explanation, "notes": adv.notes,
    }
