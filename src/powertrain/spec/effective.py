"""What one run of a configuration applies: knobs that change nothing for its layout, and the
protocol settings that only a sweep applies.

``powertrain run`` refuses both (a setting accepted and then ignored would be a wrong number); the
planner merges runs that differ only in knobs that change nothing and shows those knobs as a warning
(study sweeps cross variants with layouts, where some knobs cannot apply); the sweep runner hands
each run a spec holding only what that run applies (:func:`as_single_run`).
"""

from __future__ import annotations

from typing import Any

from powertrain.spec.run import Protocol, RunConfig

# Applied around the runs by the sweep runner (repeats become runs; the gate waits before a run; the
# baseline is recorded once per sweep), never by the run itself.
SWEEP_PROTOCOL = ("repeats", "cooldown_s", "cooldown_until_temp_c", "idle_baseline_s")


def _resolved_dp(config: RunConfig) -> int:
    # a spec may leave dp to the world size: judging "no data parallelism" on the unresolved None would
    # call DP knobs unused on a DP2 run
    try:
        return config.layout.resolve(config.world).dp or 1
    except ValueError:
        return config.layout.dp or 1


def _reset_unused(config: RunConfig) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``config`` as a JSON dict with the knobs that change nothing for its layout at their defaults,
    and those knobs, each as ``(dotted field, why)``."""
    default = RunConfig(model=config.model)
    d = config.model_dump(mode="json")
    lay, ov = d["layout"], d["knobs"]["overlap"]
    dflt_lay, dflt_ov = default.layout.model_dump(mode="json"), default.knobs.overlap.model_dump(mode="json")
    unused: list[tuple[str, str]] = []

    def reset(section: dict[str, Any], dflt: dict[str, Any], key: str, prefix: str, why: str) -> None:
        if section[key] != dflt[key]:
            unused.append((f"{prefix}{key}", why))
            section[key] = dflt[key]

    dp = _resolved_dp(config)
    if config.layout.tp == 1:
        reset(lay, dflt_lay, "sequence_parallel", "layout.", "TP=1")
        reset(ov, dflt_ov, "async_tp", "knobs.overlap.", "TP=1")
    if config.layout.pp == 1:
        for key in ("pp_schedule", "virtual_stages", "pp_split"):
            reset(lay, dflt_lay, key, "layout.", "PP=1")
    if not config.layout.fsdp:
        for key in ("fsdp_prefetch", "fsdp_reshard_after_forward"):
            reset(ov, dflt_ov, key, "knobs.overlap.", "no FSDP")
    if dp * config.layout.cp == 1:
        for key in ("ddp_bucket_mb", "grad_reduce_in_backward"):
            reset(ov, dflt_ov, key, "knobs.overlap.", "no data parallelism")
        reset(lay, dflt_lay, "distributed_optimizer", "layout.", "no data parallelism")
    elif config.layout.fsdp:
        reset(lay, dflt_lay, "distributed_optimizer", "layout.", "FSDP shards optimizer states already")
    return d, unused


def unused_fields(config: RunConfig) -> list[str]:
    """The dotted fields (``knobs.overlap.fsdp_prefetch``) ``config`` sets that change nothing for its layout."""
    return [f for f, _ in _reset_unused(config)[1]]


def _named(unused: list[tuple[str, str]]) -> list[str]:
    return [f"{f} ({why})" for f, why in unused]


def unused_knobs(config: RunConfig) -> list[str]:
    """The knobs ``config`` sets that change nothing for its layout, each as ``field (why)``."""
    return _named(_reset_unused(config)[1])


def effective_config(config: RunConfig) -> tuple[dict[str, Any], list[str]]:
    """The configuration with knobs that cannot matter for its layout reset to their defaults.

    Returns the normalised dict (no name: two runs that differ only by it are the same run) and the
    names of the knobs that were set but change nothing.
    """
    d, unused = _reset_unused(config)
    d["name"] = None
    return d, _named(unused)


def sweep_protocol(config: RunConfig) -> dict[str, Any]:
    """The protocol settings of ``config`` that only a sweep applies and that differ from their default."""
    default = Protocol()
    return {k: getattr(config.protocol, k) for k in SWEEP_PROTOCOL
            if getattr(config.protocol, k) != getattr(default, k)}


def as_single_run(config: RunConfig) -> RunConfig:
    """``config`` as one run applies it: the sweep-applied protocol settings and the knobs that change
    nothing for the layout at their defaults (what the sweep runner hands ``powertrain run``)."""
    d, _ = _reset_unused(config)
    d["protocol"].update({k: getattr(Protocol(), k) for k in SWEEP_PROTOCOL})
    return RunConfig.model_validate(d)
