"""The GPU's power governor: the SM clock a power limit (and a clock lock, and heat) leaves each stage.

A GPU's power controller measures board power and lowers the SM clock when it passes the limit
(``knobs.power_limit_w``, else the catalog's ``tdp_w``). The model of it, per pipeline-stage kind:

* it holds the **highest mean power over its window** (``power_limiter_window_s``, ``w_g``) at or
  under the limit: the clock ``r`` is the highest at which
  ``max_t mean_{[t, t+w_g]} P(t; r) ≤ L`` on the stage's step timeline
  (:meth:`~powertrain.predict.timeline.StageTimeline.window_peak`), compute-bound work stretching by
  ``1/r`` and every draw following the V–f curve (:mod:`powertrain.predict.dvfs`). Windows shorter than
  ``w_g`` may pass the limit (the instantaneous field reads above it: the H200 training run of
  docs/gpu-validation.md records 794 W peaks under a 700 W limit) and the step's mean stays under it;
* it acts on the **step as a whole**: the clock comes back only over ``power_limiter_release_s``
  (``τ_r``) once the limit stops binding, so a step shorter than ``τ_r`` runs at one clock and the
  power-cap reason is set all through it (that run: on 100 % of samples); in a longer step it is set for
  the busy stretch plus ``τ_r``: ``share = min(1, (busy + τ_r) / step)``.

The job is synchronous, so the stages' clocks set the step together
(:func:`~powertrain.predict.timeline.compose_step`): a throttled stage that becomes the slowest slows
every stage, whose waits then lower their own draw. :func:`stage_clocks` iterates that twice.
A clock lock caps ``r`` from above (``r_cap``); heat caps it further per stage
(:mod:`powertrain.predict.thermal`).
"""

from __future__ import annotations

from dataclasses import dataclass

from powertrain.hardware import DeviceSpec
from powertrain.predict.calibration import Coefficients
from powertrain.predict.dvfs import MIN_CLOCK_RATIO, clock_for_scale
from powertrain.predict.timeline import (
    ComposedStep,
    StageTimeline,
    StageWork,
    StepWork,
    WindowPeak,
    compose_step,
    draw_constants,
    stage_timeline,
)


@dataclass(slots=True)
class StagePower:
    """One stage kind under the governor: its clock, its timeline at that clock, and why."""

    stage: StageWork
    timeline: StageTimeline
    clock: float  # the SM clock ratio the stage runs at
    cap_clock: float  # the highest clock it may run at before the power limit (a lock, heat; 1: none)
    power_limited: bool  # the power limit holds the clock under cap_clock
    limiter_window: WindowPeak  # the limiter's highest window at that clock
    throttle_power: float  # share of the step the power-cap reason is set

    @property
    def clock_mean(self) -> float:
        """Time-weighted clock ratio: the limited clock while the reason is set, the cap's clock after."""
        return self.clock * self.throttle_power + self.cap_clock * (1 - self.throttle_power)


