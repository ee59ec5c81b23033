"""``knobs.overlap.async_tp``: PyTorch's asynchronous tensor parallelism (micro-pipelined TP).

Where PyTorch offers it — CUDA, a process group with symmetric memory, and the compiler's
micro-pipeline TP pass (``torch._inductor.config._micro_pipeline_tp``) — the TP group gets symmetric
memory and every transformer block is compiled, so Inductor splits each all-gather → matmul and
matmul → reduce-scatter pair into overlapped pieces (as torchtitan's ``enable_async_tensor_parallel``
does). It needs tensor parallelism with sequence parallelism to find those pairs.

Anywhere else it is refused, never silently skipped: the spec rule ``async_tp_needs_cuda`` refuses
it for non-NVIDIA devices at ``plan``/``run --check``, the launcher refuses it on a CPU stand-in, and
:func:`async_tp_unavailable` names what this process lacks (the trainer raises with it).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from powertrain.workload.models.layers import Transformer


def async_tp_unavailable(device_type: str) -> str | None:
    """Why async TP cannot run in this process (one line), or None when it can."""
    if device_type != "cuda":
        return f"async TP needs CUDA (symmetric memory); this rank runs on {device_type}"
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group  # noqa: F401
    except ImportError:
        return f"async TP needs torch.distributed._symmetric_memory, which PyTorch {torch.__version__} lacks"
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config, "_micro_pipeline_tp"):
        return f"async TP needs Inductor's micro-pipeline TP pass, which PyTorch {torch.__version__} lacks"
    return None


def apply_async_tp(model: Transformer, tp_mesh: DeviceMesh) -> list[str]:
    """Enable symmetric memory on the TP group, turn on the micro-pipeline TP pass and compile every
    block (after TP and recomputation, before data parallelism). Returns notes for run.json."""
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    inductor_config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    for name, block in list(model.layers.items()):
        model.layers[name] = cast(nn.Module, torch.compile(block, fullgraph=True))
    return [f"async TP applied: symmetric memory on the TP group, {len(model.layers)} blocks compiled "
            "with the micro-pipeline TP pass"]
