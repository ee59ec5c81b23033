"""What the user asks ``advise`` for: the job, its limits and what "best" means.

:class:`Request` is plain data (no pydantic: the search builds 10⁵ candidates from it). It is built
from the command line by :func:`make_request`, which checks every field once and raises a one-line
``ValueError`` naming the field and the fix. :func:`impossible` finds requests no layout can
satisfy whatever the search tries (a node budget below the node's idle draw, a cap below idle), so
they are refused before anything is enumerated, with the nearest feasible change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import get_args

from pydantic import ValidationError

from powertrain.hardware import DeviceSpec, hardware_from_option, is_cpu_name
from powertrain.predict.node_power import nodes_power, undescribed
from powertrain.spec.bounds import load_spec_yaml
from powertrain.spec.model import ModelConfig, get_model
from powertrain.spec.run import Precision
from powertrain.spec.validate import node_holds

OBJECTIVES = ("throughput", "energy", "time", "cost", "pareto")
ENGINES = ("builtin", "megatron")


# The share of each device's memory advise keeps free unless told otherwise (issue 32): the memory model counts
# weights, gradients, optimizer state, activations, 3 % fragmentation and 2.5 GB of runtime
# (predict/memory.py); what it does not count — the caching allocator's fragmentation beyond that under a
# changing batch, NCCL's and the communicators' buffers, transient peaks of the loss and the optimizer step —
# is what a configuration at 99 % of the memory runs out of first.
DEFAULT_MEM_HEADROOM = 0.10
MEM_HEADROOM_WHY = ("the allocator's fragmentation beyond the 3 % modelled, NCCL buffers and transient peaks the "
                    "memory model does not count")


@dataclass(frozen=True)
class Constraints:
    """Limits every proposed configuration must keep (None: no limit)."""

    power_cap_w: float | None = None  # per-GPU power limit the site imposes: candidates cap at most this
    node_kw: float | None = None  # predicted peak node power (devices + host) ≤ this
    rack_kw: float | None = None  # predicted peak power of ``nodes_per_rack`` nodes ≤ this
    nodes_per_rack: int | None = None  # None: all the job's nodes share the rack budget
    max_temp_c: float | None = None  # predicted hottest GPU ≤ this
    no_throttle: bool = False  # no slot may be predicted to throttle
    mem_headroom: float = DEFAULT_MEM_HEADROOM  # keep this share of device memory free (0.1 = 10 %)


@dataclass(frozen=True)
class Objective:
    """What to rank by. ``tokens`` (time, cost) and the prices (cost) are read by those objectives only;
    :func:`make_request` refuses them with any other."""

    kind: str = "throughput"
    tokens: float | None = None  # tokens to train (time-to-train and cost)
    gpu_hour_price: float | None = None  # currency per GPU-hour
    kwh_price: float | None = None  # currency per kWh (node energy, host included)


@dataclass(frozen=True)
class Request:
    """The job: model, hardware, batch; limits; objective; the knob values to search."""

    model: ModelConfig
    device_name: str
    device: DeviceSpec
    nodes: int
    devices_per_node: int
    global_batch: int
    precision: str
    engine: str
    constraints: Constraints = Constraints()
    objective: Objective = Objective()
    power_caps: tuple[float | None, ...] = (None,)  # per-GPU caps to try (None: the device default)
    clock_locks: tuple[float, ...] = ()  # SM clock locks to try, as a fraction of the maximum clock
    max_vp: int = 8  # largest interleaving (virtual stages) tried
    hardware_note: str | None = None  # how --hardware was read, where it was not an entry's own name

    @property
    def world(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def is_cpu(self) -> bool:
        return is_cpu_name(self.device_name)


def load_model(model: str, seq_len: int | None) -> ModelConfig:
    """A catalog name, or a YAML file holding a model (or a run spec whose ``model`` is one)."""
    path = Path(model)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise ValueError(f"--model: file {model} does not exist; give a catalog name or a model YAML")
        try:  # read within the spec bounds (size, encoding, YAML aliases) every spec file is held to
            raw = load_spec_yaml(path)
        except ValueError as exc:
            raise ValueError(f"--model {model}: {str(exc).splitlines()[0]}") from None
        raw = raw.get("model", raw) if isinstance(raw, dict) else raw
        try:
            m = get_model(raw) if isinstance(raw, (dict, str)) else None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "model"
            raise ValueError(f"--model {model}: model.{where}: {first['msg']} ({exc.error_count()} problem(s); a model "
                             "gives family, layers, hidden, ffn, heads, kv_heads, vocab, seq_len)") from None
        except (KeyError, ValueError) as exc:
            raise ValueError(f"--model {model}: {str(exc).splitlines()[0]}") from None
        if m is None:
            raise ValueError(f"--model {model}: expected a model mapping (family, layers, hidden, …)")
    else:
        try:
            m = get_model(model)
        except KeyError as exc:
            raise ValueError(f"--model: {exc.args[0]}") from None
    return m.model_copy(update={"seq_len": seq_len}) if seq_len else m


def _caps(dev: DeviceSpec, caps: list[float] | None, site_cap: float | None,
          power_matters: bool) -> tuple[float | None, ...]:
    """Power caps to try: the given ones; else, when energy or a power/thermal limit is part of the
    request, the default limit and 90 … 50 % of it; else only the default limit (GPUs only)."""
    if not dev.has_power_sensor:
        if caps or site_cap is not None:
            raise ValueError(f"--power-caps/--power-cap: {dev.name} has no power sensor or limit to set; "
                             "drop the option for a CPU")
        return (None,)
    if caps:
        values: list[float | None] = list(caps)
    elif power_matters:
        values = [None] + [round(dev.tdp_w * f / 10) * 10 for f in (0.9, 0.8, 0.7, 0.6, 0.5)]
    else:  # caps only slow a throughput search down: each is a slower, cooler copy of the same layout
        values = [None]
    for option, v in [("--power-caps", v) for v in values] + [("--power-cap", site_cap)]:
        if v is not None and not dev.idle_w < v <= 100_000:
            raise ValueError(f"{option}: {v:g} W is not above {dev.name}'s idle draw ({dev.idle_w:g} W); "
                             f"use caps between {dev.idle_w:g} and {dev.tdp_w:g} W")
    if site_cap is not None:
        # the default limit is the TDP: a site cap at or above it leaves "no cap" as it is (writing the site's
        # cap there would be a limit above the TDP, which plan's power_limit_range rule rejects)
        bound = site_cap if site_cap < dev.tdp_w else None
        values = [bound if v is None or v > site_cap else v for v in values]
    return tuple(dict.fromkeys(values))


def make_request(model: str, device: str, gpus: int, nodes: int | None, global_batch: int, *, seq_len: int | None = None,
                 precision: str | None = None, engine: str | None = None,
                 constraints: Constraints = Constraints(), objective: Objective = Objective(),
                 power_caps: list[float] | None = None, clock_locks: list[float] | None = None,
                 max_vp: int = 8, max_sm_clock_mhz: float | None = None) -> Request:
    """Check the inputs (one-line ``ValueError`` per bad field) and build the :class:`Request`.
    ``max_sm_clock_mhz``: the GPUs' maximum SM clock where the catalog has none (or the user's differs): clock
    locks are fractions of it."""
    m = load_model(model, seq_len)
    try:
        dev, hardware_note = hardware_from_option(device)  # a path is that file; a near name says what it became
    except KeyError as exc:  # UnknownDeviceError: its message names the closest catalog entries
        text = str(getattr(exc, "message", None) or exc)
        raise ValueError("--hardware: " + text.replace("pass it with --hardware", "give --hardware its path")) from None
    if not is_cpu_name(device):
        device = dev.name  # the entry it resolved to is what every spec and case names from here on
    nodes_note = None
    if nodes is None:  # as many of the device's nodes as the count needs (issue 32: --gpus 32 alone)
        per = gpus if is_cpu_name(device) else dev.node.devices_per_node  # a CPU's ranks share this one host
        if gpus > per and gpus % per:
            raise ValueError(f"--gpus {gpus}: not a whole number of {dev.name} nodes of {per}; give --nodes")
        nodes = 1 if gpus <= per else gpus // per
        if nodes > 1:
            nodes_note = f"--nodes not given: {nodes} nodes of {gpus // nodes} (a {dev.name} node holds {per})"
    if nodes < 1 or gpus < 1 or gpus % nodes:
        raise ValueError(f"--gpus {gpus} over --nodes {nodes}: the GPU count must be a positive multiple of the "
                         "node count")
    most = node_holds(dev)  # spec.validate's node-size rule, up front: else every layout is refused later
    if not is_cpu_name(device) and gpus // nodes > most:
        split = f"use --nodes {gpus // most}, or " if gpus % most == 0 else ""
        raise ValueError(f"--gpus {gpus} over --nodes {nodes}: {gpus // nodes} per node is more than one {dev.name} "
                         f"node holds ({most}); {split}describe the larger node in $POWERTRAIN_HARDWARE")
    if global_batch < 1:
        raise ValueError("--global-batch must be ≥ 1")
    prec = precision or ("fp32" if is_cpu_name(device) else "bf16")
    known = ("tf32", *get_args(Precision))  # the spec's precisions, and tf32 (an fp32 run at the TF32 rate)
    if prec not in known:
        raise ValueError(f"--precision {prec!r}: use {', '.join(known)}")
    eng = engine or ("builtin" if is_cpu_name(device) else "megatron")
    if eng not in ENGINES:
        raise ValueError(f"--engine {eng!r}: use builtin (powertrain's trainer) or megatron (Megatron-LM/NeMo)")
    if eng == "builtin" and prec not in ("fp32", "tf32", "bf16"):
        raise ValueError(f"--precision {prec} with --engine builtin: the built-in trainer trains fp32 or bf16; use "
                         "--engine megatron to plan a Megatron-LM/NeMo run in it")
    if objective.kind not in OBJECTIVES:
        raise ValueError(f"--objective {objective.kind!r}: use one of {', '.join(OBJECTIVES)}")
    if objective.kind == "time" and not objective.tokens:
        raise ValueError("--objective time needs --tokens N (tokens to train)")
    if objective.kind == "cost" and (objective.gpu_hour_price is None or objective.kwh_price is None
                                     or not objective.tokens):
        raise ValueError("--objective cost needs --tokens, --gpu-hour-price and --kwh-price")
    if objective.kind in ("energy", "cost", "pareto") and not dev.has_power_sensor:
        raise ValueError(f"--objective {objective.kind}: {dev.name} has no power model (no sensor); "
                         "use --objective throughput or time")
    _check_objective_inputs(objective)
    _check_limits(dev, constraints)
    if dev.has_power_sensor:
        _check_node_power(dev, constraints, objective.kind)
    if not 0 <= constraints.mem_headroom < 1:
        raise ValueError("--mem-headroom is a share of device memory: give 0 ≤ it < 1 (e.g. 0.1)")
    locks = tuple(clock_locks or ())
    for r in locks:
        if not 0.1 <= r < 1:
            raise ValueError(f"--clock-locks {r:g}: give fractions of the maximum SM clock, 0.1 ≤ f < 1")
    if locks and not dev.has_power_sensor:
        raise ValueError(f"--clock-locks: {dev.name} has no clock control; drop the option for a CPU")
    if max_sm_clock_mhz is not None:
        dev = replace(dev, max_sm_clock_mhz=float(max_sm_clock_mhz))  # the user's GPUs, over the catalog's
    if locks and dev.max_sm_clock_mhz is None:
        # the predictor runs a lock as a clock (knobs.sm_clock_mhz ÷ the maximum): without the maximum a fraction
        # has no clock, and searching it would predict the unlocked GPU under the lock's name
        raise ValueError(f"--clock-locks: the catalog does not know {dev.name}'s maximum SM clock, so a fraction of "
                         "it cannot be predicted; give --max-sm-clock-mhz MHZ (nvidia-smi -q -d CLOCK, Max Clocks), "
                         "or search power caps (--power-caps)")
    return Request(model=m, device_name=device, device=dev, nodes=nodes, devices_per_node=gpus // nodes,
                   global_batch=global_batch, precision=prec, engine=eng, constraints=constraints,
                   objective=objective, power_caps=_caps(dev, power_caps, constraints.power_cap_w,
                                                        _power_matters(constraints, objective)),
                   clock_locks=locks, max_vp=max_vp,
                   hardware_note="; ".join(n for n in (hardware_note, nodes_note) if n) or None)


def _check_objective_inputs(o: Objective) -> None:
    """Refuse an objective input the chosen objective does not read: it would change nothing shown."""
    readers = (("--tokens", o.tokens, ("time", "cost")), ("--gpu-hour-price", o.gpu_hour_price, ("cost",)),
               ("--kwh-price", o.kwh_price, ("cost",)))
    for option, value, kinds in readers:
        if value is None:
            continue
        if o.kind not in kinds:
            raise ValueError(f"{option} is read by --objective {' and '.join(kinds)} only, not {o.kind}; "
                             f"drop it or use --objective {kinds[0]}")
        least = "above 0" if option == "--tokens" else "of at least 0"
        if not math.isfinite(value) or value < 0 or (option == "--tokens" and value == 0):
            # a negative count or price flips the score's sign: the slowest or dearest would rank first
            raise ValueError(f"{option} {value:g}: give a finite number {least}")


def _check_limits(dev: DeviceSpec, c: Constraints) -> None:
    """Refuse limits nothing can check: on a device without a power or temperature model every
    candidate's power and temperature are unknown, so the limit would pass them all."""
    if c.nodes_per_rack is not None and c.rack_kw is None:
        raise ValueError(f"--nodes-per-rack {c.nodes_per_rack}: it sets how many nodes share --rack-kw; add "
                         "--rack-kw KW or drop it")
    if c.nodes_per_rack is not None and c.nodes_per_rack < 1:
        raise ValueError(f"--nodes-per-rack {c.nodes_per_rack}: give a node count ≥ 1")
    if dev.has_power_sensor:
        return
    given = (("--max-temp", c.max_temp_c is not None, "temperature sensor or model"),
             ("--no-throttle", c.no_throttle, "temperature sensor or model"),
             ("--node-kw", c.node_kw is not None, "power sensor or model"),
             ("--rack-kw", c.rack_kw is not None, "power sensor or model"))
    for option, on, what in given:
        if on:
            raise ValueError(f"{option}: {dev.name} has no {what}, so no configuration can be checked against "
                             f"it; drop {option} for a CPU")


