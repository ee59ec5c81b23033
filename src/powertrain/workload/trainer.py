"""The reference training loop: one optimizer step over a global batch, under any layout.

A step of ``global_batch`` samples: each data-parallel rank takes its ``global_batch/dp`` samples
and runs them as ``global_batch/(dp·micro_batch)`` micro-batches (gradient accumulation, or the
pipeline schedule's micro-batches). Gradients are *summed* over micro-batches and divided once at
the end, so the update equals a single-process step on the whole batch (the MoE load-balancing
gradient included). The loss reported for a step is the mean next-token cross-entropy over the
global batch.

Every step, and its forward / backward / optimizer / communication phases, is marked through
:mod:`powertrain.hooks`, with the protocol's ``warmup`` / ``measured`` window.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from powertrain import hooks
from powertrain.spec.run import RunConfig
from powertrain.workload.data import Batches
from powertrain.workload.mesh import Meshes, build_meshes, device_type
from powertrain.workload.models import build_model
from powertrain.workload.models.lora import apply_lora, unfrozen_base
from powertrain.workload.models.mixtral import MoE
from powertrain.workload.parallel.pipeline import build_schedule
from powertrain.workload.parallel.zero import ShardedAdamW
from powertrain.workload.parallelize import Parallelized, parallelize, trainable_parameters

# Fault injection for the crash tests: "RANK:STEP" makes that rank raise at that step,
# "RANK:STEP:kill" makes it kill itself with SIGKILL (no Python clean-up at all).
FAULT_ENV = "POWERTRAIN_FAULT"


@dataclass(frozen=True)
class Fault:
    """A fault the crash tests inject (``$POWERTRAIN_FAULT``): rank ``rank`` fails at step ``step``."""

    rank: int
    step: int
    kill: bool  # SIGKILL itself (no Python clean-up) instead of raising


def parse_fault(text: str | None) -> Fault | None:
    """``$POWERTRAIN_FAULT``: ``RANK:STEP`` or ``RANK:STEP:kill`` (whole numbers >= 0); unset or empty: None.

    Anything else is refused: a test that sets a fault and gets none would pass for the wrong reason.
    """
    if not text:
        return None
    parts = text.strip().split(":")
    if len(parts) in (2, 3) and all(p.isdecimal() for p in parts[:2]) and parts[2:] in ([], ["kill"]):
        return Fault(int(parts[0]), int(parts[1]), parts[2:] == ["kill"])
    raise ValueError(f"{FAULT_ENV}={text!r} is not a fault to inject: use RANK:STEP (that rank raises at that "
                     f"step) or RANK:STEP:kill (it kills itself), e.g. 1:8 or 1:8:kill; or unset {FAULT_ENV}")


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (computed in fp32)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


@dataclass
class StepResult:
    step: int
    loss: float | None  # global mean loss (None only when it could not be gathered)
    seconds: float
    window: str | None


class Trainer:
    """Builds this rank's share of the model for ``cfg`` and trains it step by step."""

    def __init__(self, cfg: RunConfig, *, recorder: hooks.Recorder | None = None,
                 skip_grad_sync: bool = False) -> None:
        self._fault = parse_fault(os.environ.get(FAULT_ENV))  # refused before the model is built
        self.cfg = cfg
        self.device_type = device_type()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(self.device_type, local_rank) if self.device_type != "cpu" else torch.device("cpu")
        self.meshes: Meshes = build_meshes(cfg.layout, self.device_type)
        self.layout = lay = self.meshes.layout
        assert lay.dp is not None
        self.coords = self.meshes.coords
        self.rec = recorder if recorder is not None else hooks.Recorder(None)

        torch.manual_seed(cfg.knobs.seed)  # every rank builds the same full model, then keeps its share
        model = build_model(cfg.model, moe_aux_coeff=cfg.knobs.moe_aux_coeff)
        if cfg.task.is_lora:  # adapters on the targeted layers, the base frozen (drawn on the CPU, then moved)
            apply_lora(model, cfg.task, cfg.knobs.seed)
        model = model.to(self.device)
        self.par: Parallelized = parallelize(model, cfg, self.meshes, skip_grad_sync=skip_grad_sync)
        if cfg.task.is_lora:  # a parallelism that re-created a frozen weight as trainable would train the base
            unfrozen = unfrozen_base([np for _, mod in self.par.stages for np in mod.named_parameters()])
            if unfrozen:
                raise RuntimeError(f"LoRA: {len(unfrozen)} base parameter(s) would train under layout "
                                   f"{lay.label()} (e.g. {unfrozen[0]}); report this layout")
        self.optimizer: torch.optim.Optimizer | ShardedAdamW
        if cfg.layout.distributed_optimizer and self.par.replica_groups:  # ZeRO-1 over the replicas
            self.optimizer = ShardedAdamW(self.par.replica_groups, lr=cfg.knobs.lr)
        else:  # one replica, or FSDP (which shards the states itself)
            # only what trains: a frozen (LoRA base) weight gets no gradient, so it must hold no optimizer state
            self.optimizer = torch.optim.AdamW(trainable_parameters(self.par), lr=cfg.knobs.lr)
        for _, mod in self.par.stages:  # expert all-to-alls mark themselves as comm events
            for m in mod.modules():
                if isinstance(m, MoE) and m.ep_group is not None and self.rec.enabled:
                    m.recorder = self.rec

        self.batches = Batches(cfg.data, cfg.model, cfg.knobs.global_batch, cfg.knobs.seed)
        self.local_batch = cfg.knobs.global_batch // lay.dp
        self.n_micro = self.local_batch // cfg.knobs.micro_batch
        stage_ids = [s for s, _ in self.par.stages]
        self.is_first = 0 in stage_ids
        self.has_loss = lay.stages - 1 in stage_ids
        self.schedule = None
        if lay.pp > 1:
            self.schedule = build_schedule(self.par.stages, lay, self.n_micro, loss_fn, self.device,
                                           self.meshes.group("pp"), recorder=self.rec)
        self.losses: list[float | None] = []

    # -- helpers ---------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        return torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.cfg.knobs.precision == "bf16")

    def _grad_sync_ctx(self, last: bool) -> contextlib.AbstractContextManager[object]:
        """Let DDP / FSDP reduce gradients only on the last micro-batch of the step."""
        mod = self.par.module
        if isinstance(mod, DistributedDataParallel) and not last:
            return mod.no_sync()
        if isinstance(mod, FSDPModule):
            mod.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def _micro_batches(self, local: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        yield from enumerate(local.split(self.cfg.knobs.micro_batch))

    def peak_memory(self) -> int | None:
        """Peak allocated bytes since the last reset, where the device reports it (None on CPU)."""
        if self.device_type == "cpu":
            return None
        return int(torch.accelerator.max_memory_allocated(self.device))

    # -- one step --------------------------------------------------------------------------------
    def step(self, i: int) -> StepResult:
        cfg, lay, rec = self.cfg, self.layout, self.rec
        if self._fault is not None and (self._fault.rank, self._fault.step) == (self.meshes.rank, i):
            if self._fault.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault ({FAULT_ENV}) on rank {self.meshes.rank} at step {i}")
        if self.device_type != "cpu":
            torch.accelerator.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        tokens = self.local_batch * cfg.model.seq_len
        rec.begin_step(i, tokens=tokens, samples=self.local_batch)
        with rec.phase("data"):
            local = self.batches.local(i, self.coords["dp"], lay.dp or 1).to(self.device)
        loss_sum = torch.zeros((), device=self.device)
        local_loss: torch.Tensor | None
        if self.schedule is None:
            model = self.par.module
            for k, mb in self._micro_batches(local):
                x, y = mb[:, :-1], mb[:, 1:]
                with self._grad_sync_ctx(k == self.n_micro - 1):
                    rec.begin("forward", microbatch=k)
                    with self._autocast():
                        loss = loss_fn(model(x), y)
                    rec.end()
                    rec.begin("backward", microbatch=k)
                    loss.backward()
                    rec.end()
                loss_sum += loss.detach()
            if self.n_micro > 1:  # summed over micro-batches → mean
                with torch.no_grad():
                    for p in trainable_parameters(self.par):
                        if p.grad is not None:
                            p.grad.div_(self.n_micro)
            local_loss = loss_sum / self.n_micro
        else:
            losses: list[torch.Tensor] = []
            x, y = local[:, :-1], local[:, 1:]
            # The whole schedule is one enclosing "pipeline" phase; the stage calls inside it are
            # marked per micro-batch and direction by the schedule's timed stages (pipeline.py), so
            # the time of this phase not covered by them is the bubble plus point-to-point waits.
            rec.begin("phase", "pipeline", schedule=lay.pp_schedule, microbatches=self.n_micro)
            with self._autocast():
                if self.is_first and self.has_loss:
                    self.schedule.step(x, target=y, losses=losses)
                elif self.is_first:
                    self.schedule.step(x)
                elif self.has_loss:
                    self.schedule.step(target=y, losses=losses)
                else:
                    self.schedule.step()
            rec.end()
            local_loss = torch.stack(losses).mean().detach() if losses else None
        if self.par.grad_sync:
            rec.begin("comm", "grad_allreduce")
            self.par.grad_sync()
            rec.end()
        rec.begin("optimizer")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        rec.end()
        mine = float(local_loss) if local_loss is not None and self.has_loss else None
        rec.end_step(loss=mine, mem_peak_bytes=self.peak_memory(), global_tokens=cfg.knobs.global_batch * cfg.model.seq_len)
        seconds = time.perf_counter() - t0
        glob = self._global_loss(local_loss)
        self.losses.append(glob)
        return StepResult(i, glob, seconds, rec.window)

    def _global_loss(self, local_loss: torch.Tensor | None) -> float | None:
        """Mean loss over the global batch: average of the loss-holding ranks' local means."""
        if not dist.is_initialized():
            return float(local_loss) if local_loss is not None else None
        t = torch.zeros(2, dtype=torch.float64, device=self.device)
        if local_loss is not None and self.has_loss:
            t[0], t[1] = float(local_loss), 1.0
        dist.all_reduce(t)
        return float(t[0] / t[1]) if t[1] > 0 else None

    def close(self) -> None:
        """Drop model and optimizer (DDP must be gone before the process group is destroyed)."""
        self.schedule = None
        del self.optimizer
        del self.par
