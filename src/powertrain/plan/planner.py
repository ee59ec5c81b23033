"""Turning a sweep spec into runs: validate each before launch, check memory, merge duplicates.

Each expanded grid point becomes a :class:`PlannedRun` with one of three statuses:

* ``planned`` — valid and expected to fit in device memory;
* ``rejected`` — a rule is violated (the rule, the numbers and a suggested fix are in ``reasons``),
  including "does not fit in memory" from :mod:`powertrain.predict.memory`;
* ``unsupported`` — a valid configuration that the built-in trainer cannot run (e.g. torch's 1F1B
  needs at least as many micro-batches as pipeline stages; Megatron-LM runs it with a larger bubble);
* ``duplicate`` — its *effective* configuration equals an earlier run's (knobs that change nothing
  for that layout, such as async TP at TP=1, are normalised away); ``duplicate_of`` names the run kept.

A planned run that sets such knobs lists them in ``unused_knobs``: ``plan`` and ``sweep`` show them as a
warning (a study sweep crosses variants with layouts on purpose), and the sweep runner hands the run
its spec without them (:func:`powertrain.spec.effective.as_single_run`); ``powertrain run`` refuses them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from powertrain.plan.sweep_spec import SpecError, SweepSpec, iter_expand
from powertrain.predict.calibration import Calibration, load_calibration
from powertrain.predict.memory import fits
from powertrain.spec.bounds import DEFAULT_MAX_POINTS
from powertrain.spec.effective import effective_config
from powertrain.spec.run import RunConfig
from powertrain.spec.validate import validate

Status = Literal["planned", "rejected", "unsupported", "duplicate"]

# Rules that are limits of the built-in trainer (torch.distributed.pipelining; its LoRA has no fused
# Q/K/V layer and no adapters on stacked experts), not of the configuration itself: other engines
# (Megatron-Core, NeMo) run these points.
TRAINER_LIMIT_RULES = frozenset({"pipeline_microbatches", "lora_fused_qkv_unsupported",
                                 "lora_expert_targets_unsupported"})


@dataclass
class PlannedRun:
    id: str
    index: int
    settings: dict[str, Any]
    variant: str | None
    config: RunConfig | None
    status: Status = "planned"
    reasons: list[str] = field(default_factory=list)
    mem_per_device_bytes: float | None = None
    mem_capacity_bytes: float | None = None
    duplicate_of: str | None = None
    unused_knobs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        if self.mem_per_device_bytes is None or self.mem_capacity_bytes is None:
            return None
        return self.mem_per_device_bytes <= self.mem_capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "index": self.index,
            "status": self.status,
            "reasons": self.reasons,
            "warnings": self.warnings,
            "variant": self.variant,
            "axes": self.settings,
            "layout": self.config.layout.label() if self.config else None,
            "config": self.config.model_dump(mode="json") if self.config else None,
            "mem_per_device_bytes": self.mem_per_device_bytes,
            "mem_capacity_bytes": self.mem_capacity_bytes,
            "fits": self.fits,
            "duplicate_of": self.duplicate_of,
            "unused_knobs": self.unused_knobs,
        }


@dataclass
class Plan:
    spec: SweepSpec
    runs: list[PlannedRun]

    @property
    def to_launch(self) -> list[PlannedRun]:
        return [r for r in self.runs if r.status == "planned"]

    def counts(self) -> dict[str, int]:
        out = {"planned": 0, "rejected": 0, "unsupported": 0, "duplicate": 0}
        for r in self.runs:
            out[r.status] += 1
        return out


def _slug(value: Any) -> str:
    if isinstance(value, dict):
        value = value.get("name", "inline")
    text = str(value).lower().replace("+", "-")
    return re.sub(r"[^a-z0-9.-]+", "-", text).strip("-") or "x"


def _flatten(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in settings.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and full != "model":
            out.update(_flatten(value, f"{full}."))
        else:
            out[full] = value
    return out


_SHORT = {"microbatch": "mb", "globalbatch": "gb", "recompute": "rc", "sequenceparallel": "sp",
          "distributedoptimizer": "distopt", "ppschedule": "", "virtualstages": "v", "ppsplit": "split",
          "powerlimitw": "pl", "smclockmhz": "sm", "memclockmhz": "mem"}


def _short(key: str) -> str:
    """The last part of a dotted key, shortened; only ``a-z 0-9`` (a run id names a folder and a job)."""
    name = re.sub(r"[^a-z0-9]+", "", key.split(".")[-1].lower())
    return _SHORT.get(name, name)


# a run id names a folder (with a repeat's ``.rK`` and powertrain's suffixes after it): well under the
# 200 bytes of core.names.MAX_NAME_BYTES; longer ids keep their start and end in a hash of the whole
MAX_RUN_ID = 160


def run_id(settings: dict[str, Any]) -> str:
    """A readable, stable id from the grid values, e.g. ``gpt3-175b.tp2.pp16.base``.

    Only ``a-z 0-9 . -`` appear in it, whatever the keys and values hold; at most :data:`MAX_RUN_ID`
    characters (a longer one is cut and ends in 8 hex digits of its hash, so ids stay distinct)."""
    parts = []
    for key, value in _flatten(settings).items():
        if isinstance(value, bool):
            if value and _short(key):
                parts.append(_short(key))
            continue
        if key in ("model", "variant"):
            parts.append(_slug(value))
        else:
            parts.append(f"{_short(key)}{_slug(value)}")
    rid = ".".join(parts).strip(".") or "run"
    if len(rid) > MAX_RUN_ID:  # a folder name has 255 bytes; many long axes would pass them
        rid = f"{rid[:MAX_RUN_ID - 9].rstrip('.-')}-{hashlib.sha256(rid.encode()).hexdigest()[:8]}"
    return rid


def _memory(config: RunConfig, calibration: Calibration | None = None) -> tuple[float | None, float | None, str | None]:
    """(bytes per device, capacity, reason it does not fit) from the analytical memory model.

    The memory model is part of powertrain (no optional dependency): a failure to import or run it is
    an error, never a plan that silently skips the memory check. ``calibration``: the profile, loaded
    once per plan by the caller (looking it up again for each point was 40 % of planning a big grid)."""
    ok, need, breakdown = fits(config, calibration)
    capacity = breakdown.get("capacity_bytes") if isinstance(breakdown, dict) else None
    if ok:
        return need, capacity, None
    cap_txt = f" of {capacity / 2**30:.0f} GiB" if capacity else ""
    return need, capacity, (
        f"memory: needs {need / 2**30:.1f} GiB per device{cap_txt} — fix: raise tp/pp, enable fsdp "
        "or full recompute, or lower the micro-batch"
    )


def plan(spec: SweepSpec, max_points: int = DEFAULT_MAX_POINTS) -> Plan:
    """Expand, validate, size and de-duplicate every run of ``spec``.

    At most ``max_points`` grid points, and as many runs once repeats are counted; more is a
    :class:`SpecError` naming the number, before anything is built. Time and memory are linear in the
    points: each is expanded, checked and kept as its :class:`PlannedRun` (the merged dict is dropped),
    and a duplicate is found by its effective configuration in a dict, not by comparing with each run."""
    runs: list[PlannedRun] = []
    seen_ids: dict[str, int] = {}
    seen_effective: dict[str, str] = {}
    calibration = load_calibration(None)
    for exp in iter_expand(spec, max_points):
        rid = run_id(exp.settings)
        if rid in seen_ids:
            seen_ids[rid] += 1
            rid = f"{rid}.{seen_ids[rid]}"
        else:
            seen_ids[rid] = 0
        run = PlannedRun(id=rid, index=exp.index, settings=exp.settings, variant=exp.variant, config=exp.config)
        runs.append(run)
        if exp.config is None:
            run.status, run.reasons = "rejected", [f"spec: {exp.error}"]
            continue
        violations = validate(exp.config)
        resolved = None
        with contextlib.suppress(ValueError):  # show the derived dp even on rejected runs
            run.config = resolved = exp.config.model_copy(update={
                "layout": exp.config.layout.resolve(exp.config.hardware.world), "name": rid})
        if violations:
            limits_only = all(v.rule in TRAINER_LIMIT_RULES for v in violations)
            run.status = "unsupported" if limits_only else "rejected"
            run.reasons = [str(v) for v in violations]
            continue
        if resolved is None:  # a valid run whose layout does not resolve: the error, as it always was
            world = exp.config.hardware.world
            resolved = exp.config.model_copy(update={"layout": exp.config.layout.resolve(world), "name": rid})
        run.config = resolved
        need, capacity, why = _memory(run.config, calibration)
        run.mem_per_device_bytes, run.mem_capacity_bytes = need, capacity
        if why and spec.launch.memory_check == "reject":
            run.status, run.reasons = "rejected", [why]
            continue
        if why:
            run.warnings.append(f"predicted not to fit, launched anyway (launch.memory_check: warn): {why}")
        effective, run.unused_knobs = effective_config(run.config)
        key = json.dumps(effective, sort_keys=True)
        if key in seen_effective:
            run.status = "duplicate"
            run.duplicate_of = seen_effective[key]
            run.reasons = [f"same effective configuration as {run.duplicate_of}"
                           + (f": {', '.join(run.unused_knobs)} change nothing" if run.unused_knobs else "")]
        else:
            seen_effective[key] = rid
    total = sum(r.config.protocol.repeats if r.config and r.status == "planned" else 1 for r in runs)
    if total > max_points:
        raise SpecError(f"protocol.repeats: the grid's points repeated make {total:,} runs, over the limit of "
                        f"{max_points:,}; lower repeats, split the sweep, or raise the limit with --max-points")
    return Plan(spec=spec, runs=_expand_repeats(runs))


def _expand_repeats(runs: list[PlannedRun]) -> list[PlannedRun]:
    """A planned run whose protocol asks for N repeats becomes N runs ``<id>.r1`` … ``<id>.rN``."""
    out: list[PlannedRun] = []
    for run in runs:
        cfg = run.config
        n = cfg.protocol.repeats if cfg and run.status == "planned" else 1
        if cfg is None or n == 1:
            out.append(run)
            continue
        for k in range(1, n + 1):
            rid = f"{run.id}.r{k}"
            out.append(PlannedRun(
                id=rid, index=run.index, settings={**run.settings, "repeat": k}, variant=run.variant,
                config=cfg.model_copy(update={"name": rid}), reasons=list(run.reasons),
                mem_per_device_bytes=run.mem_per_device_bytes, mem_capacity_bytes=run.mem_capacity_bytes,
                unused_knobs=run.unused_knobs, warnings=list(run.warnings)))
    return out
