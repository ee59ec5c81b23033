"""Lightning ``Trainer`` callback (``pip install powertrain[lightning]``).

::

    from powertrain.integrations.lightning import PowertrainCallback

    trainer = L.Trainer(max_steps=100, callbacks=[PowertrainCallback("runs/pl1")])

Works under ``torchrun`` / ``srun`` with any number of ranks (each rank writes
``events/rank-<r>.parquet``; global rank 0 owns the run and local rank 0 of each node runs that
node's sampler) and under ``powertrain monitor``. One ``step`` event per optimizer step (all
micro-batches of a gradient-accumulation cycle), with ``samples`` = the batch's first dimension,
``tokens`` = the element count of an integer 2-D batch (token ids: a tensor, the first tensor of a
tuple, or ``batch["input_ids"]``), and ``loss`` = ``training_step``'s returned loss of the cycle's
last micro-batch.
"""

from __future__ import annotations

import os
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("powertrain.integrations.lightning needs lightning: pip install 'powertrain[lightning]'") from exc

from powertrain.integrations.attach import RankAttachment, device_sync
from powertrain.telemetry.clock import DEFAULT_RATE_HZ


def batch_counts(batch: Any) -> tuple[int | None, int | None]:
    """(samples, tokens) of one batch, ``None`` where the batch does not show them."""
    import torch

    t = batch
    if isinstance(batch, dict):
        t = batch.get("input_ids", next((v for v in batch.values() if isinstance(v, torch.Tensor)), None))
    elif isinstance(batch, (list, tuple)) and batch:
        t = batch[0]
    if not isinstance(t, torch.Tensor) or t.ndim == 0:
        return None, None
    tokens = t.numel() if t.ndim == 2 and not t.is_floating_point() else None
    return int(t.shape[0]), tokens


def _loss(outputs: Any) -> float | None:
    import torch

    v = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.detach())
    return None


class PowertrainCallback(pl.Callback):
    """Marks every optimizer step of a Lightning run and attaches it to the per-node sampler.

    Args:
        out: run directory (``None``: ``runs/lightning-<time>``; under ``powertrain monitor``: the
            monitor's).
        warmup_steps: leading steps marked ``warmup`` (left out of the metrics).
        rate_hz, backends, prometheus: sampler settings when the callback starts the sampler
            (``prometheus="[HOST:]PORT"`` serves live readings, see ``docs/user-guide.md``).
        name: a label for ``run.json``.

    Under ``powertrain monitor`` / ``powertrain run`` the run is that command's: ``out``, ``rate_hz``,
    ``backends``, ``name`` and ``prometheus`` are ignored (one warning names those given; set them on
    the command).
    """

    def __init__(self, out: str | os.PathLike[str] | None = None, *, warmup_steps: int = 1,
                 rate_hz: float = DEFAULT_RATE_HZ, backends: str | list[str] = "auto",
                 name: str | None = None, prometheus: str | None = None) -> None:
        self.attachment = RankAttachment(out, warmup_steps=warmup_steps, rate_hz=rate_hz, backends=backends,
                                         name=name, prefix="lightning", sync=device_sync(),
                                         prometheus=prometheus, caller="PowertrainCallback")
        self._handle: Any = None

    @property
    def run_dir(self) -> Any:
        return self.attachment.run_dir

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.attachment.start(rank=trainer.global_rank, local_rank=trainer.local_rank,
                              world_size=trainer.world_size, barrier=trainer.strategy.barrier,
                              broadcast=trainer.strategy.broadcast)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        samples, tokens = batch_counts(batch)
        if batch_idx % trainer.accumulate_grad_batches == 0 or self._handle is None:
            self._handle = self.attachment.begin_step(trainer.global_step + 1, samples=samples, tokens=tokens)
        elif self._handle is not None:
            self._handle.samples = (self._handle.samples or 0) + samples if samples else None
            self._handle.tokens = (self._handle.tokens or 0) + tokens if tokens else None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        last = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or trainer.is_last_batch
        if last and self._handle is not None:
            self.attachment.end_step(loss=_loss(outputs), source="lightning")
            self._handle = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.attachment.stop("ok")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.attachment.stop("failed", f"{type(exception).__name__}: {exception}")


__all__ = ["PowertrainCallback", "batch_counts"]
