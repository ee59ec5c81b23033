"""The study's experiment matrices (DESIGN.md), built directly as RunConfigs, and their prediction.

32×H200 (4 nodes × 8) and 64×H100 (8 × 8); global batch 128, bf16; each layout in four variants
(base, overlap, full recompute, both) and micro-batch 1, 2, 4, 8 where the batch divides.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from powertrain.predict.calibration import Calibration, load_calibration
from powertrain.predict.case import case_from_run_config
from powertrain.predict.core import Prediction, predict
from powertrain.spec.layout import Layout
from powertrain.spec.model import get_model
from powertrain.spec.run import Hardware, Knobs, Overlap, Recompute, RunConfig

CLUSTERS = {"32xH200": Hardware(nodes=4, devices_per_node=8, device="h200"),
            "64xH100": Hardware(nodes=8, devices_per_node=8, device="h100-sxm")}

# (model, layout kwargs) per cluster, as listed in DESIGN.md
LAYOUTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "32xH200": (
        [("gpt3-175b", {"tp": t, "pp": p}) for t, p in ((2, 16), (4, 8), (8, 4), (1, 32))]
        + [("llama3-70b", {"tp": t, "pp": p}) for t, p in ((8, 2), (4, 4), (2, 8), (1, 16))]
        + [("mixtral-8x22b", {"tp": t, "pp": p, "ep": 8}) for t, p in ((1, 4), (2, 2), (4, 1))]
        + [("mixtral-8x7b", {"tp": 1, "ep": 8}), ("mixtral-8x7b", {"tp": 2, "ep": 4})]
        + [("gpt3-175b", {"tp": 8, "fsdp": True}), ("llama3-70b", {"tp": 8, "fsdp": True})]
    ),
    "64xH100": (
        [("gpt3-175b", {"tp": t, "pp": p}) for t, p in ((2, 32), (4, 16), (8, 8))]
        + [("llama3-70b", {"tp": t, "pp": p}) for t, p in ((8, 4), (4, 8), (2, 16), (1, 32))]
        + [("mixtral-8x22b", {"tp": t, "pp": p, "ep": 8}) for t, p in ((8, 1), (4, 2), (2, 4), (1, 8))]
        + [("mixtral-8x7b", {"tp": t, "pp": p, "ep": e}) for t, p, e in ((1, 2, 8), (4, 1, 4), (2, 2, 4), (1, 4, 4))]
    ),
}

VARIANTS: dict[str, tuple[Overlap, Recompute]] = {
    "base": (Overlap(async_tp=False, grad_reduce_in_backward=False, fsdp_prefetch=False), "none"),
    "overlap": (Overlap(async_tp=True, grad_reduce_in_backward=True, fsdp_prefetch=True), "none"),
    "recompute": (Overlap(async_tp=False, grad_reduce_in_backward=False, fsdp_prefetch=False), "full"),
    "both": (Overlap(async_tp=True, grad_reduce_in_backward=True, fsdp_prefetch=True), "full"),
}
MICRO_BATCHES = (1, 2, 4, 8)
GLOBAL_BATCH = 128


def study_configs(cluster: str | None = None) -> Iterator[RunConfig]:
    """Every configuration of the study's matrices (optionally one cluster's)."""
    for name, hw in CLUSTERS.items():
        if cluster and cluster != name:
            continue
        for model, lay in LAYOUTS[name]:
            layout = Layout(sequence_parallel=int(lay.get("tp", 1)) > 1, distributed_optimizer=not lay.get("fsdp"),
                            **lay).resolve(hw.world)
            dp = hw.world // (layout.tp * layout.pp * layout.cp)
            for variant, (overlap, recompute) in VARIANTS.items():
                for mb in MICRO_BATCHES:
                    if GLOBAL_BATCH % (mb * dp):
                        continue
                    knobs = Knobs(micro_batch=mb, global_batch=GLOBAL_BATCH, recompute=recompute, overlap=overlap,
                                  precision="bf16")
                    yield RunConfig(name=f"{name}/{model}/{layout.label()}/{variant}/mb{mb}", model=get_model(model),
                                    layout=layout, knobs=knobs, hardware=hw)


@dataclass
class StudyPoint:
    cluster: str
    model: str
    label: str
    config: RunConfig
    prediction: Prediction


def predict_study(calibration: Calibration | str | None = None, cluster: str | None = None) -> list[StudyPoint]:
    """Predict the whole matrix (both clusters unless ``cluster`` is given)."""
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    out = []
    for cfg in study_configs(cluster):
        cl, model, _ = cfg.name.split("/", 2)
        out.append(StudyPoint(cl, model, cfg.name.split("/", 2)[2], cfg, predict(case_from_run_config(cfg), cal)))
    return out
