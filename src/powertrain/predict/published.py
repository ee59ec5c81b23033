"""Published training runs (``calibration_runs.yaml``) as predict Cases with measured throughput.

The file's conventions differ by source (see its README); this adapter normalises them to one
measured quantity, **tokens per second per device**, from whichever the source reports:
tokens/s/GPU, else the iteration time, else TFLOP/s per GPU divided by the source's own FLOP
count per token. Runs that lack what a prediction needs (sequence length, layout, batch) are
returned with ``skip`` set to the reason.

Framework defaults fill what a table does not state, by framework era rather than by row:
Megatron-Core, NeMo, Megatron-Bridge and MLPerf NVIDIA recipes run with a distributed optimizer,
sequence parallelism with TP, TP-comm overlap and DP/param-gather overlap; 2020–21 Megatron-LM
reduced gradients after the backward pass; torchtitan uses FSDP2 with prefetch.

The file ships with the package (:data:`CALIBRATION_RUNS`, ``predict/data/``, a copy of the shared
``data/published/calibration_runs.yaml`` whose every run names its source); ``load_published`` reads it
unless given another path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from powertrain.core.flops import hardware_flops_per_token, model_flops_per_token
from powertrain.core.lora import MLPERF_RANK, MLPERF_TARGETS
from powertrain.core.lora import TARGETS as LORA_TARGETS
from powertrain.core.yamlfile import load_yaml_file
from powertrain.hardware import DeviceSpec, get_device
from powertrain.predict.case import Case
from powertrain.predict.reading_rules import reading_rules

CALIBRATION_RUNS = Path(__file__).with_name("data") / "calibration_runs.yaml"
# Runs the predictor is never fitted on (data/README.md): benchmarks report the shipped profile's error on them.
HELDOUT_FILES = tuple(sorted(Path(__file__).with_name("data").glob("heldout_*.yaml")))


@dataclass
class PublishedRun:
    id: str
    source: str
    gpu: str
    arch: str  # dense | moe
    case: Case | None
    tokens_per_s_per_gpu: float | None
    recompute_stated: bool = True
    note: str | None = None
    skip: str | None = None
    raw: dict[str, Any] | None = None
    # what was assumed where the entry's free text did not say (vp, recompute, FSDP), one line each
    assumptions: list[str] = field(default_factory=list)
    # the reading rule (data/reading_rules.yaml) that filled an unstated recomputation; None where the run
    # states it or no rule applies (then the least recomputation that fits: validation.complete_recompute)
    recompute_rule: str | None = None


def _short_source(ref: str) -> str:
    """The source's short label (the group leave-one-source-out holds out): ``data/reading_rules.yaml``."""
    return reading_rules().source_label(ref)


def read_precision(value: Any) -> tuple[str, str | None]:
    """(precision, assumption) of a published ``precision`` field: the widest GEMM precision it names
    (fp4, fp8, fp16, bf16, tf32, fp32); text that names none ("mixed") is bf16, stated. (The loader refuses
    a run with no precision at all before reading it: :func:`_precision_missing`.)"""
    if value is None or not str(value).strip():
        return "bf16", "precision not published: bf16 assumed"
    head = str(value).split("(")[0]
    if head.strip() != str(value).strip():
        # "fp8 (… config not '_fp4')": the stated precision comes first, the remark after it may name others
        stated, note = read_precision(head)
        if note is None:
            return stated, None
    t = str(value).lower()
    if "fp4" in t:
        return "fp4", None
    if "fp8" in t or "float8" in t:
        return "fp8", None
    if "fp16" in t and "bf16" not in t:
        return "fp16", None
    if "bf16" in t or "bfloat16" in t:
        return "bf16", None
    if "tf32" in t:
        return "tf32", None
    if "fp32" in t or "float32" in t:
        return "fp32", None
    return "bf16", f"precision {value!r} names no GEMM precision: bf16 assumed"


@dataclass(frozen=True, slots=True)
class FrameworkReading:
    """What a run's framework (and its reference) say about the defaults it ran with — read in one place."""

    era: str  # whose defaults fill what the run leaves unsaid (data/reading_rules.yaml era_defaults)
    modelled: bool  # False: no framework whose defaults are modelled (Megatron-Core's are assumed, and stated)
    attention: str  # "flash2" (a PyTorch-native stack's FlashAttention-2 class) or "fused" (TE / cuDNN)


