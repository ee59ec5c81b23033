"""Rules that reject a run configuration **before** any process starts.

:func:`validate` returns every :class:`Violation` (rule, what is wrong, how to fix it), so the
launcher can refuse to start and the sweep planner can mark or skip impossible points. Each rule is
one small function; more rules (e.g. the predictor's memory fit) plug in with :func:`register_rule`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from powertrain.core.flops import shape_of
from powertrain.core.lora import ATTENTION_TARGETS, ROW_PARALLEL, smallest_dimension
from powertrain.hardware.catalog import DeviceSpec, UnknownDeviceError, get_device, is_cpu_name
from powertrain.spec.run import ProfilerOptions, RunConfig


@dataclass(frozen=True)
class Violation:
    """One broken rule: ``rule`` is a stable identifier, ``message`` says what, ``fix`` says how."""

    rule: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message} — fix: {self.fix}"


class ConfigError(ValueError):
    """A configuration broke one or more rules; ``violations`` lists them."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        lines = "\n".join(f"  - {v}" for v in violations)
        super().__init__(f"invalid run configuration ({len(violations)} problem(s)):\n{lines}")


Rule = Callable[[RunConfig], list[Violation]]
_EXTRA_RULES: list[Rule] = []


def register_rule(rule: Rule) -> Rule:
    """Add a rule (e.g. memory fit from ``powertrain.predict``) to every later :func:`validate`."""
    if rule not in _EXTRA_RULES:
        _EXTRA_RULES.append(rule)
    return rule


def _dp(cfg: RunConfig) -> int | None:
    """Data-parallel degree implied by the world size, or None when the degrees do not fit."""
    lay = cfg.layout
    rest = lay.tp * lay.pp * lay.cp
    if cfg.world % rest:
        return None
    dp = cfg.world // rest
    return dp if lay.dp in (None, dp) else None


def rule_world(cfg: RunConfig) -> list[Violation]:
    lay = cfg.layout
    rest = lay.tp * lay.pp * lay.cp
    if _dp(cfg) is not None:
        return []
    shown = f"dp×cp×tp×pp = {lay.dp}×{lay.cp}×{lay.tp}×{lay.pp} = {(lay.dp or 1) * rest}" if lay.dp else \
        f"tp×pp×cp = {rest} does not divide it"
    ranks = (lay.dp or 1) * rest
    return [Violation(
        "world_size",
        f"world size {cfg.world} (hardware.nodes×devices_per_node) ≠ product of the degrees ({shown})",
        f"set hardware.devices_per_node×nodes to {ranks}" + (", or omit layout.dp to derive it" if lay.dp else
                                                             f", or use a multiple of {rest}"),
    )]


def rule_tensor_parallel(cfg: RunConfig) -> list[Violation]:
    m, tp = cfg.model, cfg.layout.tp
    out = []
    if tp == 1:
        if cfg.layout.sequence_parallel:
            out.append(Violation("sequence_parallel_needs_tp", "sequence_parallel is on but tp = 1",
                                 "set layout.tp > 1 or layout.sequence_parallel: false"))
        return out
    for field in ("heads", "kv_heads", "ffn", "vocab"):
        val = getattr(m, field)
        if val % tp:
            out.append(Violation(
                f"{field}_divisible_by_tp", f"model {field} ({val}) is not divisible by tp ({tp})",
                f"choose tp among the divisors of {val}" + (" (GQA: tp ≤ kv_heads)" if field == "kv_heads" else ""),
            ))
    if cfg.layout.sequence_parallel and m.seq_len % tp:
        out.append(Violation("seq_len_divisible_by_tp",
                             f"sequence parallel splits seq_len ({m.seq_len}) over tp ({tp}), which does not divide it",
                             "choose a seq_len that tp divides, or turn sequence_parallel off"))
    return out


