"""One small function per parallelism, applied by :func:`powertrain.workload.parallelize.parallelize`."""
