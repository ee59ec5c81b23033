"""One resolved run configuration: model × layout × knobs × hardware × protocol × data × task.

This is the typed, validated description that ``powertrain run``, ``plan``, ``sweep`` and
``predict`` all take. YAML specs load into it (see :func:`load_run_config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, cast, get_args

from pydantic import ConfigDict, Field, field_validator, model_validator

from powertrain.core.lora import Lora, check_targets
from powertrain.core.names import label_problem
from powertrain.spec.bounds import SpecFileError, control_char_field, load_spec_yaml, shown
from powertrain.spec.layout import Layout
from powertrain.spec.model import ModelConfig, get_model
from powertrain.spec.values import SpecModel

Recompute = Literal["none", "selective", "full"]
# Bounds far above any real run, so an absurd value is refused by name instead of hanging a command.
MAX_NODES = 65_536
MAX_DEVICES_PER_NODE = 1_024
MAX_STEPS = 10_000_000
MAX_SECONDS = 7 * 86_400.0
# fp16/fp8/fp4 are for planning (predict, advise): the built-in trainer trains fp32 or bf16 and refuses them
Precision = Literal["fp32", "bf16", "fp16", "fp8", "fp4"]
Fp8Recipe = Literal["delayed", "current", "blockwise", "mxfp8"]


def spec_precision(name: str) -> Precision:
    """The spec's precision for a compute precision by name (tf32 is an fp32 run)."""
    mapped = {"tf32": "fp32"}.get(name, name)
    if mapped not in get_args(Precision):
        raise ValueError(f"precision {name!r}: use fp32, tf32, bf16, fp16, fp8 or fp4")
    return cast(Precision, mapped)


class Overlap(SpecModel):
    """Communication/computation overlap switches, where PyTorch offers them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fsdp_prefetch: bool = Field(default=True, description="FSDP2 forward/backward prefetch of the next all-gather")
    fsdp_reshard_after_forward: bool = Field(default=True, description="free gathered params after forward")
    async_tp: bool = Field(default=False, description="async tensor parallel (micro-pipelined TP) where available")
    ddp_bucket_mb: float = Field(default=25.0, gt=0, le=1e6, allow_inf_nan=False, description="DDP gradient bucket size")
    grad_reduce_in_backward: bool = Field(default=True, description="overlap DP gradient reduction with backward")


class Knobs(SpecModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    micro_batch: int = Field(default=1, ge=1, le=1 << 24, description="samples per micro-batch per data-parallel rank")
    global_batch: int = Field(default=8, ge=1, le=1 << 30, description="samples per optimizer step, all ranks")
    recompute: Recompute = "none"
    overlap: Overlap = Overlap()
    precision: Precision = "fp32"
    fp8_recipe: Fp8Recipe | None = Field(default=None, description="fp8 scaling recipe (Transformer Engine): delayed, "
                                         "current, blockwise or mxfp8; unset: the GPU generation's usual one")
    # Device controls (powertrain.control): set on every device of every node before warm-up, read
    # back, recorded as requested/in effect and restored after the run. None leaves the device as found.
    power_limit_w: float | None = Field(default=None, gt=0, le=100_000, allow_inf_nan=False,
                                        description="device power limit (W) set before warm-up")
    sm_clock_mhz: tuple[int, int] | None = Field(
        default=None, description="locked SM/graphics clock range [min, max] (MHz); [f, f] pins one clock")
    mem_clock_mhz: int | None = Field(default=None, ge=1, le=100_000, description="locked memory clock (MHz)")
    seed: int = Field(default=0, ge=-(1 << 63), le=(1 << 64) - 1, description="torch.manual_seed's range")
    lr: float = Field(default=1e-3, gt=0, allow_inf_nan=False)
    moe_aux_coeff: float = Field(default=0.01, ge=0, allow_inf_nan=False, description="weight of the MoE load-balancing loss")

    @field_validator("sm_clock_mhz", mode="before")
    @classmethod
    def _clock_range(cls, v: Any) -> Any:
        """One number pins the clock ([f, f]); a pair is [min, max], each 1…100 000 MHz, min ≤ max."""
        if isinstance(v, int | float) and not isinstance(v, bool):
            v = [v, v]
        if isinstance(v, list | tuple):
            if len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise ValueError("give [min, max] in whole MHz, e.g. [1200, 1980], or one number to pin the clock")
            if not 1 <= v[0] <= v[1] <= 100_000:
                raise ValueError(f"[{v[0]}, {v[1]}] is not a range 1 ≤ min ≤ max ≤ 100000 MHz; put the lower clock first")
            return tuple(v)
        return v

    def controls(self) -> dict[str, Any]:
        """The device controls this configuration asks for (knob → value), empty when none."""
        out: dict[str, Any] = {}
        if self.power_limit_w is not None:
            out["power_limit_w"] = self.power_limit_w
        if self.sm_clock_mhz is not None:
            out["sm_clock_mhz"] = list(self.sm_clock_mhz)
        if self.mem_clock_mhz is not None:
            out["mem_clock_mhz"] = self.mem_clock_mhz
        return out


class Hardware(SpecModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    devices_per_node: int = Field(default=1, ge=1, le=MAX_DEVICES_PER_NODE, description="ranks per node")
    device: str = Field(default="cpu", description="device type name from the hardware catalog, or cpu")
    stand_in: bool = Field(default=False, description=(
        "the run may train on this node's CPU in place of `device` (a rehearsal: predictions use "
        "`device`, run.json says stand-in, calibrate refuses it); without it a GPU spec refuses a CPU node"))
    cooling: Literal["air", "liquid", "immersion"] | None = Field(default=None, description=(
        "how the nodes are cooled, where it differs from the catalog's device entry: air (front-to-back, the rear "
        "row breathes the front row's heat; fans), liquid (cold plates), immersion (dielectric bath); sets the "
        "predictor's slot temperatures and the node's fan power"))

    @property
    def world(self) -> int:
        return self.nodes * self.devices_per_node


class Protocol(SpecModel):
    """DESIGN.md's measurement protocol."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    warmup_steps: int = Field(default=2, ge=0, le=MAX_STEPS)
    measured_steps: int = Field(default=5, ge=1, le=MAX_STEPS)
    min_measured_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False, description="measured window lasts at least this long")
    repeats: int = Field(default=1, ge=1, le=1000)
    cooldown_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False, description="wait before the run starts")
    cooldown_until_temp_c: float | None = Field(default=None, ge=-50, le=150, allow_inf_nan=False, description="…or until max device temp ≤ this")
    idle_baseline_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)


