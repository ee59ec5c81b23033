"""Model FLOPs of a training step and the peak FLOP/s they are measured against (MFU, HFU).

**Model FLOPs per token** (training: forward + backward = 3 × forward), following the PaLM
appendix convention used by Megatron/torchtitan MFU:

    6 · (N_layers_active + hidden · vocab) + 12 · layers · hidden · seq_len

where ``N_layers_active`` counts the weights a token touches in the transformer blocks — attention
``2·h² + 2·h·kv_heads·head_dim`` and the MLP (GELU: ``2·h·ffn``; SwiGLU: ``3·h·ffn``; MoE:
``top_k · 3·h·ffn + h·experts`` for the router) — the LM head adds ``h · vocab`` and the attention
score/value products add ``12 · L · h · s`` (full, not causal-halved, as in PaLM). Embedding lookups
are not FLOPs. **Hardware FLOPs** add what recomputation repeats: ``full`` one more forward of the
blocks (``2·N_layers_active + 4·L·h·s`` per token), ``selective`` the attention core only
(``4·L·h·s``).

A LoRA run (``task: {kind: lora}`` in run.json's config) counts what its step does: the frozen
weights' GEMMs forward and activation gradients only (``2 ×`` forward), the attention core ``3 ×``,
the adapters' GEMMs ``3 ×`` (:mod:`powertrain.core.flops` states it in full).

Model and hardware FLOPs come from :mod:`powertrain.core.flops`, the one definition the predictor
uses too; ``flops_source`` in a summary names it.

**Peak FLOP/s per device** comes from the hardware catalog (``powertrain.hardware``) for the run's
device type and precision. For CPUs there is no honest data-sheet number for "this container's
share of a host", so it is *measured*: the host probe (fp32 1024×1024 matmuls, best of several,
pinned to the ranks' thread count) that the launcher recorded in ``run.json["host_probe"]`` before
the ranks started, shared among the ranks of the host as :func:`powertrain.hardware.cpu_device`
does, and labelled ``"measured peak (...)"``. An older run without a record gets a fresh probe of
the analysing host, labelled so.
"""

from __future__ import annotations

from typing import Any

from powertrain.core import flops
from powertrain.spec.model import get_model
from powertrain.spec.run import Task


def _shape(model: Any, task: Any) -> flops.Shape:
    """The model's shape with the LoRA adapters of the run's ``task`` section (a dict as in run.json), if any."""
    lora = Task.model_validate(task).lora() if task else None
    return flops.shape_of(get_model(model), lora=lora)


def model_flops_per_token(model: Any, task: Any = None) -> tuple[float, str]:
    """(training FLOPs per token, source) for a model name, dict or ModelConfig, and the run's ``task``."""
    return float(flops.model_flops_per_token(_shape(model, task))), "powertrain.core.flops.model_flops_per_token"


def hardware_flops_per_token(model: Any, recompute: str, task: Any = None) -> float:
    """Training FLOPs per token including what recomputation repeats."""
    return float(flops.hardware_flops_per_token(_shape(model, task), recompute))


def cpu_probe_peak_flops(threads: int | None = None) -> float:
    """fp32 matmul FLOP/s of this host with ``threads`` threads (default: a lone rank's), from its kept probe."""
    from powertrain.hardware import probe_host, rank_threads

    return probe_host(threads or rank_threads(1)).matmul_flops


def peak_flops_per_device(device: str | None, precision: str, ranks_per_host: int = 1,
                          host_probe: dict[str, Any] | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s of one device, where the number comes from) — ``None`` with the reason if unknown.

    CPU: one rank's share of the host probe the run recorded (``run.json["host_probe"]``), so the
    MFU of a measured run is the same on every re-analysis; a run that recorded none gets a fresh
    probe of the analysing host, labelled so (it differs from call to call on a busy host).
    """
    if not device:
        return None, "the run's configuration names no device type"
    import powertrain.hardware as hw  # the hardware catalog (one source of truth)

    if hw.is_cpu_name(device):
        share = max(ranks_per_host, 1)
        if host_probe is not None:
            try:
                probe = hw.HostProbe.from_dict(host_probe, "run.json host_probe")
            except ValueError as exc:
                return None, f"{exc}; re-run to record a complete one"
            where = "host probe recorded in run.json"
        else:
            probe = hw.probe_host(hw.rank_threads(share))
            where = f"{probe.source}; the run recorded none"
        peak = hw.cpu_device(probe, share).peak(precision)
        return peak, (f"measured peak ({where}): fp32 matmul {probe.matmul_flops / 1e9:.1f} GFLOP/s with "
                      f"{probe.threads} thread(s) per rank, {share} rank(s) on {probe.cores} cores")
    try:
        spec = hw.get_device(device)
        return float(spec.peak(precision)), f"hardware catalog: {spec.name} {precision} dense peak"
    except KeyError as exc:
        return None, f"hardware catalog: {exc.args[0] if exc.args else exc}"


def peak_link_bw(device: str | None) -> float | None:
    """Peak intra-node link bandwidth (bytes/s per device per direction) from the hardware catalog."""
    if not device or device.lower() == "cpu":
        return None
    try:
        import powertrain.hardware as hw

        return float(hw.get_device(device).node.intra_node_bw)
    except (ImportError, KeyError, AttributeError):
        return None
