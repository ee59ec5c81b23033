"""Check that layouts reproduce a single-process run: many layouts in **one** process group.

``torchrun --nproc_per_node=N -m powertrain.workload.equivalence CASES.json OUT.json`` builds and
trains every case of ``CASES.json`` in turn (``[{"name", "config": RunConfig, "steps",
"skip_grad_sync"?, "facts"?}]``) and rank 0 writes ``{name: [global loss per step]}`` to ``OUT.json``
(and ``{name}/facts``, what :func:`facts` measured, for a case that asks).
:func:`reference_losses` gives the single-process losses of the same model and batches (micro-batch
1, no recomputation, no parallelism) to compare with, and :func:`max_rel_diff` the comparison.
Launch cost (5–16 s per torchrun on a small machine) is paid once for all cases.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from powertrain.diagnostics import show_on_stderr
from powertrain.spec.layout import Layout
from powertrain.spec.run import RunConfig

log = logging.getLogger("powertrain.workload.equivalence")  # not __name__: torchrun runs this module as __main__


def reference_config(cfg: RunConfig) -> RunConfig:
    knobs = cfg.knobs.model_copy(update={"micro_batch": 1, "recompute": "none"})
    return cfg.model_copy(update={"layout": Layout(), "knobs": knobs, "hardware": cfg.hardware.model_copy(
        update={"nodes": 1, "devices_per_node": 1})})


def reference_losses(cfg: RunConfig, steps: int) -> list[float]:
    """Losses of ``cfg``'s model and batches trained in this process alone (no process group)."""
    from powertrain.workload.trainer import Trainer

    t = Trainer(reference_config(cfg))
    out = [t.step(i).loss for i in range(steps)]
    return [float(x) for x in out if x is not None]


def max_rel_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def _numel(p: Any) -> int:
    return int(p.to_local().numel()) if hasattr(p, "to_local") else int(p.numel())


def facts(t: Any) -> dict[str, Any]:
    """What a trainer built, as the knob walk measures it: gradient sync mode, DDP bucket size, FSDP
    resharding and prefetch, the parameters this rank holds (``param_numel``), those its optimizer
    updates (``optimizer_numel``) and those it keeps state for after the steps run (``state_numel``:
    with LoRA, the adapters alone)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    mod = t.par.module
    every = [p for _, m in t.par.stages for p in m.parameters()]
    owned = getattr(t.optimizer, "owned", None)  # ZeRO-1 (ShardedAdamW): this rank's share
    inner = getattr(t.optimizer, "inner", t.optimizer)
    updated = owned if owned is not None else [p for g in t.optimizer.param_groups for p in g["params"]]
    out: dict[str, Any] = {"dp_mode": t.par.dp_mode, "optimizer_numel": sum(_numel(p) for p in updated),
                           "param_numel": sum(_numel(p) for p in every),
                           "state_numel": sum(_numel(p) for p in (inner.state if inner is not None else {}))}
    if isinstance(mod, DistributedDataParallel):
        out["ddp_bucket_bytes"] = mod.bucket_bytes_cap
    blocks = [b for b in getattr(mod, "layers", {}).values() if isinstance(b, FSDPModule)]
    if blocks:
        state = blocks[0]._get_fsdp_state()
        group = state._fsdp_param_group
        out["fsdp_reshard_after_forward"] = group is not None and group.post_forward_mesh_info is not None
        out["fsdp_forward_prefetch"] = len(state._states_to_forward_prefetch)
    return out


def run_cases(cases: list[dict[str, Any]]) -> dict[str, Any]:
    from powertrain.workload.trainer import Trainer

    out: dict[str, Any] = {}
    for case in cases:
        cfg = RunConfig.model_validate(case["config"])
        t_build = time.perf_counter()
        t = Trainer(cfg, skip_grad_sync=bool(case.get("skip_grad_sync", False)))
        t0 = time.perf_counter()
        out[case["name"]] = [t.step(i).loss for i in range(int(case.get("steps", 5)))]
        if case.get("facts"):
            out[f"{case['name']}/facts"] = facts(t)
        if dist.get_rank() == 0:
            log.info("%s: built in %.1f s, trained in %.1f s", case["name"], t0 - t_build, time.perf_counter() - t0)
        t.close()
        del t
        gc.collect()
        dist.barrier()
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    show_on_stderr(logging.INFO)  # the usage text and rank 0's per-case timings, on stderr as before
    if len(argv) != 2:
        log.error("%s", __doc__)
        return 2
    from powertrain.fast_exit import skip_final_collection
    from powertrain.workload.train import init_distributed

    skip_final_collection()
    init_distributed()
    cases = json.loads(Path(argv[0]).read_text())
    losses = run_cases(cases)
    if dist.get_rank() == 0:
        Path(argv[1]).write_text(json.dumps(losses, indent=1))
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