def rule_pipeline(cfg: RunConfig) -> list[Violation]:
    lay, m = cfg.layout, cfg.model
    out = []
    if lay.virtual_stages > 1 and lay.pp_schedule != "interleaved_1f1b":
        out.append(Violation("virtual_stages_need_interleaved",
                             f"virtual_stages = {lay.virtual_stages} needs an interleaved schedule, got {lay.pp_schedule}",
                             "set layout.pp_schedule: interleaved_1f1b, or virtual_stages: 1"))
    if lay.pp == 1:
        if lay.virtual_stages > 1:
            out.append(Violation("virtual_stages_need_pp", "virtual_stages > 1 without pipeline parallelism",
                                 "set layout.pp > 1 or virtual_stages: 1"))
        elif isinstance(lay.pp_split, list):  # an explicit split must still describe the one stage
            try:
                lay.stage_layer_counts(m.layers)
            except ValueError as exc:
                out.append(Violation("stage_split", str(exc), "drop pp_split, or list one count per stage"))
        return out
    if m.layers < lay.stages:
        out.append(Violation("layers_ge_stages",
                             f"model has {m.layers} layers, fewer than the {lay.stages} pipeline stages (pp×virtual_stages)",
                             f"use pp×virtual_stages ≤ {m.layers}, or a model with more layers"))
        return out
    try:
        lay.stage_layer_counts(m.layers)
    except ValueError as exc:
        out.append(Violation("stage_split", str(exc), "use pp_split: even, or a list of per-stage layer counts"))
    dp = _dp(cfg)
    knobs = cfg.knobs
    if dp and cfg.knobs.global_batch % (knobs.micro_batch * dp) == 0:
        n_mb = knobs.global_batch // (knobs.micro_batch * dp)
        need = {"1f1b": lay.pp, "interleaved_1f1b": lay.pp}.get(lay.pp_schedule, 1)
        if n_mb < need:
            out.append(Violation(
                "pipeline_microbatches",
                f"{lay.pp_schedule} with pp = {lay.pp} needs ≥ {need} micro-batches per step, but "
                f"global_batch / (micro_batch × dp) = {knobs.global_batch} / ({knobs.micro_batch} × {dp}) = {n_mb}",
                f"raise knobs.global_batch to ≥ {need * knobs.micro_batch * dp}, lower micro_batch, or use gpipe",
            ))
        elif lay.pp_schedule == "interleaved_1f1b" and n_mb % lay.pp:
            out.append(Violation(
                "pipeline_microbatches",
                f"interleaved_1f1b needs micro-batches per step ({n_mb}) to be a multiple of pp ({lay.pp})",
                f"make global_batch / (micro_batch × dp) a multiple of {lay.pp}",
            ))
    return out


def rule_experts(cfg: RunConfig) -> list[Violation]:
    lay, m = cfg.layout, cfg.model
    out: list[Violation] = []
    if lay.ep == 1 and lay.etp is None:
        return out
    if not m.is_moe:
        what = f"ep = {lay.ep}" if lay.ep > 1 else f"etp = {lay.etp}"
        return [Violation("ep_needs_moe", f"{what} but model {m.name} has no experts",
                          "set layout.ep: 1 and drop layout.etp for dense models")]
    if m.experts % lay.ep:
        out.append(Violation("experts_divisible_by_ep", f"experts ({m.experts}) not divisible by ep ({lay.ep})",
                             f"choose ep among the divisors of {m.experts}"))
    dp = _dp(cfg)
    if lay.etp is not None:
        stage = lay.tp * lay.cp * dp if dp else None
        if stage and stage % (lay.ep * lay.etp):
            out.append(Violation("ep_etp_divides_stage",
                                 f"ep×etp ({lay.ep}×{lay.etp}) must divide tp×cp×dp ({lay.tp}×{lay.cp}×{dp} = {stage}): "
                                 "with parallel folding an expert group and its expert-TP ranks sit inside one "
                                 "pipeline stage",
                                 f"choose ep×etp among the divisors of {stage}"))
        if m.ffn % lay.etp:
            out.append(Violation("expert_ffn_divisible_by_etp",
                                 f"expert FFN width ({m.ffn}) not divisible by etp ({lay.etp})",
                                 f"choose etp among the divisors of {m.ffn}"))
        out.append(Violation("expert_tp_unsupported",
                             "layout.etp (parallel folding) is not implemented by the built-in trainer, which "
                             "carves expert groups out of data parallelism",
                             "drop layout.etp to train it here; keep it to predict or advise a Megatron-Core run"))
    elif dp and (dp * lay.cp) % lay.ep:
        out.append(Violation("ep_divides_dp",
                             f"ep ({lay.ep}) must divide dp×cp ({dp}×{lay.cp}): expert parallelism is carved out of data parallelism",
                             f"choose ep among the divisors of {dp * lay.cp}, raise the world size, or set layout.etp "
                             "(parallel folding: ep×etp divides tp×cp×dp)"))
    if lay.fsdp:
        out.append(Violation("fsdp_with_ep", "FSDP together with expert parallelism is not supported by the built-in trainer",
                             "set layout.fsdp: false (data-parallel replicas with expert parallelism)"))
    return out


