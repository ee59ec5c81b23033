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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from powertrain.core.flops import hardware_flops_per_token, model_flops_per_token
from powertrain.hardware import get_device
from powertrain.predict.case import Case

CALIBRATION_RUNS = Path(__file__).with_name("data") / "calibration_runs.yaml"


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


SOURCE_SHORT = (
    ("Megatron-Bridge", "Megatron-Bridge"), ("Narayanan", "Narayanan21"), ("Korthikanti", "Korthikanti22"),
    ("Megatron-LM README 'Performance", "Megatron-LM README H100"), ("Megatron-LM README (2020", "Megatron-LM 2020"),
    ("NeMo docs/source/performance/performance_lo", "NeMo long-seq"), ("NeMo docs", "NeMo 24.07"),
    ("torchtitan", "torchtitan"), ("MLPerf Training v4.0 Sustainable", "MLPerf SMC"), ("MLPerf", "MLPerf v4.0"),
    ("Perseus", "Perseus"),
)


def _short_source(ref: str) -> str:
    for key, short in SOURCE_SHORT:
        if key in ref:
            return short
    return ref[:24]


def _precision(text: str) -> str:
    t = (text or "").lower()
    if "fp4" in t:
        return "fp4"
    if "fp8" in t or "float8" in t:
        return "fp8"
    if "fp16" in t and "bf16" not in t:
        return "fp16"
    return "bf16"


def _recompute(text: Any) -> str:
    t = str(text or "none").lower()
    return "full" if t.startswith("full") else "selective" if t.startswith("selective") else "none"


def _era(fw: str, ref: str) -> str:
    f = f"{fw} {ref}".lower()
    if "torchtitan" in f:
        return "torchtitan"
    if "2020" in f or "2021" in f or "narayanan" in f or "korthikanti" in f or "6985e58" in f:
        return "megatron-legacy"
    return "megatron-core"


def run_from_entry(r: dict[str, Any]) -> PublishedRun:
    m, hw, par, b = r["model"], r["hardware"], r["parallel"], r["batch"]
    src = _short_source(r["source"]["ref"])
    out = PublishedRun(id=r["id"], source=src, gpu=hw["gpu"], arch=m.get("arch", "dense"), case=None,
                       tokens_per_s_per_gpu=None, raw=r)
    if not m.get("seq_len"):
        out.skip = "sequence length not published"
        return out
    if par.get("tp") is None or par.get("pp") is None:
        out.skip = "parallel layout not published"
        return out
    try:
        dev = get_device(hw["gpu"])
    except KeyError:
        out.skip = f"device {hw['gpu']} not in catalog"
        return out
    count = int(hw["count"])
    tp, pp, cp = int(par["tp"]), int(par["pp"]), int(par.get("cp") or 1)
    dp = int(par.get("dp") or count // (tp * pp * cp))
    if tp * pp * cp * dp != count:
        out.skip = f"tp·pp·cp·dp = {tp * pp * cp * dp} ≠ {count} devices"
        return out
    era = _era(str(r.get("framework", "")), r["source"]["ref"])
    gb = b.get("global")
    micro = b.get("micro") or (1 if era == "torchtitan" and pp > 1 else b.get("local_batch")) or 1
    if gb is None:
        out.skip = "global batch not published"
        return out
    fsdp_field = par.get("fsdp")
    fsdp = (isinstance(fsdp_field, str) and "fsdp" in fsdp_field.lower()) or (
        isinstance(fsdp_field, int) and fsdp_field > 0) or par.get("zero") == 3
    caveats = " ".join(str(c) for c in r.get("caveats") or []).lower()
    experts = int(m.get("experts") or 1)
    act = str(m.get("activation") or "gelu").lower()
    prec_text = str(r.get("precision", ""))
    modern = era == "megatron-core"
    case = Case(
        layers=int(m["layers"]), hidden=int(m["hidden"]), ffn=int(m["ffn"]), heads=int(m["heads"]),
        kv_heads=int(m.get("kv_heads") or m["heads"]), vocab=int(m.get("vocab") or 51200),
        seq_len=int(m["seq_len"]), experts=experts, top_k=int(m.get("top_k") or 1),
        moe_ffn=int(m.get("moe_ffn") or 0), shared_experts=int(m.get("shared_experts") or 0),
        gated=act.startswith("swiglu") or act.startswith("geglu"),
        tp=tp, pp=pp, dp=dp, cp=cp, ep=int(par.get("ep") or 1), vp=int(par.get("vp") or 1),
        sequence_parallel=bool(par.get("sequence_parallel")) or (era != "megatron-legacy" and tp > 1),
        fsdp=bool(fsdp),
        distributed_optimizer=(modern and not fsdp) or par.get("zero") in ("distributed optimizer", 1),
        pp_schedule=str(par.get("pp_schedule") or ("interleaved_1f1b" if (par.get("vp") or 1) > 1 else "1f1b")),
        micro_batch=int(micro), global_batch=int(gb), recompute=_recompute(r.get("recompute")),
        precision=_precision(prec_text),
        overlap_tp=modern or "asynctp" in prec_text.lower().replace(" ", ""),
        overlap_dp=era != "megatron-legacy", overlap_fsdp=True, overlap_param_gather=modern,
        power_limit_w=hw.get("power_limit_w"), lora="lora" in str(r.get("task", "")).lower(),
        moe_imbalance=1.0 if ("force-balanced" in caveats or r.get("moe_token_drop")) else None,
        device=dev, nodes=max(1, count // int(hw.get("gpus_per_node") or dev.node.devices_per_node)),
        devices_per_node=int(hw.get("gpus_per_node") or dev.node.devices_per_node),
    )
    # A layout whose 16-bit weights and fp32 gradients alone exceed the device cannot have run
    # unsharded: the framework's FSDP must have been on (a table cell left at 0).
    from powertrain.core.flops import parameter_counts

    if not fsdp and not case.lora:
        pc = parameter_counts(case)
        params_dev = (sum(pc.values()) - pc["experts"]) / (tp * pp) + pc["experts"] / (tp * pp * case.ep)
        if params_dev * 6 > dev.memory_bytes:
            case.fsdp, case.distributed_optimizer = True, False
            out.note = "FSDP assumed: unsharded weights and gradients exceed device memory"
    out.case = case
    out.recompute_stated = r.get("recompute") is not None
    out.tokens_per_s_per_gpu = _measured_tps(r, case, src)
    if out.tokens_per_s_per_gpu is None:
        out.skip = "no throughput or step time published"
    return out


def _measured_tps(r: dict[str, Any], case: Case, src: str) -> float | None:
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
    if me.get("tflops_per_gpu"):
        # the source's own FLOP count: Narayanan's Eq. 3 counts recomputation, others model FLOPs
        per_tok = (hardware_flops_per_token(case, case.recompute) if src == "Narayanan21"
                   else model_flops_per_token(case))
        return float(me["tflops_per_gpu"]) * 1e12 / per_tok
    return None


def load_published(path: str | Path | None = None) -> list[PublishedRun]:
    """The published runs of ``path`` (default: the packaged :data:`CALIBRATION_RUNS`)."""
    path = Path(path) if path is not None else CALIBRATION_RUNS
    if not path.is_file():
        raise FileNotFoundError(f"calibration file {path} not found; pass the path of a calibration_runs.yaml")
    raw = yaml.safe_load(path.read_text())
    return [run_from_entry(r) for r in raw.get("runs", [])]