class Data(SpecModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["synthetic", "text"] = "synthetic"
    path: Path | None = Field(default=None, description="plain text file for kind=text (byte-level tokens)")


class ProfilerOptions(SpecModel):
    """Optional ``torch.profiler`` traces, saved under ``<run>/profiles/`` (the spec's ``profile:`` key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    steps: list[int] | None = Field(default=None, description="steps to trace; default: the last warm-up step")
    ranks: list[int] | Literal["per_stage", "all"] = Field(
        default="per_stage", description="ranks that trace; per_stage = one rank per pipeline stage")
    in_measured: bool = Field(default=False, description="allow traced steps inside the measured window")


TaskKind = Literal["pretrain", "lora"]
# What `task: {kind: lora}` trains when rank, alpha or targets are left out: the MLPerf Llama-2-70B LoRA
# benchmark's rank and alpha (16, 32), on the attention projections every built-in model has.
LORA_DEFAULT_RANK = 16
LORA_DEFAULT_ALPHA = 32.0
LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
_LORA_FIELDS = ("rank", "alpha", "targets")


class Task(SpecModel):
    """What a run trains (the spec's ``task:`` key): every weight (``pretrain``: pre-training, or full
    fine-tuning, which costs the same), or LoRA adapters beside frozen base weights (``lora``).

    With ``kind: lora`` each targeted linear layer computes ``base(x) + (alpha/rank)·B(A(x))`` with its
    base weight frozen; ``rank``, ``alpha`` and ``targets`` default to 16, 32 and the attention
    projections. Targets use model-neutral names (:data:`powertrain.core.lora.TARGETS`). The LoRA fields
    set with ``kind: pretrain`` are refused: nothing would read them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: TaskKind = "pretrain"
    rank: int | None = Field(default=None, ge=1, le=1 << 20, description=f"LoRA rank r (kind lora; default {LORA_DEFAULT_RANK})")
    alpha: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False,
                                description=f"LoRA scale numerator: adapters add (alpha/rank)·B·A·x (kind lora; default "
                                            f"{LORA_DEFAULT_ALPHA:g})")
    targets: list[str] | None = Field(default=None, max_length=16, description=(
        "linear layers that get adapters: q_proj, k_proj, v_proj, o_proj, qkv_proj (fused Q/K/V), gate_proj, "
        f"up_proj, down_proj (kind lora; default {', '.join(LORA_DEFAULT_TARGETS)})"))

    @model_validator(mode="before")
    @classmethod
    def _lora_fields(cls, v: Any) -> Any:
        """kind lora: the unset LoRA fields get their defaults (run.json records what ran); kind pretrain:
        a LoRA field set is refused, naming it."""
        if not isinstance(v, dict):
            return v
        given = [k for k in _LORA_FIELDS if v.get(k) is not None]
        kind = v.get("kind", "pretrain")
        if kind == "lora":
            defaults = {"rank": LORA_DEFAULT_RANK, "alpha": LORA_DEFAULT_ALPHA, "targets": list(LORA_DEFAULT_TARGETS)}
            return {**v, **{k: d for k, d in defaults.items() if v.get(k) is None}}
        if kind == "pretrain" and given:
            raise ValueError(f"{', '.join('task.' + k for k in given)} set but task.kind is pretrain, which trains "
                             f"every weight and reads no LoRA field: set task.kind: lora, or drop {', '.join(given)}")
        return v

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            check_targets(v)
        return v

    @property
    def is_lora(self) -> bool:
        return self.kind == "lora"

    def lora(self) -> Lora | None:
        """The adapters as the cost formulas take them (:class:`powertrain.core.lora.Lora`), None for pretrain."""
        if not self.is_lora or self.rank is None or self.targets is None:
            return None
        return Lora(self.rank, tuple(self.targets))

    def label(self) -> str:
        """``pretrain``, or e.g. ``LoRA r16 α32 q_proj,k_proj,v_proj,o_proj``."""
        if not self.is_lora:
            return "pretrain"
        return f"LoRA r{self.rank} α{self.alpha:g} {','.join(self.targets or ())}"