def rule_batch(cfg: RunConfig) -> list[Violation]:
    dp, k = _dp(cfg), cfg.knobs
    if dp and k.global_batch % (k.micro_batch * dp):
        return [Violation(
            "global_batch_divisible",
            f"global_batch ({k.global_batch}) is not divisible by micro_batch × dp ({k.micro_batch} × {dp})",
            f"use a global_batch that is a multiple of {k.micro_batch * dp}",
        )]
    return []


def rule_recipe(cfg: RunConfig) -> list[Violation]:
    """An fp8 recipe only means something for fp8 GEMMs: set with another precision it would be ignored."""
    k = cfg.knobs
    if k.fp8_recipe is not None and k.precision != "fp8":
        return [Violation("recipe_needs_fp8", f"knobs.fp8_recipe {k.fp8_recipe} is set but knobs.precision is "
                          f"{k.precision}", "set knobs.precision: fp8, or drop knobs.fp8_recipe")]
    return []


def rule_supported(cfg: RunConfig) -> list[Violation]:
    out = []
    if cfg.layout.cp > 1:
        out.append(Violation("context_parallel_unsupported", "context parallelism is not implemented by the built-in trainer",
                             "set layout.cp: 1"))
    if cfg.model.tied_embeddings:
        out.append(Violation("tied_embeddings_unsupported", "tied embeddings are not implemented by the built-in trainer",
                             "set model.tied_embeddings: false"))
    if cfg.knobs.precision in ("fp16", "fp8", "fp4"):
        out.append(Violation("low_precision_unsupported",
                             f"knobs.precision {cfg.knobs.precision}: the built-in trainer trains fp32 or bf16",
                             "predict or advise it (Transformer Engine runs it), or use knobs.precision: bf16 to "
                             "train here"))
    unbuilt = cfg.model.unbuilt_features()
    if unbuilt:
        out.append(Violation("model_architecture_unsupported",
                             f"model {cfg.model.name} sets {', '.join('model.' + f for f in unbuilt)}: MLA, shared experts, "
                             "leading dense layers and multi-token prediction are not built by the built-in trainer",
                             "predict or advise this model (Megatron-Core runs it), or drop those fields to train the "
                             "plain transformer here"))
    if cfg.data.kind == "text":
        if cfg.data.path is None or not cfg.data.path.is_file():
            out.append(Violation("data_path", f"data.kind text needs an existing file, got {cfg.data.path}",
                                 "set data.path to a plain text file"))
        if cfg.model.vocab < 256:
            out.append(Violation("byte_vocab", f"byte-level text needs vocab ≥ 256, model has {cfg.model.vocab}",
                                 "use a model with vocab ≥ 256, or data.kind: synthetic"))
    elif cfg.data.path is not None:
        out.append(Violation("data_path_needs_text",
                             f"data.path {cfg.data.path} is set but data.kind is synthetic, which reads no file",
                             "set data.kind: text, or drop data.path"))
    return out


