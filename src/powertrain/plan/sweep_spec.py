"""Sweep specs: a base configuration plus a grid, expanded into concrete run configurations.

A sweep spec is YAML::

    name: study-32xh200-parallelism
    base:                      # a RunConfig (partial): model, layout, knobs, hardware, protocol, data
      hardware: {nodes: 4, devices_per_node: 8, device: h200}
      knobs: {global_batch: 128, micro_batch: 1, precision: bf16}
    grid:                      # groups, multiplied together (cartesian product of groups)
      - cases:                 # an explicit list of settings (dotted keys or nested mappings)
          - {model: gpt3-175b, layout.tp: 2, layout.pp: 16}
          - {model: gpt3-175b, layout.tp: 4, layout.pp: 8}
      - zip:                   # paired lists of equal length
          layout.tp: [1, 2]
          layout.pp: [2, 1]
      - knobs.micro_batch: [1, 2, 4, 8]     # a plain mapping: the cartesian product of its lists
      - variant: [base, overlap]            # named knob sets, defined below
    variants:
      base: {}
      overlap: {knobs.overlap.async_tp: true}
      overlap+recompute: [overlap, {knobs.recompute: full}]   # composed from others
    launch: {backend: local, time_limit_min: 30, partition: debug, slurm_extra: ["--exclusive"]}

Values that can be derived (dp from the world size, micro-batches per step) are computed by the
planner, never typed. Expansion is pure: the same spec always yields the same runs in the same order.

Bounds (:mod:`powertrain.spec.bounds`): the file is at most 1 MiB of UTF-8 whose YAML aliases add at
most 10 000 nodes; no key or value holds a newline, carriage return or NUL (a multi-line
``description`` excepted); the grid has at most ``max_points`` points (default 100 000), counted
from the axes' lengths before anything is expanded. The ``launch`` values that reach a Slurm batch
script match what Slurm accepts (:mod:`powertrain.spec.slurm`).
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from powertrain.core.sampling import MAX_RATE_HZ
from powertrain.spec.bounds import (
    DEFAULT_MAX_POINTS,
    SpecFileError,
    control_char_field,
    load_spec_yaml,
    shown,
)
from powertrain.spec.run import RunConfig
from powertrain.spec.slurm import check_name, check_option
from powertrain.spec.values import SpecModel


class SpecError(ValueError):
    """A sweep spec that cannot be read or expanded; the message names the place and the fix."""


class LaunchOptions(SpecModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "slurm"] = "local"
    time_limit_min: float = Field(default=60.0, gt=0, le=525_600, allow_inf_nan=False,
                                  description="per run (at most a year); the run is killed after it")
    retries: int = Field(default=0, ge=0, le=100, description=(
        "re-runs of a run that failed (not of one out of memory, which would fail again), each after a "
        "back-off; every attempt is kept in sweep.json and under .attempts/"))
    retry_backoff_s: float = Field(default=30.0, ge=0, le=86_400, allow_inf_nan=False,
                                   description="wait before the first re-try; doubled before each further one")
    partition: str | None = Field(default=None, description="Slurm partition (or comma list)")
    account: str | None = Field(default=None, description="Slurm account")
    qos: str | None = Field(default=None, description="Slurm quality of service (or comma list)")
    slurm_extra: list[str] = Field(default_factory=list, max_length=64, description=(
        "extra #SBATCH options from an allow-list (powertrain.spec.slurm.ALLOWED), each one --key or --key=value "
        "written out in full"))
    pending_limit_min: float = Field(default=60.0, gt=0, le=525_600, allow_inf_nan=False, description=(
        "a run's Slurm job still pending (never started) after this many minutes is cancelled and the run "
        "marked failed; raise it for a busy queue"))
    # the sampler's own ceiling (core.sampling.MAX_RATE_HZ): above it every run would fail after its retries
    sampler_rate_hz: float = Field(default=20.0, gt=0, le=MAX_RATE_HZ, allow_inf_nan=False,
                                   description="telemetry samples per second, at most 1000")
    memory_check: Literal["reject", "warn"] = Field(
        default="reject",
        description="a run the memory model predicts not to fit: reject it, or launch it with a warning",
    )

    @field_validator("partition", "qos")
    @classmethod
    def _slurm_name_list(cls, v: str | None) -> str | None:
        return None if v is None else check_name("Slurm name", v, allow_list=True)

    @field_validator("account")
    @classmethod
    def _slurm_name(cls, v: str | None) -> str | None:
        return None if v is None else check_name("Slurm account", v)

    @field_validator("slurm_extra")
    @classmethod
    def _slurm_options(cls, v: list[str]) -> list[str]:
        for i, opt in enumerate(v):
            try:
                check_option(f"launch.slurm_extra[{i}]", opt)
            except ValueError as exc:  # the message names the item itself: no "Value error," before it
                raise PydanticCustomError("slurm_option", "{why}", {"why": str(exc)}) from None
        return v


class SweepSpec(SpecModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
    description: str | None = None
    base: dict[str, Any] = Field(default_factory=dict)
    grid: list[dict[str, Any]] = Field(default_factory=list)
    variants: dict[str, Any] = Field(default_factory=dict)
    launch: LaunchOptions = LaunchOptions()

    @field_validator("grid", mode="before")
    @classmethod
    def _grid_list(cls, v: Any) -> Any:
        if isinstance(v, dict):  # a single group written without the list
            return [v]
        return v


# -- nested dict helpers --------------------------------------------------------------------------
_SECTIONS = ("layout", "knobs", "hardware", "protocol", "data", "task", "launch")


def _set_dotted(target: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = target
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = _copy_plain(value)


def apply_settings(target: dict[str, Any], settings: dict[str, Any]) -> None:
    """Apply ``{"layout.tp": 2, "knobs": {"recompute": "full"}}`` onto a nested dict, in place.

    Mappings under a section (layout, knobs, …) merge key by key; ``model`` is replaced whole.
    """
    for key, value in settings.items():
        if isinstance(value, dict) and key.split(".")[0] in _SECTIONS:
            apply_settings(target, {f"{key}.{k}": v for k, v in value.items()})
        else:
            _set_dotted(target, key, value)


# -- expansion -------------------------------------------------------------------------------------
def _group_settings(group: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The list of settings one grid group stands for."""
    if set(group) == {"cases"}:
        cases = group["cases"]
        if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
            raise SpecError(f"{where}: `cases` must be a list of mappings, e.g. - {{layout.tp: 2, layout.pp: 4}}")
        return [dict(c) for c in cases]
    if set(group) == {"zip"}:
        axes = group["zip"]
        if not isinstance(axes, dict) or not all(isinstance(v, list) for v in axes.values()):
            raise SpecError(f"{where}: `zip` must map keys to lists of equal length")
        lengths = {k: len(v) for k, v in axes.items()}
        if len(set(lengths.values())) > 1:
            raise SpecError(f"{where}: zipped lists differ in length ({lengths}); give every list the same length")
        keys = list(axes)
        return [dict(zip(keys, values, strict=True)) for values in zip(*axes.values(), strict=True)]
    if "cases" in group or "zip" in group:
        raise SpecError(f"{where}: a group holds either `cases`, or `zip`, or plain axes — split it into groups")
    keys = list(group)
    lists = []
    for k in keys:
        v = group[k]
        lists.append(v if isinstance(v, list) else [v])
        if isinstance(v, list) and not v:
            raise SpecError(f"{where}: axis {k!r} has an empty list of values")
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*lists)]