class RunLaunch(SpecModel):
    """How this run's ranks are placed on the node (the sweep's own ``launch:`` options are separate)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_order: list[int] | None = Field(
        default=None, max_length=MAX_DEVICES_PER_NODE,
        description="local GPU index of each local rank (rank i → device_order[i]), distinct; applied "
                    "as CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES. Default: rank i on GPU i")


class RunConfig(SpecModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="run", max_length=1_000,
                      description="a label (run.json, tables); `run` names its default folder after it, which "
                                  "then must be one path component")
    model: ModelConfig
    layout: Layout = Layout()
    knobs: Knobs = Knobs()
    hardware: Hardware = Hardware()
    protocol: Protocol = Protocol()
    data: Data = Data()
    task: Task = Task()
    profile: ProfilerOptions = ProfilerOptions()
    launch: RunLaunch = RunLaunch()

    @model_validator(mode="before")
    @classmethod
    def _no_control_chars(cls, v: Any) -> Any:
        """A newline or NUL in any key or value is refused, naming the field (see spec.bounds)."""
        found = control_char_field(v)
        if found:
            raise ValueError(f"{found[0]} holds {found[1]}, which no configuration value may hold")
        return v

    @field_validator("name")
    @classmethod
    def _name_is_a_label(cls, v: str) -> str:
        """Printable characters only: a terminal escape sequence or bidi override in a run's name would be
        obeyed by every terminal that shows it. Slashes are allowed — a label, not a path (``predict
        --study`` names its points ``study/model/layout/…``); where a name becomes a folder it is checked
        as one (``core.names.check_name``)."""
        why = label_problem(v)
        if why:
            raise ValueError(f"{why}; a run's name holds printable characters only")
        return v

    @field_validator("model", mode="before")
    @classmethod
    def _model_by_name(cls, v: Any) -> Any:
        return get_model(v) if isinstance(v, str) else v

    @property
    def world(self) -> int:
        return self.hardware.world


def load_run_config(path: str | Path) -> RunConfig:
    """Read a single-run YAML spec (keys as in :class:`RunConfig`).

    The file is read within :mod:`powertrain.spec.bounds` (size, encoding, alias expansion); a
    missing file raises ``FileNotFoundError``, every other refusal a ``ValueError`` of one line."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"spec file {shown(path)} does not exist")
    raw = load_spec_yaml(path)
    if not isinstance(raw, dict):
        raise SpecFileError(f"{shown(path)}: expected a mapping with keys model, layout, knobs, hardware, protocol")
    found = control_char_field(raw)
    if found:
        raise SpecFileError(f"{shown(path)}: {found[0]} holds {found[1]}, which no configuration value may hold")
    return RunConfig.model_validate(raw)