def rule_lora(cfg: RunConfig) -> list[Violation]:
    """``task: {kind: lora}``: every target a linear layer of this model, a rank that is low (≤ the smallest
    dimension of a targeted map) and splits over tp where the adapter's A is column-parallel."""
    lora, m = cfg.task.lora(), cfg.model
    if lora is None:
        return []
    out: list[Violation] = []
    if m.family == "gpt" and "gate_proj" in lora.targets:
        out.append(Violation("lora_target_in_model", f"task.targets names gate_proj, but model {m.name} has a GELU "
                             "MLP without a gate", "drop gate_proj (up_proj and down_proj adapt its MLP)"))
    attn = [t for t in lora.targets if t in ATTENTION_TARGETS]
    if m.kv_lora_rank and attn:
        out.append(Violation("lora_target_in_model", f"task.targets names {', '.join(attn)}, but model {m.name} has "
                             "MLA attention (kv_lora_rank), whose projections are not Q/K/V/O",
                             "target its MLP only (gate_proj, up_proj, down_proj)"))
        return out
    dim, where = smallest_dimension(shape_of(m), lora.targets)
    if dim and lora.rank > dim:
        out.append(Violation("lora_rank_le_dim", f"task.rank {lora.rank} exceeds {dim}, the smallest dimension of "
                             f"{where} in model {m.name}: the update would not be low-rank",
                             f"use task.rank ≤ {dim}, or drop {where} from task.targets"))
    tp = cfg.layout.tp
    column = [t for t in lora.targets if t not in ROW_PARALLEL]
    if tp > 1 and column and lora.rank % tp:
        out.append(Violation("lora_divisible_by_tp", f"task.rank {lora.rank} is not divisible by tp ({tp}): the A "
                             f"of a column-parallel layer's adapter ({', '.join(column)}) is split over tp along the "
                             "rank, as Megatron-Core's", f"use a task.rank that is a multiple of {tp}"))
    if "qkv_proj" in lora.targets:
        out.append(Violation("lora_fused_qkv_unsupported", "task.targets qkv_proj adapts a fused Q/K/V projection, "
                             "and the built-in trainer's attention has separate wq, wk and wv layers",
                             "use q_proj, k_proj, v_proj to train it here; keep qkv_proj to predict or advise a "
                             "Megatron-Core / NeMo run"))
    mlp = [t for t in lora.targets if t not in ATTENTION_TARGETS]
    if m.is_moe and mlp:
        out.append(Violation("lora_expert_targets_unsupported",
                             f"task.targets {', '.join(mlp)} on model {m.name}: its MLP is routed experts, stacked "
                             "weight tensors the built-in trainer puts no adapter on",
                             "target attention only (q_proj, k_proj, v_proj, o_proj) to train it here; keep the MLP "
                             "targets to predict or advise a Megatron-Core run"))
    return out


def rule_device(cfg: RunConfig) -> list[Violation]:
    """``hardware.device`` must be ``cpu`` or a catalog name or alias (user catalogs included)."""
    name = cfg.hardware.device
    if is_cpu_name(name):
        return []
    try:
        get_device(name)
    except UnknownDeviceError as exc:
        near = f"closest: {', '.join(exc.closest)}" if exc.closest else "no close catalog name"
        return [Violation("unknown_device", f"hardware.device {name!r} is not in the hardware catalog ({near})",
                          "use a catalog name, add the device in a hardware YAML (--hardware / "
                          "$POWERTRAIN_HARDWARE), or use cpu")]
    return []


def _vendor(cfg: RunConfig) -> str | None:
    """The catalog vendor of ``hardware.device`` (``host`` for cpu), None when the name is unknown."""
    if is_cpu_name(cfg.hardware.device):
        return "host"
    try:
        return get_device(cfg.hardware.device).vendor
    except UnknownDeviceError:
        return None  # rule_device names it


CONTROL_VENDORS = ("nvidia", "amd")  # vendors whose devices powertrain.control can set


def rule_controls(cfg: RunConfig) -> list[Violation]:
    """Power/clock knobs need a device powertrain can set: refused on the CPU (and unknown vendors)."""
    asked = cfg.knobs.controls()
    vendor = _vendor(cfg)
    if not asked or vendor is None or vendor in CONTROL_VENDORS:
        return []
    what = "the CPU backend has no power limit or clock lock powertrain can set" if vendor == "host" else \
        f"powertrain sets limits on NVIDIA and AMD devices only, and {cfg.hardware.device} is {vendor}"
    return [Violation("control_needs_gpu",
                      f"knobs.{', knobs.'.join(asked)} asked on hardware.device {cfg.hardware.device}: {what}",
                      "drop the knob, or run on an NVIDIA/AMD device (e.g. hardware.device: h200)")]


def rule_control_range(cfg: RunConfig) -> list[Violation]:
    """A power limit above the catalog's default limit (tdp_w) cannot be in effect: refused by name."""
    limit = cfg.knobs.power_limit_w
    if limit is None or _vendor(cfg) not in CONTROL_VENDORS:
        return []
    dev = get_device(cfg.hardware.device)
    if limit > dev.tdp_w:
        return [Violation("power_limit_range",
                          f"knobs.power_limit_w {limit:g} W is above {dev.name}'s default limit of {dev.tdp_w:g} W, "
                          "the most a device accepts",
                          f"use a power limit ≤ {dev.tdp_w:g} W")]
    return []