def _group_size(group: dict[str, Any]) -> int:
    """How many settings a grid group stands for, from its lists' lengths alone (nothing is built).

    A malformed group counts 1 here; :func:`_group_settings` names its problem."""
    if set(group) == {"cases"}:
        return len(group["cases"]) if isinstance(group["cases"], list) else 1
    if set(group) == {"zip"}:
        axes = group["zip"]
        lists = [v for v in axes.values() if isinstance(v, list)] if isinstance(axes, dict) else []
        return max((len(v) for v in lists), default=1)
    if "cases" in group or "zip" in group:
        return 1
    return math.prod(len(v) if isinstance(v, list) else 1 for v in group.values())


def grid_size(spec: SweepSpec) -> int:
    """Points of ``spec``'s grid (the product of its groups' sizes), counted before expansion."""
    return math.prod(_group_size(g) for g in spec.grid)


def check_grid_size(spec: SweepSpec, max_points: int = DEFAULT_MAX_POINTS) -> int:
    """The grid's point count; a :class:`SpecError` naming the number when it exceeds ``max_points``."""
    n = grid_size(spec)
    if n > max_points:
        raise SpecError(f"grid: {n:,} points, over the limit of {max_points:,}; split the sweep into smaller ones "
                        "or raise the limit with --max-points")
    return n


