"""Per-node telemetry: backends (host, NVIDIA, AMD) behind one interface, and the sampler process."""