def rule_async_tp(cfg: RunConfig) -> list[Violation]:
    """Async TP exists in PyTorch only on CUDA (symmetric memory + the compiler's micro-pipeline TP pass)."""
    if not (cfg.knobs.overlap.async_tp and cfg.layout.tp > 1) or _vendor(cfg) in ("nvidia", None):
        return []
    return [Violation("async_tp_needs_cuda",
                      f"knobs.overlap.async_tp needs CUDA with symmetric memory and torch.compile's micro-pipeline "
                      f"TP pass; hardware.device {cfg.hardware.device} has none",
                      "set knobs.overlap.async_tp: false (it is applied on NVIDIA devices only)")]


def rule_device_order(cfg: RunConfig) -> list[Violation]:
    """``launch.device_order``: one distinct local GPU index per local rank; meaningless on the CPU."""
    order = cfg.launch.device_order
    if order is None:
        return []
    if _vendor(cfg) == "host":
        return [Violation("device_order_needs_gpu", "launch.device_order places ranks on GPUs, and "
                          f"hardware.device is {cfg.hardware.device}", "drop launch.device_order on the CPU")]
    n = cfg.hardware.devices_per_node
    if len(order) != n or len(set(order)) != n or min(order) < 0:
        return [Violation("device_order",
                          f"launch.device_order {order} must list {n} distinct local GPU indices ≥ 0, "
                          "one per local rank (hardware.devices_per_node)",
                          f"give a permutation such as {list(range(n))[::-1]}")]
    return []


def node_holds(dev: DeviceSpec) -> int:
    """The most devices one "node" of ``dev`` may hold: its node's, or its NVLink domain (an NVL72 rack's
    devices share one domain across its trays)."""
    return max(dev.node.devices_per_node, dev.node.nvlink_domain)


def rule_node_size(cfg: RunConfig) -> list[Violation]:
    """More devices on one node than the catalog's node holds would be costed as one scale-up domain."""
    name, per = cfg.hardware.device, cfg.hardware.devices_per_node
    if is_cpu_name(name):
        return []
    try:
        dev = get_device(name)
    except UnknownDeviceError:
        return []  # rule_device names it
    most = node_holds(dev)
    if per <= most:
        return []
    world = cfg.world
    split = f"use nodes: {world // most}, devices_per_node: {most}, or " if world % most == 0 else ""
    return [Violation("devices_per_node_le_node",
                      f"hardware.devices_per_node {per} is more than one {dev.name} node holds ({most})",
                      f"{split}describe the larger node in a hardware YAML (--hardware / $POWERTRAIN_HARDWARE)")]


def rule_cooldown(cfg: RunConfig) -> list[Violation]:
    """The temperature gate waits at most ``cooldown_s``: without it the target is never waited for."""
    proto = cfg.protocol
    if proto.cooldown_until_temp_c is None or proto.cooldown_s > 0:
        return []
    return [Violation("cooldown_temp_needs_time",
                      f"protocol.cooldown_until_temp_c {proto.cooldown_until_temp_c:g} °C waits at most cooldown_s, "
                      "which is 0",
                      "set protocol.cooldown_s (e.g. 300) as the longest wait, or drop cooldown_until_temp_c")]


