"""Every layout reproduces a single-process run of the same model and batches (loss curve ≤ 1e-4).

Many layouts run inside ONE torchrun launch per world size (the driver
``powertrain.workload.equivalence``), because a launch costs 5–16 s here. The reference curves come
from this pytest process (no process group, micro-batch 1, no recomputation). Cases marked
``skip_grad_sync`` drop the data-parallel gradient averaging on purpose and must FAIL the check:
that proves the check can see a broken sync.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import torch

from powertrain.spec.run import RunConfig
from powertrain.workload.equivalence import max_rel_diff, reference_config, reference_losses

TOL = 1e-4
STEPS = 5
LLAMA = {"name": "llama-test", "family": "llama", "layers": 4, "hidden": 32, "ffn": 64, "heads": 4,
         "kv_heads": 2, "vocab": 128, "seq_len": 16}
GPT = {**LLAMA, "name": "gpt-test", "family": "gpt", "kv_heads": 4}
MIXTRAL = {**LLAMA, "name": "mixtral-test", "family": "mixtral", "experts": 4, "top_k": 2}


def case(name: str, world: int, layout: dict, model: dict = LLAMA, micro: int = 1, skip: bool = False, **knobs):
    cfg = {"model": model, "layout": layout, "hardware": {"devices_per_node": world},
           "knobs": {"global_batch": 8, "micro_batch": micro, "lr": 3e-3, **knobs}}
    return {"name": name, "config": cfg, "steps": STEPS, "skip_grad_sync": skip}


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
    ],
    4: [
        case("fsdp_x_tp_selective", 4, {"tp": 2, "fsdp": True}, micro=4, recompute="selective"),
        case("tp_x_pp", 4, {"tp": 2, "pp": 2}, GPT, micro=4),
        case("dp_x_ep", 4, {"ep": 2}, MIXTRAL, micro=2),
        case("dp_x_pp", 4, {"pp": 2}, micro=2),
        case("dp_x_pp_broken_sync", 4, {"pp": 2}, micro=2, skip=True),
        case("fsdp_x_pp", 4, {"pp": 2, "fsdp": True}, micro=2),
        case("dp_x_ep_x_tp", 4, {"tp": 2, "ep": 2, "sequence_parallel": True}, MIXTRAL, micro=4),
    ],
}


# The 2-rank launch also carries test_knob_walk's trainer-knob cases (names prefixed ``knob.``): one
# torchrun fewer, seconds of start-up on a busy 2-core host.
KNOB_PREFIX = "knob."


def launch(world: int, folder: Path) -> dict[str, list[float]]:
    cases, out = folder / "cases.json", folder / "losses.json"
    todo = list(CASES[world])
    if world == 2:
        from test_knob_walk import CASES as KNOB_CASES

        todo += [{**c, "name": KNOB_PREFIX + c["name"]} for c in KNOB_CASES]
    cases.write_text(json.dumps(todo))
    cmd = [sys.executable, "-m", "powertrain.launch.torchrun", "--standalone", f"--nproc_per_node={world}",
           "-m", "powertrain.workload.equivalence", str(cases), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def world2(build_once):
    return build_once("layouts-world2", lambda folder: launch(2, folder))


@pytest.fixture(scope="module")
def world4(build_once):
    return build_once("layouts-world4", lambda folder: launch(4, folder))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tiny ops on a shared 2-core machine: one intra-op thread avoids spinning threads fighting.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@cache
def reference(ref_json: str) -> tuple[float, ...]:
    return tuple(reference_losses(RunConfig.model_validate_json(ref_json), STEPS))


def check(c: dict, losses: dict[str, list[float]]) -> None:
    got = losses[c["name"]]
    # One single-process curve per model and batch stream (micro-batch 1, no recompute, no layout).
    ref = list(reference(reference_config(RunConfig.model_validate(c["config"])).model_dump_json()))
    diff = max_rel_diff(got, ref)
    assert len(got) == STEPS
    if c["skip_grad_sync"]:
        assert diff > TOL, f"{c['name']}: a broken gradient sync went unnoticed ({got} vs {ref})"
    else:
        assert diff <= TOL, f"{c['name']}: losses {got} differ from single-process {ref} by {diff:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("c", CASES[2], ids=[c["name"] for c in CASES[2]])
def test_two_ranks_match_single_process(c, world2):
    check(c, world2)


@pytest.mark.slow
@pytest.mark.parametrize("c", CASES[4], ids=[c["name"] for c in CASES[4]])
def test_four_ranks_match_single_process(c, world4):
    check(c, world4)
