"""The decoder families of the study, one readable module each, built from a ModelConfig."""

from __future__ import annotations

from powertrain.workload.models.build import build_model
from powertrain.workload.models.layers import Transformer

__all__ = ["Transformer", "build_model"]