def _check_node_power(dev: DeviceSpec, c: Constraints, objective: str | None = None) -> None:
    """Refuse a node or rack limit (or a cost objective) where the node's power is unknown: the catalog describes
    no host for the device's node, so every candidate's node power would be unknown and the limit would pass all."""
    why = undescribed(dev.node, dev.cooling, dev.name)
    if why is None:
        return
    for option, on in (("--node-kw", c.node_kw is not None), ("--rack-kw", c.rack_kw is not None),
                       ("--objective cost", objective == "cost")):
        if on:
            raise ValueError(f"{option}: {why}; or drop {option}")


def _power_matters(c: Constraints, o: Objective) -> bool:
    return o.kind in ("energy", "cost", "pareto") or c.node_kw is not None or c.rack_kw is not None or \
        c.max_temp_c is not None or c.no_throttle


def impossible(req: Request) -> str | None:
    """Why no configuration can satisfy ``req`` (one line with the nearest feasible change), or None."""
    c = req.constraints
    if not req.device.has_power_sensor:
        return None
    # what one node draws at the wall doing nothing: its devices' idle power and its idle host (node_power_w's formula)
    idle_node = nodes_power(req.devices_per_node * req.device.idle_w, 1, req.device,
                            ranks_per_node=req.devices_per_node, training=False)
    # (an undescribed node has no idle draw: make_request refused node and rack limits on it)
    idle = idle_node.ac_w if idle_node.ac_w is not None else -math.inf
    if c.node_kw is not None and c.node_kw * 1000 <= idle:
        return (f"--node-kw {c.node_kw:g}: below one node's idle draw ({idle / 1000:.2f} kW: "
                f"{req.devices_per_node} × {req.device.idle_w:g} W idle + {idle_node.host_w or 0:.0f} W idle host, "
                f"at {idle_node.psu_efficiency or 0:.0%} power-supply efficiency); "
                f"raise it above {idle / 1000:.2f} kW or use fewer GPUs per node")
    per_rack = c.nodes_per_rack or req.nodes
    if c.rack_kw is not None and c.rack_kw * 1000 <= idle * per_rack:
        return (f"--rack-kw {c.rack_kw:g}: below the idle draw of its {per_rack} node(s) "
                f"({idle * per_rack / 1000:.2f} kW); raise it above {idle * per_rack / 1000:.2f} kW")
    if c.max_temp_c is not None and c.max_temp_c <= req.device.thermal.inlet_c:
        return (f"--max-temp {c.max_temp_c:g} °C: at or below the inlet air ({req.device.thermal.inlet_c:g} °C) "
                f"no GPU can stay under it; raise it above {req.device.thermal.inlet_c + 10:g} °C")
    return None