def limit_clock(dev: DeviceSpec, c: Coefficients, work: StepWork, stage: StageWork, composed: ComposedStep,
                limit_w: float, r_cap: float, guess: float | None = None,
                k: tuple[float, float, float, float, float] | None = None) -> tuple[float, StageTimeline, WindowPeak]:
    """The highest clock ratio ≤ ``r_cap`` at which the stage's highest ``power_limiter_window_s`` window stays
    at or under ``limit_w``, with its timeline and that window.

    A window's mean is ``base + dyn·g(r)`` for a fixed composition, so each step solves ``g`` for the limit
    and re-reads the composition at the new clock (compute stretches, the highest window may move); kept
    inside a bracket of clocks known to pass and to fail the limit, it converges in a few steps. ``guess``: a
    clock to try first (the previous round's)."""
    w = c.power_limiter_window_s
    k = draw_constants(dev, c) if k is None else k
    ok, bad = MIN_CLOCK_RATIO, r_cap
    if guess is not None and guess < r_cap:
        tl = stage_timeline(dev, c, work, stage, guess, composed, k)
        top = tl.window_peak(w)
        if abs(top.power_w - limit_w) <= 1e-3 * limit_w:
            return guess, tl, top
        if top.power_w > limit_w:
            bad = guess
        else:
            ok = guess
    if guess is None or guess >= r_cap or ok > MIN_CLOCK_RATIO:  # the cap's own clock may keep the limit
        tl = stage_timeline(dev, c, work, stage, r_cap, composed, k)
        top = tl.window_peak(w)
        if top.power_w <= limit_w:
            return r_cap, tl, top
    # from here the clock keeps the limit at ok (the floor: whatever it draws there) and passes it at bad
    tol = 1e-3 * limit_w
    for _ in range(12):
        need = (limit_w - top.base_w) / top.dyn_w if top.dyn_w > 0 else 0.0
        r = clock_for_scale(need, c) if need > 0 else ok
        if not ok < r < bad:
            r = 0.5 * (ok + bad)
        tl = stage_timeline(dev, c, work, stage, r, composed, k)
        top = tl.window_peak(w)
        if abs(top.power_w - limit_w) <= tol or bad - ok < 1e-4:
            return r, tl, top
        if top.power_w > limit_w:
            bad = r
        else:
            ok = r
    tl = stage_timeline(dev, c, work, stage, ok, composed, k)  # end on a clock that keeps the limit
    return ok, tl, tl.window_peak(w)


def stage_clocks(dev: DeviceSpec, c: Coefficients, work: StepWork, limit_w: float, caps: dict[str, float],
                 pace: dict[str, float] | None = None) -> tuple[ComposedStep, dict[str, StagePower]]:
    """Every stage kind's clock under the power limit, each capped by ``caps`` (a lock), and the job's step at
    those clocks. ``pace``: per kind, the clock of its slowest device where heat holds one lower (the stage runs
    at that device's pace, its other devices at their own clock, waiting). The step and the stages' waits depend
    on each other's clocks: two rounds."""
    pace = pace or {}

    def timing(cl: dict[str, float]) -> ComposedStep:
        return compose_step(work, {k: min(v, pace.get(k, v)) for k, v in cl.items()})

    clocks = dict(caps)
    composed = timing(clocks)
    k = draw_constants(dev, c)
    out: dict[str, StagePower] = {}
    # one stage kind waits for nobody: its first round is exact; pipeline stages wait for the slowest: two
    for _ in range(1 if len(work.stages) == 1 and not pace else 2):
        for s in work.stages:
            cap = caps[s.name]
            prev = out.get(s.name)
            r, tl, top = limit_clock(dev, c, work, s, composed, limit_w, cap, guess=prev.clock if prev else None, k=k)
            clocks[s.name] = r
            out[s.name] = StagePower(stage=s, timeline=tl, clock=r, cap_clock=cap, power_limited=r < cap - 1e-9,
                                     limiter_window=top, throttle_power=0.0)
        new = timing(clocks)
        # the second round is for the waits the slowest stage leaves the others; they sit between chunks, so a
        # limiter whose highest window lies inside a chunk (the kernel level) is not moved by them
        settled = (abs(new.total_s - composed.total_s) <= 1e-6 * composed.total_s
                   or all(sp.limiter_window.level == "kernels" or not sp.power_limited for sp in out.values()))
        composed = new
        if settled:
            break
    release = c.power_limiter_release_s
    final: dict[str, StagePower] = {}
    for s in work.stages:
        sp = out[s.name]
        tl = sp.timeline
        if abs(tl.seconds - composed.total_s) > 1e-9 * composed.total_s:  # its waits changed in the last round
            tl = stage_timeline(dev, c, work, s, sp.clock, composed, k)
        share = min(1.0, (tl.busy_s + release) / tl.seconds) if sp.power_limited else 0.0
        final[s.name] = StagePower(stage=s, timeline=tl, clock=sp.clock, cap_clock=sp.cap_clock,
                                   power_limited=sp.power_limited, limiter_window=sp.limiter_window,
                                   throttle_power=share)
    return composed, final
