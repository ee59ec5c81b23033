"""One step as the pipeline stages live it: phases in schedule order, at each stage's clock.

The step-time model (:mod:`powertrain.predict.steptime`) hands over a :class:`StepWork`: per kind of
pipeline stage (the first, the fullest middle one, the last; one kind without pipelining) what a
**chunk** is made of — one micro-batch's forward or backward on one virtual stage — by kind of work:
**compute** (GEMMs and attention, whose time scales with 1/clock), **memory**-bound kernels, exposed
**comm**unication and **host** time (the GPU waits), with its longest single kernel; and what the step
adds around the chunks: FSDP gathers, exposed data-parallel communication, the optimizer and the
step's fixed time.

:func:`compose_step` is the one formula for the step's time at the stages' clocks (compute ÷ clock,
the rest as is): ``m · max_s T_s + (pp − 1)/v · mean_s T_s + tails``, ``T_s`` a micro-batch on stage
``s`` (1F1B and GPipe have the same bubble; interleaving divides it by ``v``).

In schedule order a stage's step is a busy stretch of cycles ``[forward chunk, sends, backward chunk,
sends + waiting for the slowest stage]``, each chunk a run of layer passes, then the bubble, the DP
communication, the optimizer and the fixed time. That is a nested periodic signal with three levels,
and a window average of it (what a power sensor or a governor sees) is computed level by level
(:meth:`StageTimeline.window_peak`):

* **kernels** — inside a chunk every layer pass is ``[its longest kernel at the compute draw, the rest of
  the pass at its mean draw]``: a window shorter than the kernel sits in it alone, which is how long GEMMs
  at large micro-batches make a short-window reading bursty;
* **cycles** — forward and backward chunks and the sends between them;
* **step** — the busy stretch against the bubble and the step's tail.

The highest window mean is the largest over the levels long enough to hold the window. Pieces carry
their energy as ``e0 + e1·g`` (``g`` the V–f curve's dynamic scale at the stage's clock,
:mod:`powertrain.predict.dvfs`), so a governor can solve for the clock at which a window meets a
power limit (:mod:`powertrain.predict.governor`). :meth:`StageTimeline.render` draws the same signal at
≤ 1 ms resolution for figures.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from powertrain.hardware import DeviceSpec
from powertrain.predict.calibration import Coefficients
from powertrain.predict.dvfs import MEMORY_CLOCK_FREE_SHARE, dynamic_scale, dynamic_w


@dataclass(frozen=True, slots=True)
class PassWork:
    """One chunk (a micro-batch's forward or backward on one virtual stage) at the maximum clock, s."""

    compute: float  # GEMMs and attention (clock-bound)
    memory: float  # memory-bound kernels
    comm: float  # exposed communication inside the chunk (TP, EP, CP)
    host: float  # host time the GPU waits for (per-layer launch gaps, MoE token-count syncs)
    longest: float  # the longest single compute kernel
    passes: float  # layer passes in the chunk (the kernel ripple's period is the chunk ÷ this)

    def seconds(self, r: float = 1.0, floor: float = 0.0) -> float:
        """At clock ratio ``r``; memory-bound work slows too below the clock ``floor`` (:func:`memory_stretch`)."""
        return self.compute / r + self.memory * memory_stretch(r, floor) + self.comm + self.host


@dataclass(frozen=True, slots=True)
class StageWork:
    """One kind of pipeline stage at the maximum clock: its chunks' work and sends."""

    name: str  # "first", "middle", "last" (pipelined) or "all"
    ranks: int  # pipeline ranks of this kind in one pipeline
    fwd: PassWork
    bwd: PassWork
    sends: float  # exposed pipeline sends per chunk (its forward's and its backward's), s
    # Σ over this kind's ranks of a micro-batch's time ÷ (ranks × the fullest one's): below 1 where they hold
    # fewer layers than the fullest (an uneven split); weighs the pipeline's mean stage
    mean_scale: float = 1.0

    def chunk_cycle_s(self, r: float = 1.0, floor: float = 0.0) -> float:
        return self.fwd.seconds(r, floor) + self.bwd.seconds(r, floor) + self.sends


@dataclass(frozen=True, slots=True)
class StepWork:
    """A step at the maximum clock: the stage kinds and what the step adds around their chunks."""

    stages: tuple[StageWork, ...]
    micro_batches: int
    pp: int
    vp: int
    in_run_comm: float  # exposed FSDP gathers/reductions inside the busy stretch, per step, s
    tail_comm: float  # exposed DP communication after the backward, per step, s
    optimizer: float  # memory-bound, per step, s
    fixed: float  # the step's fixed time (host), per step, s
    # the clock ratio below which memory-bound kernels slow with the clock too (Coefficients.memory_clock_floor)
    memory_floor: float = 0.0

    def stage(self, name: str) -> StageWork:
        return next(s for s in self.stages if s.name == name)


@dataclass(slots=True)
class ComposedStep:
    """The step's time at the stages' clocks (:func:`compose_step`)."""

    total_s: float
    busy_s: float  # micro-batches × the slowest stage's micro-batch
    bubble_s: float
    micro_batch_s: dict[str, float]  # per stage kind
    slowest: str


def memory_stretch(r: float, floor: float) -> float:
    """How much longer memory-bound work takes at clock ratio ``r``: not at all down to ``floor``, below it with
    the clock (its SMs no longer issue loads fast enough to keep HBM busy)."""
    return floor / r if r < floor else 1.0


def compose_step(work: StepWork, clocks: dict[str, float] | float = 1.0) -> ComposedStep:
    """The one step-time formula: ``m · max_s T_s + (pp − 1)/v · mean_s T_s + tails`` at the stages' clock
    ratios (a number: every stage at that clock). The optimizer runs at the slowest stage's clock."""
    per: dict[str, float] = {}
    weighted = 0.0
    low = 1.0
    # told apart once, not per stage: one clock for every stage, or one per stage kind
    every: float | None = None
    by_kind: dict[str, float] = {}
    if isinstance(clocks, float | int):
        every = float(clocks)
    else:
        by_kind = clocks
    for s in work.stages:
        r = every if every is not None else float(by_kind.get(s.name, 1.0))
        low = min(low, r)
        t = work.vp * s.chunk_cycle_s(r, work.memory_floor)
        per[s.name] = t
        weighted += s.ranks * s.mean_scale * t
    slowest = max(per, key=per.__getitem__)
    busy = work.micro_batches * per[slowest]
    bubble = (work.pp - 1) / work.vp * weighted / work.pp if work.pp > 1 else 0.0
    total = (busy + bubble + work.in_run_comm + work.tail_comm + work.optimizer * memory_stretch(low, work.memory_floor)
             + work.fixed)
    return ComposedStep(total_s=total, busy_s=busy, bubble_s=bubble, micro_batch_s=per, slowest=slowest)


class Piece(NamedTuple):
    """A stretch of a timeline: its duration (s) and energy ``e0 + e1·g`` (J)."""

    d: float
    e0: float
    e1: float

    def energy(self, g: float) -> float:
        return self.e0 + self.e1 * g


# _as_piece((d, e0, e1)): a Piece without NamedTuple's Python-level __new__: half the cost, and a step's timeline is built
# from 15 pieces, a dozen times per prediction (the governor's search)
_as_piece: Callable[[tuple[float, float, float]], Piece] = functools.partial(tuple.__new__, Piece)


def draw_constants(dev: DeviceSpec, c: Coefficients) -> tuple[float, float, float, float, float]:
    """(idle, memory's clock-free part, compute's, memory's clock-bound part, waiting's) draw per unit time: the
    energy of ``t`` s of each kind is ``idle·t + (that kind's parts)·t`` with the clock-bound ones × ``g``
    (:mod:`~powertrain.predict.dvfs`: compute on the full-clock GEMM draw, the others on the power limit's range)."""
    dyn = dynamic_w(dev, c)
    rng = dev.tdp_w - dev.idle_w
    h = MEMORY_CLOCK_FREE_SHARE
    return dev.idle_w, rng * c.power_memory * h, dyn * c.power_compute, rng * c.power_memory * (1 - h), rng * c.power_wait


def _piece(k: tuple[float, float, float, float, float], compute: float, memory: float, wait: float) -> Piece:
    """``compute`` s of compute-bound work, ``memory`` s of memory-bound work or communication and ``wait``
    s of waiting, with energy affine in the dynamic scale ``g`` (:mod:`~powertrain.predict.dvfs`'s draws)."""
    d = compute + memory + wait
    return Piece(d, k[0] * d + k[1] * memory, k[2] * compute + k[3] * memory + k[4] * wait)


def _total(pieces: tuple[Piece, ...], times: float = 1.0) -> Piece:
    return Piece(times * sum(p.d for p in pieces), times * sum(p.e0 for p in pieces),
                 times * sum(p.e1 for p in pieces))


def _two_piece_max(pattern: tuple[Piece, Piece], w: float, g: float) -> tuple[float, float]:
    """:func:`max_window` of a periodic ``[a, b]`` pattern in closed form: whole periods, and the remainder laid
    over as much of the denser piece as it holds."""
    (ad, a0, a1), (bd, b0, b1) = pattern  # plain locals: this runs for every window the governor reads
    period = ad + bd
    if period <= 0 or w <= 0:
        return 0.0, 0.0
    whole = math.floor(w / period)
    rem = w - whole * period
    if ad > 0 and (bd <= 0 or (a0 + a1 * g) * bd >= (b0 + b1 * g) * ad):
        hd, h0, h1, ld, l0, l1 = ad, a0, a1, bd, b0, b1
    else:
        hd, h0, h1, ld, l0, l1 = bd, b0, b1, ad, a0, a1
    take_hi = hd if hd < rem else rem  # min(rem, hd), NaN included
    take_lo = rem - take_hi
    r0 = (h0 * take_hi / hd if hd > 0 else 0.0) + (l0 * take_lo / ld if ld > 0 else 0.0)
    r1 = (h1 * take_hi / hd if hd > 0 else 0.0) + (l1 * take_lo / ld if ld > 0 else 0.0)
    return (whole * (a0 + b0) + r0) / w, (whole * (a1 + b1) + r1) / w


def max_window(pieces: tuple[Piece, ...], w: float, g: float) -> tuple[float, float]:
    """(``e0``, ``e1``) per second of the highest-energy window of ``w`` seconds over the periodic signal
    ``pieces`` at dynamic scale ``g``: its mean power is ``e0 + e1·g``.

    A moving mean over a piecewise-constant signal peaks with a window edge on a piece boundary, so
    windows starting and ending at every boundary cover the maximum; a window longer than the period holds
    whole periods and a remainder."""
    period = 0.0
    best_rho = -math.inf
    dense: Piece | None = None
    for p in pieces:
        period += p.d
        if p.d > 0:
            rho = (p.e0 + p.e1 * g) / p.d
            if rho > best_rho:
                best_rho, dense = rho, p
    if period <= 0 or w <= 0:
        return 0.0, 0.0
    if dense is not None and dense.d >= w:  # a window inside the densest piece: no window can do better
        return dense.e0 / dense.d, dense.e1 / dense.d
    whole = math.floor(w / period)
    rem = w - whole * period
    b0 = b1 = 0.0
    if rem > period * 1e-12:
        best = -math.inf
        n = len(pieces)
        # the window from boundary ``start`` walks n + 1 pieces forward (start, start+1, …) or backward (start-1,
        # start-2, …), cyclically: slices of the signal repeated four times, so no index arithmetic per piece
        ring = pieces * 4
        for start in range(n):
            for walk in (ring[n + start:2 * n + start + 1], ring[3 * n + start - 1:2 * n + start - 2:-1]):
                left, a0, a1 = rem, 0.0, 0.0
                for d, e0, e1 in walk:
                    if d > 0:
                        take = d if d < left else left
                        a0 += e0 * take / d
                        a1 += e1 * take / d
                        left -= take
                        if left <= 0:
                            break
                if a0 + a1 * g > best:
                    best, b0, b1 = a0 + a1 * g, a0, a1
    tot0 = sum(p.e0 for p in pieces)
    tot1 = sum(p.e1 for p in pieces)
    return (whole * tot0 + b0) / w, (whole * tot1 + b1) / w


@dataclass(slots=True)
class WindowPeak:
    """The highest mean power over a window: ``base_w + dyn_w · g`` at the timeline's ``g``."""

    power_w: float
    base_w: float  # the part that does not follow the clock
    dyn_w: float  # the part that does, per unit of the dynamic scale g
    level: str  # "kernels", "cycles" or "step": where the window sits
    share: float  # share of the step in which a reading lands in that high part


@dataclass(slots=True)
class StageTimeline:
    """One stage kind's step at one clock ratio (levels of the module docstring)."""

    name: str
    clock: float
    g: float
    fwd_pass: tuple[Piece, Piece]  # one layer pass of a forward chunk: [longest kernel, the rest]
    bwd_pass: tuple[Piece, Piece]
    passes: tuple[float, float]  # layer passes per forward / backward chunk
    cycle: tuple[Piece, Piece, Piece, Piece]  # [forward chunk, sends, backward chunk, sends + waiting]
    cycles: int  # chunks per step
    step: tuple[Piece, ...]  # [busy stretch, bubble, DP communication, optimizer, fixed time]
    compute_s: float  # time at the compute draw in the step
    seconds: float  # the step
    energy_j: float  # the step's energy
    # window_peak's answers by (window, g): the governor, the sensors and the report ask the same ones again
    _peaks: dict[tuple[float, float], WindowPeak] = field(default_factory=dict, repr=False, compare=False)

    @property
    def busy_s(self) -> float:
        return self.step[0].d

    @property
    def mean_w(self) -> float:
        return self.energy_j / self.seconds

    @property
    def compute_w(self) -> float:
        """The draw of compute-bound work at this clock."""
        k = self.fwd_pass[0]
        return k.energy(self.g) / k.d if k.d > 0 else self.mean_w

    @property
    def wait_w(self) -> float:
        """The draw while waiting at this clock (the bubble's)."""
        b = self.step[1]
        return b.energy(self.g) / b.d if b.d > 0 else self.step[4].energy(self.g) / max(1e-12, self.step[4].d)

    def window_peak(self, w: float, g: float | None = None) -> WindowPeak:
        """The highest mean power over any window of ``w`` seconds, at dynamic scale ``g`` (default the
        timeline's own): the largest over the levels that can hold the window.

        Finer levels resolve more: a window inside a chunk sees its kernel ripple, so when both chunks can hold
        the window the kernel level's answer is the maximum unless a coarser piece that can hold it is denser
        still (a memory-bound optimizer step above wait-bound chunks)."""
        g = self.g if g is None else g
        key = (w, g)
        hit = self._peaks.get(key)
        if hit is not None:
            return hit
        step_s = self.seconds
        busy = self.step[0].d
        cyc = self.cycle
        f_run, send1, b_run, send2 = cyc
        f_chunk, b_chunk = f_run.d, b_run.d
        cyc_s = f_chunk + send1.d + b_chunk + send2.d
        # the best so far as (power, e0, e1, level, share); one WindowPeak is built at the end
        best_p, best = -math.inf, (0.0, 0.0, "step", 1.0)
        for pattern, chunk in ((self.fwd_pass, f_chunk), (self.bwd_pass, b_chunk)):
            if w <= chunk and chunk > 0:
                e0, e1 = _two_piece_max(pattern, w, g)
                power = e0 + e1 * g
                if power > best_p:
                    kernel_d = pattern[0].d
                    near = min(1.0, max(kernel_d, w) / (kernel_d + pattern[1].d))  # a reading's window holding the kernel
                    best_p, best = power, (e0, e1, "kernels", busy / step_s * chunk / cyc_s * near)
        if best_p > -math.inf and w <= f_chunk and w <= b_chunk:
            for d, e0, e1 in (*self.step[1:], send1, send2):
                if d >= w and (e0 + e1 * g) / d > best_p:
                    break  # a coarser piece that holds the window is denser still: look further
            else:
                return self._keep(key, best_p, best)
        if w <= busy and cyc_s > 0:
            e0, e1 = max_window(cyc, w, g)
            if e0 + e1 * g > best_p:
                best_p, best = e0 + e1 * g, (e0, e1, "cycles", busy / step_s * max(f_chunk, b_chunk) / cyc_s)
        e0, e1 = max_window(self.step, w, g)
        if e0 + e1 * g > best_p:
            best_p, best = e0 + e1 * g, (e0, e1, "step", busy / step_s if step_s > 0 else 1.0)
        return self._keep(key, best_p, best)

    def _keep(self, key: tuple[float, float], power: float, best: tuple[float, float, str, float]) -> WindowPeak:
        out = WindowPeak(power, *best)
        self._peaks[key] = out
        return out

    def render(self, dt: float = 1e-3, max_points: int = 400_000) -> tuple[np.ndarray, np.ndarray]:
        """(t, W) of the step at resolution ``dt`` (≤ 1 ms by default): every layer pass of every chunk drawn
        as its longest kernel and the rest, each bin the exact energy it holds ÷ its width."""
        seg: list[Piece] = []
        for _ in range(self.cycles):
            for pattern, n, after in ((self.fwd_pass, self.passes[0], self.cycle[1]),
                                      (self.bwd_pass, self.passes[1], self.cycle[3])):
                whole = max(1, round(n))
                seg += [Piece(p.d * n / whole, p.e0 * n / whole, p.e1 * n / whole) for p in pattern] * whole
                seg.append(after)
        seg += list(self.step[1:])
        d = np.array([p.d for p in seg])
        e = np.array([p.energy(self.g) for p in seg])
        edges = np.concatenate([[0.0], np.cumsum(d)])
        cum = np.concatenate([[0.0], np.cumsum(e)])
        total = float(edges[-1])
        n_bins = int(min(max_points, max(1, math.ceil(total / dt))))
        grid = np.linspace(0.0, total, n_bins + 1)
        binned = np.diff(np.interp(grid, edges, cum)) / np.diff(grid)
        return grid[:-1], binned


def _layer_pass(k: tuple[float, float, float, float, float], pw: PassWork, r: float,
                mem: float) -> tuple[Piece, Piece]:
    n = pw.passes if pw.passes > 1.0 else 1.0
    per_compute = pw.compute / r / n
    kernel = pw.longest / r
    longest = per_compute if per_compute < kernel else kernel  # the longest kernel, no longer than a pass's compute
    rest_c, rest_m, rest_w = per_compute - longest, (pw.memory * mem + pw.comm) / n, pw.host / n
    rest_d = rest_c + rest_m + rest_w
    idle, m0, comp, m1, w1 = k
    return (_as_piece((longest, idle * longest, comp * longest)),
            _as_piece((rest_d, idle * rest_d + m0 * rest_m, comp * rest_c + m1 * rest_m + w1 * rest_w)))


def stage_timeline(dev: DeviceSpec, c: Coefficients, work: StepWork, stage: StageWork, r: float,
                   composed: ComposedStep, k: tuple[float, float, float, float, float] | None = None) -> StageTimeline:
    """``stage`` at clock ratio ``r`` inside the job's step ``composed`` (the pipeline at every stage's
    clock, and any straggler's wait): the bubble is the pipeline's; the time this stage is left idle by the
    slowest stage (or a slower device elsewhere) is spread over its cycles, as 1F1B's cadence does. ``k``: the
    device's :func:`draw_constants` (computed here when not given)."""
    g = dynamic_scale(r, c)
    if k is None:
        k = draw_constants(dev, c)
    chunks = work.micro_batches * work.vp
    fwd, bwd = stage.fwd, stage.bwd
    mem = memory_stretch(r, work.memory_floor)
    own = chunks * (fwd.compute / r + fwd.memory * mem + fwd.comm + fwd.host + bwd.compute / r + bwd.memory * mem
                    + bwd.comm + bwd.host + stage.sends) + work.in_run_comm
    opt = work.optimizer * mem
    wait = composed.total_s - own - composed.bubble_s - work.tail_comm - opt - work.fixed
    wait = wait if wait > 0.0 else 0.0
    fp, bp = _layer_pass(k, fwd, r, mem), _layer_pass(k, bwd, r, mem)
    nf = fwd.passes if fwd.passes > 1.0 else 1.0
    nb = bwd.passes if bwd.passes > 1.0 else 1.0
    half = stage.sends / 2 + work.in_run_comm / chunks / 2
    idle, m0, _, m1, w1 = k
    (fkd, fk0, fk1), (frd, fr0, fr1) = fp
    (bkd, bk0, bk1), (brd, br0, br1) = bp
    # the chunks' runs of layer passes, the sends around them, the busy stretch: plain floats, then pieces
    fd, f0, f1 = nf * (fkd + frd), nf * (fk0 + fr0), nf * (fk1 + fr1)
    bd, b0, b1 = nb * (bkd + brd), nb * (bk0 + br0), nb * (bk1 + br1)
    wc = wait / chunks
    s1d, s10, s11 = half, (idle + m0) * half, m1 * half
    s2d, s20, s21 = half + wc, idle * (half + wc) + m0 * half, m1 * half + w1 * wc
    cycle = (_as_piece((fd, f0, f1)), _as_piece((s1d, s10, s11)), _as_piece((bd, b0, b1)), _as_piece((s2d, s20, s21)))
    busy_d, busy0, busy1 = chunks * (fd + s1d + bd + s2d), chunks * (f0 + s10 + b0 + s20), chunks * (f1 + s11 + b1 + s21)
    bub, tc, fx = composed.bubble_s, work.tail_comm, work.fixed
    bub0, tc0, opt0, fx0 = idle * bub, (idle + m0) * tc, (idle + m0) * opt, idle * fx
    bub1, tc1, opt1, fx1 = w1 * bub, m1 * tc, m1 * opt, w1 * fx
    step = (_as_piece((busy_d, busy0, busy1)), _as_piece((bub, bub0, bub1)), _as_piece((tc, tc0, tc1)),
            _as_piece((opt, opt0, opt1)), _as_piece((fx, fx0, fx1)))
    seconds = busy_d + bub + tc + opt + fx
    e0 = busy0 + bub0 + tc0 + opt0 + fx0
    e1 = busy1 + bub1 + tc1 + opt1 + fx1
    return StageTimeline(name=stage.name, clock=r, g=g, fwd_pass=fp, bwd_pass=bp, passes=(nf, nb), cycle=cycle,
                         cycles=chunks, step=step, compute_s=chunks * (fwd.compute + bwd.compute) / r,
                         seconds=seconds, energy_j=e0 + e1 * g)