def read_framework(framework: str, ref: str = "") -> FrameworkReading:
    """The era, whether its defaults are modelled, and the attention kernel of a run's framework text, by the
    rules of ``data/reading_rules.yaml`` (each with its reason and source)."""
    rules = reading_rules()
    era = rules.era(framework, ref)
    modelled = bool(rules.modelled_frameworks.match.found(framework))
    # an era read from the reference alone (torchtitan's docs) names the stack too
    attention = "flash2" if rules.flash2_attention.match.found(f"{framework} {era}") else "fused"
    return FrameworkReading(era, modelled, attention)


# --- free-text fields ---------------------------------------------------------------------------------

# What each framework does when a run leaves recomputation at its default (the run says "default").
RECOMPUTE_DEFAULTS: dict[str, tuple[str, str]] = {
    "megatron-core": ("none", "Megatron-LM/NeMo: --recompute-granularity / activations_checkpoint_granularity "
                              "default to null (no recomputation) unless set"),
    "megatron-legacy": ("none", "Megatron-LM: --recompute-granularity defaults to None (no recomputation)"),
    "megatron-deepspeed": ("none", "Megatron-DeepSpeed: activations are checkpointed only with --checkpoint-activations"),
    "torchtitan": ("selective", "torchtitan: [activation_checkpoint] mode defaults to 'selective' "
                                "(torchtitan/config/job_config.py ActivationCheckpoint; its train configs use "
                                "selective_ac_option 'op'), modelled as selective"),
    "maxtext": ("full", "MaxText: remat_policy defaults to 'full' (MaxText/configs/base.yml)"),
}
_NONE_WORDS = ("none", "no", "off", "false", "disabled", "0", "n/a", "-", "without")
# Megatron-Core's --recompute-modules (selective recomputation of parts of a layer), beyond core_attn
_SELECTIVE_MODULES = ("moe_act", "mla_up_proj", "up_proj", "up-proj", "up-projection", "layernorm", "shared_experts")
# recomputation said to be on without a method: every layer checkpointed, what the words mean in HF
# (gradient_checkpointing), DeepSpeed and PyTorch's checkpoint wrappers
_ON_WORDS = ("yes", "on", "true", "enabled", "ac on", "activation checkpointing", "activation checkpoint",
             "gradient checkpointing", "checkpointing", "activation recomputation", "recompute")
_DEFAULT_WORDS = ("default", "config default", "framework default", "recipe default")


def parse_recompute(value: Any, era: str) -> tuple[str, bool, str | None]:
    """(mode, stated, assumption) of a published ``recompute`` field, whatever its wording.

    ``None``/missing is not stated (the caller searches the least recomputation that fits). "default"
    takes the framework's default (:data:`RECOMPUTE_DEFAULTS`). Words that name a method map to it
    (full/uniform/block → full; selective/attention/op/layer → selective; none/off → none). Anything
    else is treated as not stated, with the assumption saying so.
    """
    if value is None:
        return "none", False, None
    if value is True:
        return "full", True, "recompute: true read as full recomputation"
    if value is False:
        return "none", True, None
    t = str(value).strip().lower()
    # the stated method comes first; a remark in brackets ("none (not full recompute)") may name others
    head = t.split("(")[0].strip()
    for text in dict.fromkeys((head, t)):
        if text in _DEFAULT_WORDS or text.startswith("default") or "config default" in text or "framework default" in text:
            mode, why = RECOMPUTE_DEFAULTS.get(era, RECOMPUTE_DEFAULTS["megatron-core"])
            return mode, True, f"recompute {value!r}: the framework default, {mode} ({why})"
        if text.startswith(("full", "uniform", "block")) or "full" in re.findall(r"[a-z]+", text):
            return "full", True, None
        if text.startswith("selective") or any(w in text for w in ("selective", "attn", "attention", "core attention",
                                                                    *_SELECTIVE_MODULES)):
            return "selective", True, None
        if text in _NONE_WORDS or text.startswith(("none", "no ", "off")):
            return "none", True, None
        if text in _ON_WORDS:
            return "full", True, f"recompute {value!r}: on without a method, read as full recomputation (every layer)"
    return "none", False, (f"recompute {value!r} not understood: treated as not stated (the least recomputation "
                           "that fits is assumed)")


