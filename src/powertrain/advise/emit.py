"""What to run: a candidate as a runnable spec, the top N as a confirmation sweep, or another engine's flags.

:func:`run_spec_dict` is the candidate as a :class:`~powertrain.spec.run.RunConfig` mapping (it is
validated by building the RunConfig, so a spec this writes always loads). Knobs the spec cannot hold
are listed in ``notes`` instead of being dropped silently: a precision other than fp32/bf16 (the
built-in trainer runs those two), parameter-gather overlap (a Megatron distributed-optimizer flag),
a clock lock without the GPUs' maximum SM clock (``max_sm_clock_mhz``, ``advise --max-sm-clock-mhz``;
with it the lock is written as ``knobs.sm_clock_mhz``: the fraction times that clock, pinned).

:func:`emit_flags` prints the equivalent command-line flags of Megatron-LM, NeMo 2 (recipe overrides)
or torchtitan (TOML keys as ``--section.key`` flags); a setting an engine has no flag for is named in
a comment line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from powertrain.advise.request import Request
from powertrain.advise.space import Candidate
from powertrain.spec.effective import unused_fields
from powertrain.spec.model import catalog
from powertrain.spec.run import RunConfig, spec_precision

ENGINES = ("megatron", "nemo", "torchtitan")


def _model_entry(req: Request) -> Any:
    named = catalog().get(req.model.name)
    return req.model.name if named == req.model else req.model.model_dump(mode="json")


def run_spec_dict(cand: Candidate, req: Request, name: str = "advised", warmup: int = 2, measured: int = 5,
                  max_sm_clock_mhz: float | None = None, device_order: list[int] | None = None,
                  pp_split: list[int] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the run spec mapping, notes on what it cannot express). ``device_order`` and ``pp_split`` come
    from a placement (:func:`powertrain.advise.placement.place_stages`)."""
    c, lay = cand.case, cand.layout
    notes: list[str] = []
    prec = spec_precision(req.precision)
    if prec != req.precision:
        notes.append(f"precision {req.precision}: the spec holds fp32, bf16, fp16, fp8 or fp4; written as {prec}")
    if prec in ("fp16", "fp8", "fp4"):
        notes.append(f"precision {prec}: the built-in trainer trains fp32 or bf16 (plan rejects the spec); run this "
                     "configuration with Megatron-LM or NeMo (--emit megatron / nemo)")
    if c.overlap_param_gather:
        notes.append("parameter-gather overlap is a Megatron distributed-optimizer flag (--overlap-param-gather); "
                     "the built-in trainer has no such knob")
    if c.cp > 1 or (lay.fsdp and lay.ep > 1) or lay.etp is not None:
        notes.append("context parallelism / FSDP with EP / parallel folding (etp): the built-in trainer refuses these "
                     "(plan rejects the spec); run this configuration with Megatron-LM or NeMo (--emit megatron / nemo)")
    knobs: dict[str, Any] = {
        "micro_batch": c.micro_batch, "global_batch": c.global_batch, "recompute": c.recompute, "precision": prec,
        "overlap": {"async_tp": bool(c.overlap_tp and c.tp > 1), "grad_reduce_in_backward": bool(c.overlap_dp),
                    "fsdp_prefetch": bool(c.overlap_fsdp)},
    }
    if cand.clock_lock is not None:
        mhz = _lock_mhz(cand.clock_lock, max_sm_clock_mhz)
        if mhz is not None:
            knobs["sm_clock_mhz"] = [mhz, mhz]
        else:
            notes.append(f"SM clock lock at {cand.clock_lock:.0%} of the maximum: not written; give the GPUs' maximum "
                         "SM clock (powertrain advise --max-sm-clock-mhz MHZ; nvidia-smi -q -d CLOCK, Max Clocks) "
                         "to write it as knobs.sm_clock_mhz")
    elif c.power_limit_w is not None:
        knobs["power_limit_w"] = float(c.power_limit_w)
    layout: dict[str, Any] = {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "fsdp": lay.fsdp,
              "sequence_parallel": lay.sequence_parallel, "distributed_optimizer": c.distributed_optimizer}
    if lay.etp is not None:
        layout["etp"] = lay.etp
    if lay.pp > 1:
        layout.update(pp_schedule=lay.pp_schedule, virtual_stages=lay.virtual_stages)
        split = pp_split or (list(c.pp_split) if isinstance(c.pp_split, list) else None)
        if split:
            layout["pp_split"] = split
    spec = {"name": name, "model": _model_entry(req), "layout": layout, "knobs": knobs,
            "hardware": {"nodes": req.nodes, "devices_per_node": req.devices_per_node, "device": req.device_name},
            "protocol": {"warmup_steps": warmup, "measured_steps": measured}}
    if device_order is not None:
        spec["launch"] = {"device_order": list(device_order)}
    # knobs that change nothing for this layout are left out: `powertrain run` refuses them (spec.effective)
    for dotted in unused_fields(RunConfig.model_validate(spec)):
        *parents, key = dotted.split(".")
        holder: dict[str, Any] = spec
        for part in parents:
            holder = holder[part]
        holder.pop(key, None)
    RunConfig.model_validate(spec)  # what this writes always loads
    return spec, notes


