"""Trainer callbacks: powertrain inside Hugging Face ``Trainer`` and Lightning ``Trainer`` runs.

* :class:`powertrain.integrations.hf.PowertrainCallback` (``pip install powertrain[hf]``)
* :class:`powertrain.integrations.lightning.PowertrainCallback` (``pip install powertrain[lightning]``)

Both use :class:`RankAttachment`, which does what every rank of a job needs:

* **under** ``powertrain monitor`` / ``powertrain run`` (``$POWERTRAIN_RUN_DIR`` is set) it only
  writes this rank's step events into that run: the node's sampler is already there, so ``out``,
  ``rate_hz``, ``backends``, ``name`` and ``prometheus`` are ignored (one warning names those given);
  a ``$POWERTRAIN_RUN_DIR`` that is not a running run is refused;
* **otherwise** global rank 0 creates the run directory and starts its node's sampler
  (:class:`powertrain.Monitor`), the first rank of every other node (local rank 0) starts only its
  node's sampler (:meth:`powertrain.Monitor.attach`), and every rank writes
  ``events/rank-<r>.parquet``. One run directory, one sampler per node, whatever the number of
  ranks (``torchrun``, ``srun``). Several nodes need ``out`` on a filesystem they all share.

The first ``warmup_steps`` steps are marked ``warmup`` (left out of the metrics), the rest
``measured``.
"""

from powertrain.integrations.attach import RankAttachment, default_out, device_sync

__all__ = ["RankAttachment", "default_out", "device_sync"]
