"""One entry point from a model's sizes to a freshly initialised module of its family."""

from __future__ import annotations

from powertrain.spec.model import ModelConfig
from powertrain.workload.models import gpt, llama, mixtral
from powertrain.workload.models.layers import Transformer


def build_model(cfg: ModelConfig, *, moe_aux_coeff: float = 0.01) -> Transformer:
    """A freshly initialised model of ``cfg``'s family (on CPU; seed torch first for determinism)."""
    if cfg.family == "gpt":
        return gpt.build(cfg)
    if cfg.family == "llama":
        return llama.build(cfg)
    return mixtral.build(cfg, aux_coeff=moe_aux_coeff)
