"""The multi-rank equivalence launches the layout and knob tests share: one torchrun per world size.

A launch costs 5-16 s of start-up on a busy 2-core host, so every case of a world size rides in one
(``powertrain.workload.equivalence`` runs them in turn): the layouts' cases (``test_workload_layouts``:
each must reproduce a single-process run) and, in the 2-rank launch, the trainer-knob cases
(``test_knob_walk``: what the ranks build; names prefixed :data:`KNOB_PREFIX`). The fixtures
``world2`` / ``world4`` (conftest.py) run each launch once per test session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TINY = {"family": "llama", "layers": 2, "hidden": 32, "ffn": 64, "heads": 4, "kv_heads": 2, "vocab": 128, "seq_len": 16}
CPU2 = {"hardware": {"devices_per_node": 2}}

TOL = 1e-4
STEPS = 5
LLAMA = {"name": "llama-test", "family": "llama", "layers": 4, "hidden": 32, "ffn": 64, "heads": 4,
         "kv_heads": 2, "vocab": 128, "seq_len": 16}
GPT = {**LLAMA, "name": "gpt-test", "family": "gpt", "kv_heads": 4}
MIXTRAL = {**LLAMA, "name": "mixtral-test", "family": "mixtral", "experts": 4, "top_k": 2}


# LoRA (task: kind lora): rank 4 adapters on every linear layer of a block (GPT's MLP has no gate), or on the
# attention projections only (the task's default targets: all an MoE block takes in this trainer)
LORA_ALL = {"kind": "lora", "rank": 4, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj"]}
LORA_GELU = {**LORA_ALL, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]}
LORA_ATTN = {"kind": "lora", "rank": 4}


def case(name: str, world: int, layout: dict, model: dict = LLAMA, micro: int = 1, skip: bool = False,
         task: dict | None = None, **knobs):
    cfg = {"model": model, "layout": layout, "hardware": {"devices_per_node": world},
           "knobs": {"global_batch": 8, "micro_batch": micro, "lr": 3e-3, **knobs}, **({"task": task} if task else {})}
    # a LoRA case also reports what its ranks train (test_workload_layouts: the adapters alone)
    return {"name": name, "config": cfg, "steps": STEPS, "skip_grad_sync": skip, "facts": task is not None}


CASES = {
    2: [
        case("ddp", 2, {}),
        case("ddp_broken_sync", 2, {}, skip=True),
        case("ddp_full_recompute_mbs2", 2, {}, micro=2, recompute="full"),
        case("fsdp", 2, {"fsdp": True}, micro=2),
        case("tp_full_recompute", 2, {"tp": 2}, micro=8, recompute="full"),
        case("tp_sp_gpt", 2, {"tp": 2, "sequence_parallel": True}, GPT, micro=8),
        case("pp_gpipe", 2, {"pp": 2, "pp_schedule": "gpipe"}, micro=2),
        case("pp_1f1b_uneven", 2, {"pp": 2, "pp_split": [1, 3]}, micro=2),
        case("pp_1f1b_study_uneven_selective", 2, {"pp": 2, "pp_split": "study_uneven"}, micro=2,
             recompute="selective"),
        case("pp_interleaved", 2, {"pp": 2, "pp_schedule": "interleaved_1f1b", "virtual_stages": 2}, GPT, micro=2),
        case("ep", 2, {"ep": 2}, MIXTRAL, micro=2),
        case("moe_tp_sp", 2, {"tp": 2, "sequence_parallel": True}, MIXTRAL, micro=8),
        case("lora_ddp_distopt", 2, {"distributed_optimizer": True}, task=LORA_ALL),
        case("lora_ddp_broken_sync", 2, {}, skip=True, task=LORA_ALL),
        case("lora_fsdp", 2, {"fsdp": True}, micro=2, task=LORA_ALL),
        case("lora_tp_sp_full_recompute", 2, {"tp": 2, "sequence_parallel": True}, micro=8, recompute="full",
             task=LORA_ALL),
        case("lora_tp_gpt", 2, {"tp": 2}, GPT, micro=8, task=LORA_GELU),
        case("lora_pp_1f1b_selective", 2, {"pp": 2}, micro=2, recompute="selective", task=LORA_ALL),
        case("lora_pp_interleaved_gpt", 2, {"pp": 2, "pp_schedule": "interleaved_1f1b", "virtual_stages": 2}, GPT,
             micro=2, task=LORA_GELU),
        case("lora_ep", 2, {"ep": 2}, MIXTRAL, micro=2, task=LORA_ATTN),
    ],
    4: [
        case("fsdp_x_tp_selective", 4, {"tp": 2, "fsdp": True}, micro=4, recompute="selective"),
        case("tp_x_pp", 4, {"tp": 2, "pp": 2}, GPT, micro=4),
        case("dp_x_ep", 4, {"ep": 2}, MIXTRAL, micro=2),
        case("dp_x_pp", 4, {"pp": 2}, micro=2),
        case("dp_x_pp_broken_sync", 4, {"pp": 2}, micro=2, skip=True),
        case("fsdp_x_pp", 4, {"pp": 2, "fsdp": True}, micro=2),
        case("dp_x_ep_x_tp", 4, {"tp": 2, "ep": 2, "sequence_parallel": True}, MIXTRAL, micro=4),
        case("lora_fsdp_x_tp_selective", 4, {"tp": 2, "fsdp": True}, micro=4, recompute="selective", task=LORA_ATTN),
        case("lora_dp_x_ep_x_tp", 4, {"tp": 2, "ep": 2, "sequence_parallel": True}, MIXTRAL, micro=4, task=LORA_ATTN),
    ],
}


# The 2-rank launch also carries test_knob_walk's trainer-knob cases (names prefixed ``knob.``): one
# torchrun fewer, seconds of start-up on a busy 2-core host.
KNOB_PREFIX = "knob."


def launch(world: int, folder: Path) -> dict[str, list[float]]:
    cases, out = folder / "cases.json", folder / "losses.json"
    todo = list(CASES[world])
    if world == 2:
        todo += [{**c, "name": KNOB_PREFIX + c["name"]} for c in KNOB_CASES]
    cases.write_text(json.dumps(todo))
    cmd = [sys.executable, "-m", "powertrain.launch.torchrun", "--standalone", f"--nproc_per_node={world}",
           "-m", "powertrain.workload.equivalence", str(cases), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return json.loads(out.read_text())


# -- the trainer knobs (test_knob_walk), measured inside the 2-rank launch ---------------------------
def knob_case(name: str, layout: dict | None = None, model: dict | None = None, **knobs: Any) -> dict:
    return {"name": name, "steps": 4, "facts": True,
            "config": {"model": model or {**TINY, "layers": 4}, "layout": layout or {}, **CPU2,
                       "knobs": {"global_batch": 8, "micro_batch": 2, "lr": 3e-3, **knobs}}}


MOE = {**TINY, "layers": 4, "family": "mixtral", "experts": 4, "top_k": 2}
KNOB_CASES = [
    knob_case("ddp"),
    knob_case("ddp_bucket_1mb", overlap={"ddp_bucket_mb": 1.0}),
    knob_case("allreduce", overlap={"grad_reduce_in_backward": False}),
    knob_case("ddp_distopt", {"distributed_optimizer": True}),
    knob_case("allreduce_distopt", {"distributed_optimizer": True}, overlap={"grad_reduce_in_backward": False}),
    knob_case("ep_distopt", {"ep": 2, "distributed_optimizer": True}, MOE),
    knob_case("fsdp", {"fsdp": True}),
    knob_case("fsdp_no_reshard_no_prefetch", {"fsdp": True},
          overlap={"fsdp_reshard_after_forward": False, "fsdp_prefetch": False}),
]