def _lock_mhz(ratio: float, max_sm_clock_mhz: float | None) -> int | None:
    """The SM clock (whole MHz, as knobs.sm_clock_mhz takes it) a lock at ``ratio`` of the maximum pins."""
    return round(ratio * max_sm_clock_mhz) if max_sm_clock_mhz else None


def _header(notes: list[str], what: str) -> str:
    lines = [f"# {what} — written by `powertrain advise` (predicted, not measured)"]
    lines += [f"# note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def emit_spec(cand: Candidate, req: Request, path: Path, **kw: Any) -> list[str]:
    """Write the candidate as a run spec; returns the notes (also written as comments)."""
    spec, notes = run_spec_dict(cand, req, name=kw.pop("name", path.stem), **kw)
    path.write_text(_header(notes, f"advised configuration: {cand.label()}")
                    + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    return notes


def emit_sweep(cands: list[Candidate], req: Request, path: Path, name: str = "advise-confirm",
               backend: str | None = None, **kw: Any) -> list[str]:
    """Write the top N as one sweep (``cases``), in the advised order, for a confirmation run."""
    cases: list[dict[str, Any]] = []
    notes: list[str] = []
    base: dict[str, Any] | None = None
    for i, cand in enumerate(cands):
        spec, n = run_spec_dict(cand, req, name=f"top{i + 1}", **kw)
        notes += [f"top{i + 1}: {x}" for x in n]
        if base is None:
            base = {k: spec[k] for k in ("model", "hardware", "protocol")}
        case = {"layout": spec["layout"], "knobs": spec["knobs"]}
        if case in cases:  # differs only in what the spec cannot hold: the same run
            notes.append(f"top{i + 1}: the same run spec as top{cases.index(case) + 1} (it differs only in a knob "
                         "the spec cannot hold); listed once")
            continue
        cases.append(case)
    assert base is not None
    sweep = {"name": name, "description": f"confirmation of advise's top {len(cands)} (advised order = case order)",
             "base": base, "grid": [{"cases": cases}],
             "launch": {"backend": backend or ("local" if req.is_cpu else "slurm"), "time_limit_min": 30}}
    path.write_text(_header(notes, "confirmation sweep: " + " | ".join(c.label() for c in cands))
                    + yaml.safe_dump(sweep, sort_keys=False, allow_unicode=True))
    return notes


# Megatron-LM's recompute flags per mode ({L}: layers per (virtual) stage, so "full" covers every layer)
_MEGATRON_RC = {"none": [], "selective": ["--recompute-activations"],
                "full": ["--recompute-granularity full", "--recompute-method block", "--recompute-num-layers {L}"]}


def emit_flags(cand: Candidate, req: Request, engine: str, max_sm_clock_mhz: float | None = None) -> str:
    """The candidate as another engine's flags (one per line; unsupported settings as # comments). With
    ``max_sm_clock_mhz`` a clock lock's ``nvidia-smi -lgc`` line names the clock in MHz."""
    c, lay = cand.case, cand.layout
    if engine == "megatron":
        return _megatron(cand, req, max_sm_clock_mhz)
    if engine == "nemo":
        out = [f"trainer.num_nodes={req.nodes}", f"trainer.devices={req.devices_per_node}",
               f"trainer.strategy.tensor_model_parallel_size={lay.tp}",
               f"trainer.strategy.pipeline_model_parallel_size={lay.pp}",
               f"trainer.strategy.context_parallel_size={lay.cp}", f"trainer.strategy.expert_model_parallel_size={lay.ep}",
               f"trainer.strategy.sequence_parallel={str(lay.sequence_parallel).lower()}",
               f"data.micro_batch_size={c.micro_batch}", f"data.global_batch_size={c.global_batch}",
               f"data.seq_length={c.seq_len}",
               f"optim.config.use_distributed_optimizer={str(c.distributed_optimizer).lower()}",
               f"model.config.recompute_granularity={'null' if c.recompute == 'none' else c.recompute}",
               f"trainer.plugins.precision={'bf16-mixed' if req.precision == 'bf16' else req.precision}"]
        if lay.virtual_stages > 1:
            out.append(f"trainer.strategy.virtual_pipeline_model_parallel_size={lay.virtual_stages}")
        if lay.etp is not None:
            out.append(f"trainer.strategy.expert_tensor_parallel_size={lay.etp}")
        if c.recompute == "full":
            out += ["model.config.recompute_method=block",
                    f"model.config.recompute_num_layers={max(1, c.layers // max(1, lay.pp * lay.virtual_stages))}"]
        if lay.fsdp:
            out.append("# FSDP: NeMo 2 uses Megatron FSDP (trainer.strategy.fsdp=megatron) where available")
        out += _power_comments(cand, max_sm_clock_mhz)
        return " \\\n  ".join(x for x in out if not x.startswith("#")) + "\n" + \
            "\n".join(x for x in out if x.startswith("#"))
    if engine == "torchtitan":
        out = [f"--parallelism.tensor_parallel_degree {lay.tp}", f"--parallelism.pipeline_parallel_degree {lay.pp}",
               f"--parallelism.context_parallel_degree {lay.cp}",
               f"--parallelism.data_parallel_shard_degree {lay.dp if lay.fsdp else 1}",
               f"--parallelism.data_parallel_replicate_degree {1 if lay.fsdp else lay.dp}",
               f"--training.global_batch_size {c.global_batch}",
               f"--training.local_batch_size {c.global_batch // (lay.dp or 1)}",
               f"--parallelism.pipeline_parallel_microbatch_size {c.micro_batch}",
               f"--training.seq_len {c.seq_len}",
               f"--activation_checkpoint.mode {c.recompute}"]
        if lay.pp > 1:
            sched = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved_1f1b": "Interleaved1F1B"}[lay.pp_schedule]
            out.append(f"--parallelism.pipeline_parallel_schedule {sched}")
        if lay.ep > 1:
            out.append(f"--parallelism.expert_parallel_degree {lay.ep}")
        if lay.etp is not None:
            out.append(f"--parallelism.expert_tensor_parallel_degree {lay.etp}")
        if c.overlap_tp and lay.tp > 1:
            out.append("--parallelism.enable_async_tensor_parallel")
        if req.precision == "fp8":
            out.append("--model.converters float8")
        notes = ["# torchtitan shards with FSDP2: a distributed optimizer is FSDP's sharding there"] \
            if c.distributed_optimizer else []
        return " \\\n  ".join(out) + "\n" + "\n".join(notes + _power_comments(cand, max_sm_clock_mhz))
    raise ValueError(f"--emit {engine!r}: use a .yaml path, or one of {', '.join(ENGINES)}")


def _megatron(cand: Candidate, req: Request, max_sm_clock_mhz: float | None = None) -> str:
    c, lay = cand.case, cand.layout
    out = [f"--tensor-model-parallel-size {lay.tp}", f"--pipeline-model-parallel-size {lay.pp}",
           f"--context-parallel-size {lay.cp}", f"--expert-model-parallel-size {lay.ep}",
           f"--micro-batch-size {c.micro_batch}", f"--global-batch-size {c.global_batch}",
           f"--seq-length {c.seq_len}"]
    if lay.etp is not None:
        out.append(f"--expert-tensor-parallel-size {lay.etp}")
    if lay.sequence_parallel:
        out.append("--sequence-parallel")
    if lay.virtual_stages > 1:
        out.append(f"--num-layers-per-virtual-pipeline-stage {c.layers // (lay.pp * lay.virtual_stages)}")
    if c.distributed_optimizer:
        out.append("--use-distributed-optimizer")
    if lay.fsdp:
        out.append("--use-torch-fsdp2")
    layers_per_stage = max(1, c.layers // max(1, lay.pp * lay.virtual_stages))
    out += [f.format(L=layers_per_stage) for f in _MEGATRON_RC[c.recompute]]
    if c.overlap_tp and lay.tp > 1:
        out.append("--tp-comm-overlap")
    if c.overlap_dp and not lay.fsdp:
        out.append("--overlap-grad-reduce")
    if c.overlap_param_gather:
        out.append("--overlap-param-gather")
    out.append({"bf16": "--bf16", "fp16": "--fp16", "fp8": "--bf16 --fp8-format hybrid"}.get(req.precision, ""))
    notes = ["# GPipe: Megatron-LM has no GPipe schedule; its 1F1B has the same bubble"] \
        if lay.pp > 1 and lay.pp_schedule == "gpipe" else []
    return " \\\n  ".join(x for x in out if x) + "\n" + "\n".join(notes + _power_comments(cand, max_sm_clock_mhz))


def _power_comments(cand: Candidate, max_sm_clock_mhz: float | None = None) -> list[str]:
    c = cand.case
    if cand.clock_lock is not None:
        mhz = _lock_mhz(cand.clock_lock, max_sm_clock_mhz)
        how = f"nvidia-smi -lgc {mhz},{mhz}" if mhz is not None else "nvidia-smi -lgc MHZ,MHZ"
        return [f"# before launch: lock SM clocks to {cand.clock_lock:.0%} of the maximum on every GPU ({how}; root)"]
    if c.power_limit_w is not None:
        return [f"# before launch: nvidia-smi -pl {c.power_limit_w:.0f} on every GPU (root)"]
    return []
