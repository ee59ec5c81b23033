"""Step and phase markers any training loop can call; rows go to ``<run>/events/rank-<r>.parquet``.

::

    from powertrain import hooks

    for i, batch in enumerate(loader):
        with hooks.step(i, tokens=batch.numel(), samples=len(batch)) as s:
            with hooks.phase("forward"):
                loss = model(batch)
            with hooks.phase("backward"):
                loss.backward()
            with hooks.phase("optimizer"):
                opt.step()
            s.loss = loss.item()

or ``hooks.begin_step(i, tokens=…)`` … ``hooks.end_step(loss=…)`` where a ``with`` block does not fit.

The run directory is, in this order: the one of the :class:`powertrain.Monitor` block this process
is in (:func:`bind`), or ``$POWERTRAIN_RUN_DIR`` (set by ``powertrain run`` / ``monitor`` for the
command's processes; a folder that is not a running run is refused, see :func:`env_run_dir`); the
rank comes from ``$RANK``. Without a run directory every call is a cheap
no-op and a single notice says so. Rows follow :data:`powertrain.schema.EVENTS_SCHEMA` (times are
``CLOCK_REALTIME`` ns, the sampler's clock) and are streamed crash-safely: a killed rank keeps
everything up to about one second before the kill (``$POWERTRAIN_EVENTS_FLUSH_S`` seconds, or a
``Monitor``'s ``flush_s``). Values are checked when given: ``tokens`` / ``samples`` /
``mem_peak_bytes`` are whole numbers >= 0 or ``None``, ``loss`` a number (``loss.item()``), and a
bad one raises ``ValueError`` naming it on the line that gave it.

``window`` (``warmup`` / ``measured`` / null) marks the measurement protocol's windows; metrics use
measured steps. Set it with :func:`set_window` or a ``with hooks.window("warmup"):`` block. Inside a
``Monitor`` block, steps not under an explicit window are marked automatically: the first
``warmup_steps`` steps ``warmup``, the rest ``measured``. Under ``$POWERTRAIN_RUN_DIR`` unmarked
steps stay null and the analysis counts them as measured when *no* step of the run carries a window
(see :func:`powertrain.analyze.steps.measured_steps`); once any step carries one, unmarked steps are
outside the protocol, so a loop there marks both its warm-up and its measured steps, or neither.
"""

from powertrain.hooks.markers import (
    FLUSH_ENV,
    RUN_DIR_ENV,
    Binding,
    begin_step,
    bind,
    check_rank,
    close,
    configure,
    end_step,
    env_flush_s,
    env_rank,
    env_run_dir,
    get,
    phase,
    set_window,
    step,
    sync_device_in_use,
    unbind,
    window,
)
from powertrain.hooks.recorder import WINDOWS, Recorder, StepHandle, check_flush_s, check_warmup_steps

__all__ = ["FLUSH_ENV", "RUN_DIR_ENV", "WINDOWS", "Binding", "Recorder", "StepHandle", "begin_step", "bind",
           "check_flush_s", "check_rank", "check_warmup_steps", "close", "configure", "end_step", "env_flush_s", "env_rank", "env_run_dir",
           "get", "phase", "set_window", "step", "sync_device_in_use", "unbind", "window"]
