"""Live views of a running job: step events parsed from an engine's printed log lines
(:mod:`powertrain.live.parse`) and a Prometheus endpoint of the per-node sampler
(:mod:`powertrain.live.prometheus`)."""

from powertrain.live.parse import LiveStepParser
from powertrain.live.prometheus import PrometheusExporter, metric_name, parse_listen

__all__ = ["LiveStepParser", "PrometheusExporter", "metric_name", "parse_listen"]