def rule_profile(cfg: RunConfig) -> list[Violation]:
    """Profiler steps and ranks that trace nothing (run_loop.profiled_steps / profiles_rank skip them)."""
    prof, proto = cfg.profile, cfg.protocol
    if not prof.enabled:
        default = ProfilerOptions()
        given = [f"profile.{k}" for k in ("steps", "ranks", "in_measured") if getattr(prof, k) != getattr(default, k)]
        return [Violation("profile_needs_enabled", f"{', '.join(given)} set but profile.enabled is false: nothing "
                          "is traced", "set profile.enabled: true, or drop " + ", ".join(given))] if given else []
    out = []
    warm, total = proto.warmup_steps, proto.warmup_steps + proto.measured_steps
    steps = prof.steps if prof.steps is not None else [max(warm - 1, 0)]
    outside = sorted({s for s in steps if not 0 <= s < total})
    if not steps or outside:
        what = "profile.steps is empty: nothing is traced" if not steps else \
            f"profile.steps {', '.join(map(str, outside))} not in this run's steps 0–{total - 1}, never traced"
        out.append(Violation("profile_steps_in_run", f"{what} (warmup_steps {warm} + measured_steps "
                             f"{proto.measured_steps})",
                             f"list steps below {total}, or raise protocol.measured_steps"))
    measured = sorted({s for s in steps if warm <= s < total})
    if measured and not prof.in_measured:
        listed = "profile.steps lists" if prof.steps is not None else \
            "with protocol.warmup_steps 0, the default traced step is"
        out.append(Violation("profile_measured_needs_in_measured",
                             f"{listed} measured step {', '.join(map(str, measured))}, traced only with "
                             "profile.in_measured: true",
                             f"set profile.in_measured: true to trace measured step {measured[0]}, or list "
                             f"warm-up steps (below {warm}) only" if warm else
                             "set profile.in_measured: true, or protocol.warmup_steps ≥ 1"))
    if prof.in_measured and not measured and steps and not outside:
        out.append(Violation("in_measured_needs_measured_step",
                             "profile.in_measured is true but no traced step is a measured one "
                             f"(measured steps are {warm}–{total - 1})",
                             "drop profile.in_measured, or list a measured step in profile.steps"))
    if isinstance(prof.ranks, list):
        bad = sorted({r for r in prof.ranks if not 0 <= r < cfg.world})
        if bad or not prof.ranks:
            what = "profile.ranks is empty" if not prof.ranks else \
                f"profile.ranks {', '.join(map(str, bad))} not among this run's ranks 0–{cfg.world - 1}"
            out.append(Violation("profile_ranks_in_world", f"{what}: nothing is traced there",
                                 f"list ranks below {cfg.world}, or use profile.ranks: per_stage or all"))
    return out


def rule_stand_in(cfg: RunConfig) -> list[Violation]:
    if cfg.hardware.stand_in and is_cpu_name(cfg.hardware.device):
        return [Violation("stand_in_needs_device", "hardware.stand_in is set but hardware.device is already cpu",
                          "drop hardware.stand_in, or name the device the CPU stands in for")]
    return []


def rule_cooling(cfg: RunConfig) -> list[Violation]:
    """``hardware.cooling`` sets the predictor's slot temperatures and fan power: a host CPU has neither here."""
    if cfg.hardware.cooling is not None and is_cpu_name(cfg.hardware.device):
        return [Violation("cooling_needs_gpu", f"hardware.cooling {cfg.hardware.cooling} is set for the host CPU, "
                          "which has no thermal model here", "drop hardware.cooling, or name the GPU device it cools")]
    return []


# Rules that only the built-in trainer imposes (Megatron-Core / NeMo / torchtitan run these configurations)
# or that concern only how powertrain measures a run (its data, profiler, cool-down gate), which the
# predictor does not read: the predictor and the advisor (engine megatron) do not refuse them.
TRAINER_ONLY_RULES = frozenset({"pipeline_microbatches", "context_parallel_unsupported", "tied_embeddings_unsupported",
                                "fsdp_with_ep", "expert_tp_unsupported", "model_architecture_unsupported",
                                "low_precision_unsupported", "lora_fused_qkv_unsupported",
                                "lora_expert_targets_unsupported",
                                "data_path", "byte_vocab", "data_path_needs_text",
                                "cooldown_temp_needs_time",
                                "profile_needs_enabled", "profile_steps_in_run", "profile_measured_needs_in_measured",
                                "in_measured_needs_measured_step", "profile_ranks_in_world"})

RULES: list[Rule] = [rule_device, rule_world, rule_tensor_parallel, rule_pipeline, rule_experts, rule_batch,
                     rule_recipe, rule_lora, rule_supported, rule_controls, rule_control_range, rule_async_tp, rule_device_order,
                     rule_stand_in, rule_cooling, rule_node_size, rule_cooldown, rule_profile]


def validate(cfg: RunConfig) -> list[Violation]:
    """Every rule ``cfg`` breaks (empty when it can run). Memory fit is added by the predictor."""
    return [v for rule in (*RULES, *_EXTRA_RULES) for v in rule(cfg)]


def layout_violations(cfg: RunConfig) -> list[Violation]:
    """What ``cfg`` breaks that no framework could run (the trainer-only limits left out): what the
    predictor refuses before costing a configuration."""
    return [v for v in validate(cfg) if v.rule not in TRAINER_ONLY_RULES]


def check(cfg: RunConfig) -> RunConfig:
    """``cfg`` if it is valid, else raise :class:`ConfigError` naming every broken rule."""
    violations = validate(cfg)
    if violations:
        raise ConfigError(violations)
    return cfg
