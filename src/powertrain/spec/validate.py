"""Rules that reject a run configuration **before** any process starts.

:func:`validate` returns every :class:`Violation` (rule, what is wrong, how to fix it), so the
launcher can refuse to start and the sweep planner can mark or skip impossible points. Each rule is
one small function; more rules (e.g. the predictor's memory fit) plug in with :func:`register_rule`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from powertrain.hardware.catalog import UnknownDeviceError, get_device, is_cpu_name
from powertrain.spec.run import RunConfig


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
    if lay.ep == 1:
        return out
    if not m.is_moe:
        return [Violation("ep_needs_moe", f"ep = {lay.ep} but model {m.name} has no experts",
                          "set layout.ep: 1 for dense models")]
    if m.experts % lay.ep:
        out.append(Violation("experts_divisible_by_ep", f"experts ({m.experts}) not divisible by ep ({lay.ep})",
                             f"choose ep among the divisors of {m.experts}"))
    dp = _dp(cfg)
    if dp and (dp * lay.cp) % lay.ep:
        out.append(Violation("ep_divides_dp",
                             f"ep ({lay.ep}) must divide dp×cp ({dp}×{lay.cp}): expert parallelism is carved out of data parallelism",
                             f"choose ep among the divisors of {dp * lay.cp}, or raise the world size"))
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


def rule_supported(cfg: RunConfig) -> list[Violation]:
    out = []
    if cfg.layout.cp > 1:
        out.append(Violation("context_parallel_unsupported", "context parallelism is not implemented by the built-in trainer",
                             "set layout.cp: 1"))
    if cfg.model.tied_embeddings:
        out.append(Violation("tied_embeddings_unsupported", "tied embeddings are not implemented by the built-in trainer",
                             "set model.tied_embeddings: false"))
    if cfg.data.kind == "text":
        if cfg.data.path is None or not cfg.data.path.is_file():
            out.append(Violation("data_path", f"data.kind text needs an existing file, got {cfg.data.path}",
                                 "set data.path to a plain text file"))
        if cfg.model.vocab < 256:
            out.append(Violation("byte_vocab", f"byte-level text needs vocab ≥ 256, model has {cfg.model.vocab}",
                                 "use a model with vocab ≥ 256, or data.kind: synthetic"))
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


RULES: list[Rule] = [rule_device, rule_world, rule_tensor_parallel, rule_pipeline, rule_experts, rule_batch, rule_supported]


def validate(cfg: RunConfig) -> list[Violation]:
    """Every rule ``cfg`` breaks (empty when it can run). Memory fit is added by the predictor."""
    return [v for rule in (*RULES, *_EXTRA_RULES) for v in rule(cfg)]


def check(cfg: RunConfig) -> RunConfig:
    """``cfg`` if it is valid, else raise :class:`ConfigError` naming every broken rule."""
    violations = validate(cfg)
    if violations:
        raise ConfigError(violations)
    return cfg
