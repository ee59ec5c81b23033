"""Hugging Face ``transformers.Trainer`` callback (``pip install powertrain[hf]``).

::

    from powertrain.integrations.hf import PowertrainCallback

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[PowertrainCallback("runs/ft1", seq_len=512)])
    trainer.train()

Works the same under ``torchrun`` (each rank writes ``events/rank-<r>.parquet``; rank 0 owns the run
and the first rank of each node runs that node's sampler) and under ``powertrain monitor`` (the run
is the monitor's). Per optimizer step it records one ``step`` event: its interval (from the start of
the step's first micro-batch to after the optimizer step), ``samples`` = this rank's
``per_device_train_batch_size × gradient_accumulation_steps``, ``tokens`` = samples × ``seq_len``
when given (the Trainer does not show callbacks the batches), and ``loss`` = the Trainer's logged
loss when a log falls on that step (a mean over ``logging_steps``; set ``logging_steps=1`` for
per-step loss; ``attrs.loss_over_steps`` says which).
"""

from __future__ import annotations

import os
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("powertrain.integrations.hf needs transformers: pip install 'powertrain[hf]'") from exc

from powertrain.integrations.attach import RankAttachment, device_sync
from powertrain.telemetry.clock import DEFAULT_RATE_HZ


def _torch_dist() -> tuple[Any, Any]:
    """(barrier, broadcast) of an initialised torch.distributed group, else (None, None)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None, None

    def broadcast(obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    return dist.barrier, broadcast


class PowertrainCallback(TrainerCallback):
    """Marks every optimizer step of a ``transformers.Trainer`` run and attaches it to the sampler.

    Args:
        out: run directory (``None``: ``runs/hf-<time>``; under ``powertrain monitor``: the monitor's).
        seq_len: tokens per sample, to fill ``tokens``.
        warmup_steps: leading steps marked ``warmup`` (left out of the metrics).
        rate_hz, backends, prometheus: sampler settings when the callback starts the sampler
            (``prometheus="[HOST:]PORT"`` serves live readings, see ``docs/user-guide.md``).
        name: a label for ``run.json``.

    Under ``powertrain monitor`` / ``powertrain run`` the run is that command's: ``out``, ``rate_hz``,
    ``backends``, ``name`` and ``prometheus`` are ignored (one warning names those given; set them on
    the command).
    """

    def __init__(self, out: str | os.PathLike[str] | None = None, *, seq_len: int | None = None,
                 warmup_steps: int = 1, rate_hz: float = DEFAULT_RATE_HZ, backends: str | list[str] = "auto",
                 name: str | None = None, prometheus: str | None = None) -> None:
        self.attachment = RankAttachment(out, warmup_steps=warmup_steps, rate_hz=rate_hz, backends=backends,
                                         name=name, prefix="hf", sync=device_sync(),
                                         prometheus=prometheus, caller="PowertrainCallback")
        self.seq_len = seq_len
        self._t0: int | None = None
        self._pending: dict[str, Any] | None = None

    @property
    def run_dir(self) -> Any:
        return self.attachment.run_dir

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        barrier, broadcast = _torch_dist()
        self.attachment.start(rank=args.process_index, local_rank=args.local_process_index,
                              world_size=args.world_size, barrier=barrier, broadcast=broadcast)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._write_pending()
        self._t0 = self.attachment.now()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._t0 is None:
            return
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self._pending = {"step": state.global_step, "t0": self._t0, "t1": self.attachment.now(),
                         "samples": samples, "tokens": samples * self.seq_len if self.seq_len else None,
                         "loss": None, "attrs": {"source": "transformers.Trainer"}}
        self._t0 = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        p = self._pending
        if p is not None and logs and "loss" in logs and state.global_step == p["step"]:
            p["loss"] = float(logs["loss"])
            p["attrs"]["loss_over_steps"] = args.logging_steps
        self._write_pending()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._write_pending()
        self.attachment.stop("ok")

    def _write_pending(self) -> None:
        p, self._pending = self._pending, None
        if p is not None:
            self.attachment.record_step(p["step"], p["t0"], p["t1"], samples=p["samples"], tokens=p["tokens"],
                                        loss=p["loss"], attrs=p["attrs"])


__all__ = ["PowertrainCallback"]
