"""Entry point of one training rank: ``torchrun … -m powertrain.workload.train --spec SPEC``.

Started by ``powertrain run`` (:mod:`powertrain.launch.local`), which sets ``$POWERTRAIN_RUN_DIR``.
Each rank then writes its output to ``<run>/logs/rank-<r>.log`` and its events to
``<run>/events/rank-<r>.parquet``; on an error it also writes ``<run>/logs/rank-<r>.error.json``
(time, error, traceback) so the launcher can say which rank failed first and why. Picks CUDA + NCCL
when an accelerator is present, else CPU + gloo.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from powertrain import hooks
from powertrain.diagnostics import show_on_stderr
from powertrain.fast_exit import skip_final_collection
from powertrain.spec.run import RunConfig, load_run_config
from powertrain.store.rundir import file_mode, write_json_atomic
from powertrain.workload.mesh import device_type

log = logging.getLogger("powertrain.workload.train")  # not __name__: torchrun runs this module as __main__


def load_spec(path: Path) -> RunConfig:
    if path.suffix == ".json":
        return RunConfig.model_validate_json(path.read_text())
    return load_run_config(path)


def _redirect(log: Path) -> int:
    """Send this process's stdout/stderr (Python and C++) to ``log``; returns a copy of the old stdout."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, file_mode())  # the run directory's mode policy
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    return saved


def init_distributed() -> str:
    """Join the torchrun process group (if any); returns the device type."""
    dev = device_type()
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        if dev != "cpu":
            torch.accelerator.set_device_index(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if dev == "cuda" else "gloo")
    return dev


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m powertrain.workload.train", description=__doc__)
    p.add_argument("--spec", type=Path, required=True, help="resolved run spec (JSON or YAML)")
    args = p.parse_args(argv)
    skip_final_collection()
    rank = int(os.environ.get("RANK", "0"))
    run_dir = Path(os.environ[hooks.RUN_DIR_ENV]) if os.environ.get(hooks.RUN_DIR_ENV) else None
    console = None
    if run_dir is not None:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        saved = _redirect(run_dir / "logs" / f"rank-{rank}.log")
        console = os.fdopen(saved, "w", buffering=1) if rank == 0 else None
    show_on_stderr()  # this rank's diagnostics (powertrain loggers) go to its stderr: the rank log under a run
    rec = None
    trainer = None
    try:
        from powertrain.workload.run_loop import run_protocol
        from powertrain.workload.trainer import StepResult, Trainer

        cfg = load_spec(args.spec)
        dev = init_distributed()
        sync = torch.accelerator.synchronize if dev != "cpu" else None
        rec = hooks.configure(run_dir, rank, sync=sync) if run_dir is not None else hooks.Recorder(None, rank)
        trainer = Trainer(cfg, recorder=rec)
        lay = trainer.layout
        print(f"rank {rank}: {cfg.model.name} {lay.label()} on {trainer.device} coords {trainer.coords} "
              f"dp-sync {trainer.par.dp_mode} {'; '.join(trainer.par.notes)}", flush=True)
        total = cfg.protocol.warmup_steps + cfg.protocol.measured_steps

        def report(res: StepResult) -> None:
            line = f"step {res.step + 1}/{total} [{res.window}] loss {res.loss:.4f} {res.seconds * 1e3:.0f} ms"
            print(line, flush=True)
            if console is not None:
                print(f"powertrain: {line}", file=console, flush=True)

        run_protocol(trainer, run_dir, on_step=report)
    except BaseException as exc:  # every failure is recorded, then the rank exits non-zero
        tb = traceback.format_exc()
        log.error("%s", tb)
        if run_dir is not None:
            write_json_atomic(run_dir / "logs" / f"rank-{rank}.error.json",
                              {"rank": rank, "t_ns": time.time_ns(), "error": f"{type(exc).__name__}: {exc}",
                               "traceback": tb})
        if rec is not None:
            rec.close()
        sys.stdout.flush()
        # Peers may be blocked in a collective: exit now and let torchrun stop them.
        os._exit(1)
    if rec is not None:
        rec.close()
    if trainer is not None:
        trainer.close()
        del trainer
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