# Adapter target names as frameworks write them → core.lora's names. Megatron-Core / NeMo 2 name the fused
# layers (linear_qkv, linear_fc1: gate and up in one), NeMo 1 its own (attention_qkv, attention_dense, mlp_fc1,
# mlp_fc2) and the groups "attention" and "mlp"; a fused fc1's one adapter is costed as gate_proj + up_proj.
_LORA_TARGET_NAMES: dict[str, tuple[str, ...]] = {
    **{t: (t,) for t in LORA_TARGETS},
    "linear_qkv": ("qkv_proj",), "attention_qkv": ("qkv_proj",), "linear_proj": ("o_proj",),
    "attention_dense": ("o_proj",), "linear_fc1": ("gate_proj", "up_proj"), "mlp_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",), "mlp_fc2": ("down_proj",), "attention": ("qkv_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}
_LORA_TARGET_WORDS = re.compile(r"\b(" + "|".join(sorted(_LORA_TARGET_NAMES, key=len, reverse=True)) + r")\b")


def _lora_targets(names: Any) -> tuple[str, ...] | None:
    """Stated target names (a list, or one comma/space-separated string) in core.lora's names, None when none
    is one."""
    words = names if isinstance(names, list) else re.split(r"[\s,]+", str(names or ""))
    out: list[str] = []
    for w in words:
        for t in _LORA_TARGET_NAMES.get(str(w).strip().strip("'\"[]").lower(), ()):
            if t not in out:
                out.append(t)
    return tuple(out) or None


def read_lora(r: dict[str, Any]) -> tuple[int, tuple[str, ...], list[str]]:
    """(rank, targets, assumptions) of a published run; rank 0 and no targets unless its ``task`` says LoRA.

    Read in order: a mapping ``task: {kind: lora, rank, targets}`` or ``lora: {rank, targets}`` (targets in
    core.lora's, Megatron-Core's or NeMo's names); else the caveats' free text (``rank 16``, ``lora_rank``,
    ``adapter_dim 16``; ``linear_qkv``/``linear_proj``, ``target_modules [attention]``…), said so; else the
    MLPerf Llama-2-70B reference's rank 16 on the fused QKV and output projections, said so."""
    task, given = r.get("task"), r.get("lora")
    stated: dict[str, Any] = task if isinstance(task, dict) else (given if isinstance(given, dict) else {})
    kind = str(task.get("kind", "")) if isinstance(task, dict) else str(task or "")
    if "lora" not in kind.lower():
        return 0, (), []
    notes: list[str] = []
    rank = _int(stated.get("rank"))
    if rank is None:  # a caveat about the adapters ("rank 0" of a process group is no LoRA rank)
        about = [str(c).lower() for c in r.get("caveats") or [] if re.search(r"lora|adapter", str(c).lower())]
        found = [int(n) for c in about for n in re.findall(r"(?:lora_rank|adapter_dim|\brank)\W{0,3}(\d+)", c)]
        rank = next((n for n in found if n >= 1), None)
        notes.append(f"LoRA rank {rank} read from the caveats" if rank else
                     f"LoRA rank not published: {MLPERF_RANK} assumed (the MLPerf Llama-2-70B reference's)")
    targets = _lora_targets(stated.get("targets"))
    if targets is None:  # only a caveat about target modules names them ("attention" alone means more elsewhere)
        about = [str(c).lower() for c in r.get("caveats") or [] if re.search(r"target[ _-]modules?", str(c).lower())]
        targets = _lora_targets([w for c in about for w in _LORA_TARGET_WORDS.findall(c)])
        notes.append(f"LoRA targets {', '.join(targets)} read from the caveats" if targets else
                     f"LoRA targets not published: {', '.join(MLPERF_TARGETS)} assumed (the MLPerf Llama-2-70B "
                     "reference's, NeMo's linear_qkv and linear_proj)")
    return int(rank or MLPERF_RANK), targets or MLPERF_TARGETS, notes


def parse_vp(value: Any, layers: int, pp: int) -> tuple[int, str | None]:
    """(virtual stages, assumption) of a published ``vp`` field.

    A whole number (or the first number in the text, "vp=4", "V=5") is taken; "N layers per virtual stage"
    (or chunk) is the stage's layers ÷ N; none/"-"/"no" is 1. Text that says the schedule is interleaved
    without a number takes the smallest interleaving that divides the stage's layers (2, else 3, …),
    stated; any other text, or a fraction, is 1, stated.
    """
    per_stage = max(1, layers // max(1, pp))
    n = _number(value)
    t = "" if value is None else str(value).strip().lower()
    if n is not None and re.search(r"layers?\s*(per|/|each)", t):
        if n >= 1 and n == int(n) and per_stage % int(n) == 0:
            return per_stage // int(n), None
        return 1, f"vp {value!r}: {n:g} layers per chunk does not divide a stage's {per_stage} layers; V = 1 assumed"
    if n is not None and n >= 1 and n == int(n):
        return int(n), None
    if value is None:
        return 1, None
    if t in _NONE_WORDS or t.startswith(("none", "no ", "not interleaved", "1f1b")):
        return 1, None
    if "interleav" in t or "virtual" in t:
        v = next((v for v in range(2, per_stage + 1) if per_stage % v == 0), 1)
        return v, (f"vp {value!r}: interleaved with V not stated; V = {v} assumed (the smallest interleaving that "
                   f"divides the {per_stage} layers of a stage)")
    return 1, f"vp {value!r} not understood: no interleaving (V = 1) assumed"


def _number(value: Any) -> float | None:
    """The first number of a field (``8``, ``"8 (TP-comm overlap)"``, ``"1,024"``, ``"8k"``); None if none."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    m = re.search(r"(\d[\d,]*(?:\.\d+)?)\s*([kKmM]?)(?![a-zA-Z])", str(value))
    if not m:
        return None
    x = float(m.group(1).replace(",", ""))
    return x * {"k": 1024, "m": 1024**2}.get(m.group(2).lower(), 1) if m.group(2) else x


def _int(value: Any) -> int | None:
    n = _number(value)
    return None if n is None else int(n)


# --- one published run -----------------------------------------------------------------------------------

_MODEL_REQUIRED = ("layers", "hidden", "heads")


def _ffn_or_assumed(m: dict[str, Any], hidden: int, gated: bool) -> tuple[int, str | None]:
    """The FFN width a run states, else the convention of its MLP, stated: 4·h for a GELU MLP (GPT), and
    Llama's 2/3 of 4·h rounded up to a multiple of 256 for a gated (SwiGLU/GeGLU) one."""
    ffn = _int(m.get("ffn"))
    if ffn:
        return int(ffn), None
    if gated:
        width = -(-int(8 * hidden / 3) // 256) * 256
        return width, f"FFN width not published: {width} assumed (2/3 of 4·hidden rounded up to 256, Llama's rule)"
    return 4 * hidden, f"FFN width not published: {4 * hidden} assumed (4·hidden, GPT's MLP)"


def run_from_entry(r: dict[str, Any]) -> PublishedRun:
    """One entry of the file as a :class:`PublishedRun`; what a prediction needs but the source does not say
    becomes ``skip`` (its reason), free text that cannot be read becomes an ``assumptions`` line."""
    m, hw = r.get("model") or {}, r.get("hardware") or {}
    par, b = r.get("parallel") or {}, r.get("batch") or {}
    ref = str((r.get("source") or {}).get("ref", ""))
    out = PublishedRun(id=str(r.get("id")), source=_short_source(ref), gpu=str(hw.get("gpu")),
                       arch=str(m.get("arch") or ("moe" if (_int(m.get("experts")) or 1) > 1 else "dense")),
                       case=None, tokens_per_s_per_gpu=None, raw=r)
    if r.get("usable_for_validation") is False:  # the transcriber's judgement, with its reason in the caveats
        out.skip = "marked not usable for validation by its transcription (its caveats say why)"
        return out
    out.skip = _missing(m, hw, par, b) or _precision_missing(r.get("precision"))
    if out.skip:
        return out
    try:
        dev = get_device(str(hw["gpu"]))
    except KeyError as exc:  # UnknownDeviceError: the catalog lacks it (its closest entries named)
        out.skip = f"device not in the hardware catalog: {exc}"
        return out
    count = int(_int(hw.get("count")) or 0)
    if not count:  # _missing let it through: every degree is stated
        count = int(_int(par["tp"]) or 1) * int(_int(par["pp"]) or 1) * int(_int(par.get("cp")) or 1) * int(_int(par["dp"]) or 1)
        out.assumptions.append(f"device count not published: {count} = tp × pp × cp × dp")
        hw = {**hw, "count": count}
    if _int(par.get("tp")) is None or _int(par.get("pp")) is None:
        tp_pp = _inferred_tp_pp(par, hw)
        if tp_pp is None:  # _missing has refused such a run already
            out.skip = "parallel layout not published"
            return out
        out.assumptions.append(f"tp/pp not published: tp {tp_pp[0]}, pp {tp_pp[1]} inferred from {count} devices = "
                               "dp × cp × tp × pp with the stated dp and cp")
        par = {**par, "tp": tp_pp[0], "pp": tp_pp[1]}
    tp, pp, cp = int(_int(par["tp"]) or 1), int(_int(par["pp"]) or 1), int(_int(par.get("cp")) or 1)
    dp = int(_int(par.get("dp")) or count // (tp * pp * cp))
    if tp * pp * cp * dp != count:
        out.skip = f"tp·pp·cp·dp = {tp * pp * cp * dp} ≠ {count} devices"
        return out
    fw = str(r.get("framework") or "")
    stack = read_framework(fw, ref)
    if not stack.modelled:
        out.assumptions.append(f"framework {fw or 'not published'!r} is none whose defaults are modelled: Megatron-Core's "
                               "assumed (distributed optimizer without FSDP, DP-overlap, SP with TP)")
    case = _case(r, m, hw, par, b, dev, stack, (tp, pp, cp, dp), out)
    from powertrain.predict.moe import enrich_case

    case = enrich_case(case, r)  # MoE/attention details, the fp8 recipe (issue 15, predict/moe.py)
    case, out.skip = _expert_placement(case, out.assumptions)
    if out.skip:
        return out
    # A layout whose 16-bit weights and fp32 gradients alone exceed the device cannot have run
    # unsharded: the framework's FSDP must have been on (a table cell left at 0).
    from powertrain.core.flops import parameter_counts

    if not case.fsdp and not case.lora:
        pc = parameter_counts(case)
        params_dev = (sum(pc.values()) - pc["experts"]) / (tp * pp) + pc["experts"] / (tp * pp * case.ep)
        if params_dev * 6 > dev.memory_bytes:
            case.fsdp, case.distributed_optimizer = True, False
            out.note = "FSDP assumed: unsharded weights and gradients exceed device memory"
            out.assumptions.append(out.note)
    out.case = case
    out.tokens_per_s_per_gpu = _measured_tps(r, case, ref)
    if out.tokens_per_s_per_gpu is None:
        out.tokens_per_s_per_gpu, mfu_note = _tps_from_mfu(r, case)
        if mfu_note:
            out.assumptions.append(mfu_note)
    if out.tokens_per_s_per_gpu is None:
        out.skip = "no throughput, step time, TFLOP/s or MFU published"
    return out


def _expert_placement(case: Case, assumptions: list[str]) -> tuple[Case, str | None]:
    """The case with an expert placement its layout can hold, or the reason none can.

    Without ``etp`` the model places EP groups inside data parallelism (ranks ``tp·cp`` apart), which needs
    ``ep`` to divide ``dp·cp``; a table row like TP2·DP32 with EP64 can only run folded (EP across the
    stage's TP×CP×DP ranks, expert TP 1), so it is read that way and said so. An EP group larger than a
    pipeline stage's ranks cannot run at all: the row is refused with the numbers."""
    if not case.is_moe or case.ep <= 1:
        return case, None
    stage = case.tp * case.cp * case.dp
    etp = case.etp or 1
    if stage % (etp * case.ep):
        return case, (f"layout not possible: EP {case.ep} × expert TP {etp} does not divide the {stage} ranks of a "
                      f"pipeline stage (tp {case.tp} × cp {case.cp} × dp {case.dp})")
    if case.etp is None and (case.dp * case.cp) % case.ep:
        assumptions.append(f"EP {case.ep} does not divide the {case.dp * case.cp} data-parallel ranks: read as "
                           "parallel folding (EP across TP×CP×DP, expert TP 1), the placement Megatron-Core has for it")
        return replace(case, etp=1), None
    return case, None


def _inferred_tp_pp(par: dict[str, Any], hw: dict[str, Any]) -> tuple[int, int] | None:
    """(tp, pp) when a run leaves one or both out but its stated dp (and cp) leave exactly one way to fill
    the device count: both 1 when dp·cp covers every device, else the one missing degree; None otherwise."""
    count, dp, cp = _int(hw.get("count")), _int(par.get("dp")), _int(par.get("cp")) or 1
    tp, pp = _int(par.get("tp")), _int(par.get("pp"))
    if (tp is None and par.get("tp") is not None) or (pp is None and par.get("pp") is not None):
        return None  # stated but unreadable ("eight"): not ours to replace
    if not count or not dp or count % (dp * cp):
        return None
    rest = count // (dp * cp)
    if tp is None and pp is None:
        return (1, 1) if rest == 1 else None
    known = tp if tp is not None else pp
    if not known or rest % known:
        return None
    return (tp, rest // known) if tp is not None else (rest // known, int(pp or 1))


def _missing(m: dict[str, Any], hw: dict[str, Any], par: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Why a prediction cannot be made from what the entry publishes, or None."""
    if not _int(m.get("seq_len")):
        return "sequence length not published"
    lacking = [k for k in _MODEL_REQUIRED if not _int(m.get(k))]
    if lacking:
        return f"model size not published ({', '.join(lacking)})"
    if (_int(par.get("tp")) is None or _int(par.get("pp")) is None) and _inferred_tp_pp(par, hw) is None:
        return "parallel layout not published"
    if not hw.get("gpu"):
        return "device not published"
    if not _int(hw.get("count")) and not all(_int(par.get(k)) for k in ("tp", "pp", "dp")):
        return "device count not published"
    if _int(b.get("global")) is None and not (_int(b.get("micro")) and _int(b.get("grad_accum"))):
        return "global batch not published"
    return None


def _precision_missing(value: Any) -> str | None:
    """A run that names no precision is refused: its GEMM rate hangs on it (bf16, fp8 and fp4 differ 2-4×
    on Blackwell), and MLPerf's LoRA rows that leave it unsaid ran fp8 or fp4, where a bf16 guess read
    them 53-56 % slow (sets N and O, docs/model.md §9)."""
    return "precision not published" if value is None or not str(value).strip() else None


def _global_batch(b: dict[str, Any], seq: int, dp: int, assumptions: list[str]) -> int:
    """The global batch in sequences: as stated; divided by the sequence length when stated in tokens ("4M
    tokens"); else micro-batch × accumulation steps × dp (``_missing`` let the run through only then)."""
    gb = _int(b.get("global"))
    if gb is not None and "token" in str(b.get("global")).lower():
        tokens, gb = gb, max(1, round(gb / seq))
        assumptions.append(f"global batch {b.get('global')!r} is in tokens: {tokens:,} ÷ sequence length {seq:,} "
                           f"= {gb:,} sequences" + ("" if tokens % seq == 0 else " (rounded)"))
    if gb is None:
        gb = int(_int(b["micro"]) or 1) * int(_int(b["grad_accum"]) or 1) * dp
        assumptions.append(f"global batch not published: {gb} = micro-batch × accumulation steps × dp {dp}")
    return gb


def _case(r: dict[str, Any], m: dict[str, Any], hw: dict[str, Any], par: dict[str, Any], b: dict[str, Any],
          dev: DeviceSpec, stack: FrameworkReading, degrees: tuple[int, int, int, int], out: PublishedRun) -> Case:
    """The Case of an entry whose required fields are present (framework defaults fill the rest)."""
    tp, pp, cp, dp = degrees
    layers = int(_int(m["layers"]) or 1)
    gb = _global_batch(b, int(_int(m["seq_len"]) or 1), dp, out.assumptions)
    micro = _int(b.get("micro"))
    if micro is None and stack.era == "torchtitan" and pp > 1:
        micro = 1
        out.assumptions.append("micro-batch not published: 1, torchtitan's pipeline default")
    elif micro is None:
        micro = _int(b.get("local_batch"))  # without PP, torchtitan's local batch is the micro-batch
    if micro is None:
        micro = 1
        out.assumptions.append("micro-batch not published: 1 assumed (the smallest; large runs' usual choice)")
    fsdp_field = par.get("fsdp")
    fsdp = (isinstance(fsdp_field, str) and "fsdp" in fsdp_field.lower()) or (
        isinstance(fsdp_field, int | float) and not isinstance(fsdp_field, bool) and fsdp_field > 0) or (
        fsdp_field is True) or par.get("zero") == 3
    caveats = " ".join(str(c) for c in r.get("caveats") or []).lower()
    lora_rank, lora_targets, lora_notes = read_lora(r)
    out.assumptions += lora_notes
    act = str(m.get("activation") or "gelu").lower()
    precision, prec_note = read_precision(r.get("precision"))
    era = reading_rules().defaults(stack.era)  # what the stack does where the run does not say
    vp, vp_note = parse_vp(par.get("vp"), layers, pp)
    if par.get("vp") is None and pp > 1:
        vp_note = "virtual stages not published: no interleaving (V = 1) assumed"
    recompute, rc_note = _read_recompute(r.get("recompute"), stack.era, out)
    out.assumptions += [n for n in (vp_note, rc_note, prec_note) if n]
    hidden = int(_int(m["hidden"]) or 1)
    ffn, ffn_note = _ffn_or_assumed(m, hidden, act.startswith(("swiglu", "geglu")))
    if ffn_note:
        out.assumptions.append(ffn_note)
    if _int(m.get("vocab")) is None:
        out.assumptions.append("vocabulary not published: 51,200 assumed (GPT-2's, padded as Megatron-LM does)")
    if _int(m.get("kv_heads")) is None:
        out.assumptions.append("kv_heads not published: multi-head attention assumed (kv_heads = heads)")
    sp_field = par.get("sequence_parallel")
    if isinstance(sp_field, str) and sp_field.strip().lower() in ("true", "yes", "on", "false", "no", "off"):
        sp_field = sp_field.strip().lower() in ("true", "yes", "on")  # a YAML string where a bool was meant
    if isinstance(sp_field, bool):
        sequence_parallel = sp_field  # stated: a stated False is not overridden by the framework's default
    else:
        sequence_parallel = era["sequence_parallel"] and tp > 1
        if sequence_parallel:
            out.assumptions.append("sequence parallelism not published: on with TP, the framework's default")
    if (_int(m.get("experts")) or 1) > 1 and _int(par.get("ep")) is None:
        out.assumptions.append("expert parallelism not published: EP 1 assumed (every rank holds every expert, "
                               "split over TP like the dense layers)")
    gpn = _int(hw.get("gpus_per_node")) or dev.node.devices_per_node
    kernel = stack.attention
    if kernel == "flash2":
        out.assumptions.append("attention: FlashAttention-2 class (a PyTorch-native framework's default, not Transformer "
                               "Engine's fused attention)")
    return Case(
        layers=layers, hidden=hidden, ffn=ffn,
        heads=int(_int(m["heads"]) or 1), kv_heads=int(_int(m.get("kv_heads")) or _int(m["heads"]) or 1),
        vocab=int(_int(m.get("vocab")) or 51200), seq_len=int(_int(m["seq_len"]) or 1),
        experts=int(_int(m.get("experts")) or 1), top_k=int(_int(m.get("top_k")) or 1),
        moe_ffn=int(_int(m.get("moe_ffn")) or 0), shared_experts=int(_int(m.get("shared_experts")) or 0),
        gated=act.startswith("swiglu") or act.startswith("geglu"),
        tied_embeddings=m.get("tied_embeddings") is True or str(m.get("tied_embeddings")).lower() in ("true", "yes"),
        tp=tp, pp=pp, dp=dp, cp=cp, ep=int(_int(par.get("ep")) or 1), vp=vp,
        sequence_parallel=sequence_parallel,
        fsdp=bool(fsdp),
        distributed_optimizer=(era["distributed_optimizer"] and not fsdp) or par.get("zero") in ("distributed optimizer", 1),
        pp_schedule=str(par.get("pp_schedule") or ("interleaved_1f1b" if vp > 1 else "1f1b")),
        micro_batch=int(micro), global_batch=gb, recompute=recompute,
        precision=precision,
        overlap_tp=era["overlap_tp"] or "asynctp" in str(r.get("precision") or "").lower().replace(" ", ""),
        overlap_dp=era["overlap_dp"], overlap_fsdp=True, overlap_param_gather=era["overlap_param_gather"],
        power_limit_w=_number(hw.get("power_limit_w")), lora_rank=lora_rank, lora_targets=lora_targets,
        moe_imbalance=1.0 if _force_balanced(r, caveats) else None, attention_kernel=kernel,
        device=dev, devices_per_node=gpn,
    )


def _read_recompute(value: Any, era: str, out: PublishedRun) -> tuple[str, str | None]:
    """(mode, assumption) of a run's recomputation: as stated (:func:`parse_recompute`), else by its era's rule
    (data/reading_rules.yaml unstated_recompute), recorded on ``out``; else not stated (the scorer's least that
    fits, validation.complete_recompute)."""
    mode, out.recompute_stated, note = parse_recompute(value, era)
    rule = None if out.recompute_stated else reading_rules().recompute_for_era(era)
    if rule is not None:  # the era's scripts say what an unstated recomputation was
        said = "not published" if note is None else f"{value!r} not understood"
        mode, out.recompute_rule = str(rule.value["mode"]), rule.id
        note = f"recompute {said}: {mode} assumed ({rule.reason})"
    return mode, note


def _force_balanced(r: dict[str, Any], caveats: str) -> bool:
    """Whether the run's expert routing was forced to balance (or capped by token dropping).

    A stated ``moe_force_balance`` decides; otherwise the calibration file's convention, a caveat saying
    "expert routing force-balanced", matched as that phrase: "routing not force-balanced" or
    "force-balanced routing not stated" must not turn it on (the held-out file's first reading did)."""
    stated = r.get("moe_force_balance")
    if isinstance(stated, bool):
        return stated or r.get("moe_token_drop") is True
    return reading_rules().force_balanced_phrase in caveats or bool(r.get("moe_token_drop"))


def _tps_from_mfu(r: dict[str, Any], case: Case) -> tuple[float | None, str | None]:
    """Tokens/s per GPU from a run that publishes only MFU (papers often do): MFU × the device's dense peak
    for the run's precision ÷ the model's FLOPs per token — the source's peak and FLOP count assumed to be
    those, and said so."""
    me = r.get("measured") or {}
    mfu = _number(me.get("mfu"))
    if not mfu or mfu <= 0:
        return None, None
    frac = mfu / 100 if mfu > 1 else mfu  # "42.5" (percent) or 0.425
    peak = case.device.peak(case.precision)
    tps = frac * peak / model_flops_per_token(case)
    return tps, (f"only MFU published ({frac:.1%}): throughput = MFU × {case.device.name} {case.precision} dense peak "
                 f"({peak / 1e12:,.0f} TFLOP/s) ÷ the model's FLOPs per token; the source's peak and FLOP count "
                 "are assumed to be these")


def _measured_tps(r: dict[str, Any], case: Case, ref: str) -> float | None:
    me, de = r.get("measured") or {}, r.get("derived") or {}
    count = case.world
    tokens_step = case.global_batch * case.seq_len
    if me.get("tokens_per_s_per_gpu"):
        return float(me["tokens_per_s_per_gpu"])
    if de.get("tokens_per_s_per_gpu"):
        return float(de["tokens_per_s_per_gpu"])
    it = me.get("iteration_time_s") or de.get("iteration_time_s")
    if it:
        return tokens_step / float(it) / count
    job = _number(me.get("tokens_per_s")) or _number(de.get("tokens_per_s_job_reported"))
    if job:  # the whole job's tokens/s
        return job / count
    tflops = _number(me.get("tflops_per_gpu"))
    if not tflops and _number(me.get("aggregate_pflops")):  # the whole job's PFLOP/s
        tflops = float(me["aggregate_pflops"]) * 1e3 / count
    if tflops:
        # the source's own FLOP count (data/reading_rules.yaml tflops_counts): some count recomputation
        per_tok = (hardware_flops_per_token(case, case.recompute) if reading_rules().tflops_count(ref) == "hardware"
                   else model_flops_per_token(case))
        return tflops * 1e12 / per_tok
    return None


def load_published(path: str | Path | None = None) -> list[PublishedRun]:
    """The published runs of ``path`` (default: the packaged :data:`CALIBRATION_RUNS`)."""
    return read_published(path)[1]


def read_published(path: str | Path | None = None) -> tuple[dict[str, Any], list[PublishedRun]]:
    """(the file's ``meta`` mapping, its runs) of ``path`` (default: :data:`CALIBRATION_RUNS`), read once."""
    path = Path(path) if path is not None else CALIBRATION_RUNS
    if not path.is_file():
        raise FileNotFoundError(f"calibration file {path} not found; pass the path of a calibration_runs.yaml")
    # the C loader when PyYAML has it: the file is 270+ runs, the pure-Python loader takes seconds
    raw = load_yaml_file(path, "published-runs table") or {}
    meta: dict[str, Any] = raw["meta"] if isinstance(raw.get("meta"), dict) else {}
    return meta, [_read_entry(r, i) for i, r in enumerate(raw.get("runs") or [])]


def _read_entry(r: Any, i: int) -> PublishedRun:
    """One entry, never a crash: an entry that is not a mapping, or whose values cannot be read, is
    kept as skipped with the reason (one bad row does not lose the file)."""
    if not isinstance(r, dict):
        return PublishedRun(id=f"#{i}", source="?", gpu="?", arch="?", case=None, tokens_per_s_per_gpu=None,
                            skip=f"entry {i} is not a mapping")
    try:
        return run_from_entry(r)
    except (TypeError, ValueError, KeyError, ZeroDivisionError) as exc:
        return PublishedRun(id=str(r.get("id", f"#{i}")), source="?", gpu=str((r.get("hardware") or {}).get("gpu")),
                            arch="?", case=None, tokens_per_s_per_gpu=None, raw=r,
                            skip=f"entry cannot be read ({type(exc).__name__}: {exc})")
