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
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from powertrain.spec.run import RunConfig


class SpecError(ValueError):
    """A sweep spec that cannot be read or expanded; the message names the place and the fix."""


class LaunchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "slurm"] = "local"
    time_limit_min: float = Field(default=60.0, gt=0, description="per run; the run is killed after it")
    retries: int = Field(default=0, ge=0, description="automatic re-tries of a failed run")
    partition: str | None = None
    account: str | None = None
    slurm_extra: list[str] = Field(default_factory=list, description="extra #SBATCH directives")
    sampler_rate_hz: float = Field(default=20.0, gt=0)
    memory_check: Literal["reject", "warn"] = Field(
        default="reject",
        description="a run the memory model predicts not to fit: reject it, or launch it with a warning",
    )


class SweepSpec(BaseModel):
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
_SECTIONS = ("layout", "knobs", "hardware", "protocol", "data")


def _set_dotted(target: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = target
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = copy.deepcopy(value)


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


def _resolve_variant(name: str, variants: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, Any]:
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
            out.update(_resolve_variant(part, variants, (*seen, name)))
        elif isinstance(part, dict):
            out.update(part)
        elif part is None:
            continue
        else:
            raise SpecError(f"variant {name!r}: expected a mapping of settings or names of other variants")
    return out


class ExpandedRun(BaseModel):
    """One point of the grid, before validation: its settings and the configuration they give."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    index: int
    settings: dict[str, Any]  # the grid values that made this run (dotted keys), variant included
    variant: str | None
    raw: dict[str, Any]  # the merged configuration dict
    config: RunConfig | None  # None when the merged dict does not validate
    error: str | None = None


def expand(spec: SweepSpec) -> list[ExpandedRun]:
    """Every grid point of ``spec`` in order, merged onto ``base`` and validated as a RunConfig."""
    groups = [_group_settings(g, f"grid[{i}]") for i, g in enumerate(spec.grid)] or [[{}]]
    runs: list[ExpandedRun] = []
    for index, combo in enumerate(itertools.product(*groups)):
        settings: dict[str, Any] = {}
        for part in combo:
            settings.update(part)
        variant = settings.pop("variant", None)
        raw = copy.deepcopy(spec.base)
        apply_settings(raw, settings)
        if variant is not None:
            apply_settings(raw, _resolve_variant(str(variant), spec.variants))
            settings["variant"] = variant
        raw.setdefault("name", spec.name)
        try:
            config = RunConfig.model_validate(raw)
            error = None
        except ValidationError as exc:
            config, error = None, _pydantic_message(exc)
        except (KeyError, ValueError) as exc:
            config, error = None, str(exc).strip("'\"")
        runs.append(ExpandedRun(index=index, settings=settings, variant=variant, raw=raw, config=config, error=error))
    return runs


def _pydantic_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"])
        parts.append(f"{loc}: {e['msg']}" if loc else e["msg"])
    return "; ".join(parts)


def load_sweep_spec(path: str | Path) -> SweepSpec:
    """Read and check a sweep spec file; errors name the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path} is not valid YAML: {exc}") from None
    return parse_sweep_spec(raw, source=str(path))


def parse_sweep_spec(raw: Any, source: str = "spec") -> SweepSpec:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping with keys name, base, grid, variants, launch")
    if "grid" not in raw and "model" in raw:  # a single-run spec is a sweep of one
        raw = {"name": str(raw.get("name", Path(source).stem)).replace(" ", "-"), "base": raw}
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(f"{source}: {_pydantic_message(exc)}") from None
