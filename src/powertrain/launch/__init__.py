"""Launching runs: one configuration on this node (:mod:`.local`), or a sweep of them (:mod:`.sweep`);
:mod:`.gpu_check` drives a whole monitored run to check the NVIDIA telemetry path on a real GPU.

Nothing is imported here: ``python -m powertrain.launch.gpu_check`` must start on a GPU machine that
has only torch, numpy, pyarrow and nvidia-ml-py (``scripts/gpu_check.sh``), without the run
configuration's dependencies that :mod:`.local` pulls in (pydantic, PyYAML).
"""