def _resolve_variant(name: str, variants: dict[str, Any], seen: tuple[str, ...] = (),
                     memo: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The settings of variant ``name``, composed from the variants it names (each resolved once)."""
    memo = {} if memo is None else memo
    if name in memo:
        return memo[name]
    if name not in variants:
        known = ", ".join(sorted(variants)) or "none defined"
        raise SpecError(f"unknown variant {name!r}; define it under `variants:` (known: {known})")
    if name in seen:
        raise SpecError(f"variant {name!r} refers to itself through {' → '.join(seen)}")
    body = variants[name]
    parts = body if isinstance(body, list) else [body]
    out: dict[str, Any] = {}
    for part in parts:
        if isinstance(part, str):
            out.update(_resolve_variant(part, variants, (*seen, name), memo))
        elif isinstance(part, dict):
            out.update(part)
        elif part is None:
            continue
        else:
            raise SpecError(f"variant {name!r}: expected a mapping of settings or names of other variants")
    memo[name] = out
    return out


@dataclass
class ExpandedRun:
    """One point of the grid, before validation: its settings and the configuration they give."""

    index: int
    settings: dict[str, Any]  # the grid values that made this run (dotted keys), variant included
    variant: str | None
    raw: dict[str, Any]  # the merged configuration dict
    config: RunConfig | None  # None when the merged dict does not validate
    error: str | None = None


def _copy_plain(value: Any) -> Any:
    """A copy of YAML data (dicts, lists, scalars): what ``copy.deepcopy`` gives, without its memo and
    dispatch, which cost more than validating the point; anything else goes through ``deepcopy``."""
    if isinstance(value, dict):
        return {k: _copy_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return copy.deepcopy(value)


def expand(spec: SweepSpec, max_points: int = DEFAULT_MAX_POINTS) -> list[ExpandedRun]:
    """Every grid point of ``spec`` in order, merged onto ``base`` and validated as a RunConfig.

    A grid of more than ``max_points`` points is refused (:class:`SpecError`) before it is built, and so
    is one whose groups set one axis twice (:func:`overlapping_axes`)."""
    return list(iter_expand(spec, max_points))


def iter_expand(spec: SweepSpec, max_points: int = DEFAULT_MAX_POINTS) -> Iterator[ExpandedRun]:
    """:func:`expand` one point at a time (the planner keeps what it needs of each, not every merged dict).

    The checks run when the first point is asked for. Time and memory are linear in the points."""
    check_grid_size(spec, max_points)
    overlap = overlapping_axes(spec)
    if overlap:
        raise SpecError(overlap)
    groups = [_group_settings(g, f"grid[{i}]") for i, g in enumerate(spec.grid)] or [[{}]]
    memo: dict[str, dict[str, Any]] = {}
    for index, combo in enumerate(itertools.product(*groups)):
        settings: dict[str, Any] = {}
        for part in combo:
            settings.update(part)
        variant = settings.pop("variant", None)
        raw = _copy_plain(spec.base)
        apply_settings(raw, settings)
        if variant is not None:
            apply_settings(raw, _resolve_variant(str(variant), spec.variants, memo=memo))
            settings["variant"] = variant
        raw.setdefault("name", spec.name)
        try:
            config = RunConfig.model_validate(raw)
            error = None
        except ValidationError as exc:
            config, error = None, pydantic_message(exc)
        except (KeyError, ValueError) as exc:
            config, error = None, str(exc).strip("'\"")
        yield ExpandedRun(index=index, settings=settings, variant=variant, raw=raw, config=config, error=error)


def pydantic_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = re.sub(r"\s+", " ", e["msg"])  # one line, whatever the validator wrote
        # a message that names its own place (launch.slurm_extra[2] …) is not prefixed with it again
        parts.append(f"{shown(loc)}: {msg}" if loc and not msg.startswith(f"{loc}[") else msg)
    return "; ".join(parts)


def load_sweep_spec(path: str | Path) -> SweepSpec:
    """Read and check a sweep spec file; errors name the file and the problem, on one line.

    The file is read within the bounds of :mod:`powertrain.spec.bounds` (size, encoding, aliases)."""
    path = Path(path)
    try:
        raw = load_spec_yaml(path)
    except SpecFileError as exc:
        raise SpecError(str(exc)) from None
    return parse_sweep_spec(raw, source=shown(path))


def parse_sweep_spec(raw: Any, source: str = "spec") -> SweepSpec:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping with keys name, base, grid, variants, launch")
    found = control_char_field(raw, skip=frozenset({"description"}))
    if found:
        raise SpecError(f"{source}: {found[0]} holds {found[1]}, which no spec value may hold "
                        "(a value that reaches a batch script would start a new command)")
    if "grid" not in raw and "model" in raw:  # a single-run spec is a sweep of one
        raw = {"name": str(raw.get("name", Path(source).stem)).replace(" ", "-"), "base": raw}
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(f"{source}: {pydantic_message(exc)}") from None
    _check_per_sweep_settings(spec, source)
    overlap = overlapping_axes(spec)
    if overlap:
        raise SpecError(f"{source}: {overlap}")
    _check_variants_used(spec, source)
    return spec


def _reached(key: str, value: Any) -> Iterator[str]:
    """The dotted keys one setting reaches: ``protocol: {idle_baseline_s: 1}`` reaches ``protocol`` and
    ``protocol.idle_baseline_s`` (mappings under a section merge key by key, see :func:`apply_settings`)."""
    yield key
    if isinstance(value, dict) and key.split(".")[0] in _SECTIONS:
        for k, v in value.items():
            yield from _reached(f"{key}.{k}", v)


def _settings_of(spec: SweepSpec) -> Iterator[tuple[str, str, Any]]:
    """(where, key, value) of every setting the grid and the variants hold, read from the spec as
    written (nothing is expanded: a grid's size is checked only when it is planned)."""
    for i, group in enumerate(spec.grid):
        where = f"grid[{i}]"
        if set(group) == {"cases"} and isinstance(group["cases"], list):
            for case in group["cases"]:
                if isinstance(case, dict):
                    yield from ((where, k, v) for k, v in case.items())
        elif set(group) == {"zip"} and isinstance(group["zip"], dict):
            for k, values in group["zip"].items():
                yield from ((where, k, v) for v in (values if isinstance(values, list) else [values]))
        else:
            for k, values in group.items():
                yield from ((where, k, v) for v in (values if isinstance(values, list) else [values]))
    for name, body in spec.variants.items():
        for part in body if isinstance(body, list) else [body]:
            if isinstance(part, dict):
                yield from ((f"variants.{name}", k, v) for k, v in part.items())


def _leaves(key: str, value: Any) -> Iterator[str]:
    """The dotted keys one setting writes a value to: ``layout: {tp: 2}`` writes ``layout.tp`` (mappings under a
    section merge key by key, see :func:`apply_settings`; anything else is written whole)."""
    if isinstance(value, dict) and key.split(".")[0] in _SECTIONS:
        for k, v in value.items():
            yield from _leaves(f"{key}.{k}", v)
    else:
        yield key


def overlapping_axes(spec: SweepSpec) -> str | None:
    """The first axis that two grid groups both set (one line), else None.

    Groups are multiplied, and each point applies them in order: an axis that a later group sets again
    would override the earlier group's values without a word, and the points would repeat one
    configuration. A key overlaps the keys under it too (``model`` and ``model.layers``)."""
    whole: dict[str, set[int]] = {}  # key → the groups that write it
    under: dict[str, dict[int, str]] = {}  # key → the groups that write a key under it, and the first such key
    for where, key, value in _settings_of(spec):
        if not where.startswith("grid["):
            continue
        i = int(where[len("grid["):-1])
        for leaf in _leaves(key, value):
            parts = leaf.split(".")
            prefixes = [".".join(parts[:n]) for n in range(1, len(parts))]
            clashes = [(j, leaf) for j in whole.get(leaf, ()) if j != i]
            clashes += [(j, k) for j, k in under.get(leaf, {}).items() if j != i]
            clashes += [(j, p) for p in prefixes for j in whole.get(p, ()) if j != i]
            if clashes:
                j, other = min(clashes)
                said = f"both set {leaf}" if other == leaf else f"set {other} and {leaf}"
                return (f"grid[{j}] and grid[{i}] {said}: the later group would override the earlier one's values; "
                        "set each axis in one group (pair values with `zip` or `cases`)")
            whole.setdefault(leaf, set()).add(i)
            for p in prefixes:
                under.setdefault(p, {}).setdefault(i, leaf)
    return None


def _check_per_sweep_settings(spec: SweepSpec, source: str) -> None:
    """An idle baseline is recorded once per sweep, from ``base``: a grid or variant value of it would be
    planned into each run's configuration and never recorded."""
    for where, key, value in _settings_of(spec):
        if "protocol.idle_baseline_s" in _reached(key, value):
            raise SpecError(f"{source}: {where} sets protocol.idle_baseline_s, but an idle baseline is recorded once "
                            "per sweep, before its runs; set it under base.protocol")


def _check_variants_used(spec: SweepSpec, source: str) -> None:
    """Variants apply only through a ``variant`` axis: one that no axis lists (itself or composed into a
    listed one) would be accepted and never run."""
    if not spec.variants:
        return
    listed = {str(v) for where, key, v in _settings_of(spec) if key == "variant" and where.startswith("grid")}
    names = ", ".join(spec.variants)
    if not listed:
        raise SpecError(f"{source}: {_defined(list(spec.variants))} but no grid group names `variant:`; add "
                        f"`- variant: [{names}]` to the grid, or drop {'it' if len(spec.variants) == 1 else 'them'}")
    if listed - set(spec.variants):
        return  # expand names the unknown variant, the bigger mistake
    used: set[str] = set()
    todo = list(listed)
    while todo:  # listed variants and those they compose, each visited once
        name = todo.pop()
        if name in used or name not in spec.variants:
            continue
        used.add(name)
        body = spec.variants[name]
        todo += [p for p in (body if isinstance(body, list) else [body]) if isinstance(p, str)]
    unused = [n for n in spec.variants if n not in used]
    if unused:
        them = "it" if len(unused) == 1 else "them"
        raise SpecError(f"{source}: {_defined(unused)} but no `variant:` axis lists {them} (nor does a listed "
                        f"variant compose {them}); list {them} in a `variant:` axis, or drop {them}")


def _defined(names: list[str]) -> str:
    return f"variant {names[0]} is defined" if len(names) == 1 else f"variants {', '.join(names)} are defined"
