"""Every layout reproduces a single-process run of the same model and batches (loss curve ≤ 1e-4).

Many layouts run inside ONE torchrun launch per world size (the driver
``powertrain.workload.equivalence``), because a launch costs 5–16 s here. The reference curves come
from this pytest process (no process group, micro-batch 1, no recomputation). Cases marked
``skip_grad_sync`` drop the data-parallel gradient averaging on purpose and must FAIL the check:
that proves the check can see a broken sync.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch

from equivalence_cases import CASES, STEPS, TOL
from powertrain.spec.run import RunConfig
from powertrain.workload.equivalence import max_rel_diff, reference_config, reference_losses


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


@pytest.mark.slow
def test_lora_ranks_keep_optimizer_state_for_their_adapters_alone(world2, world4):
    """Every LoRA layout's rank updates, and keeps AdamW state for, exactly its share of the adapters
    the predictor counts (core.lora), and nothing of the frozen base: a parallelism that re-created a
    frozen weight as trainable (torch's SequenceParallel does, for the norms) or split an adapter
    wrongly shows here, even where Adam's scale-free first steps would hide it in the losses."""
    from powertrain.core.flops import shape_of
    from powertrain.core.lora import adapter_parameters

    checked = 0
    for world, losses in ((2, world2), (4, world4)):
        for c in CASES[world]:
            cfg = RunConfig.model_validate(c["config"])
            if not cfg.task.is_lora or c["skip_grad_sync"]:
                continue
            f, lay = losses[f"{c['name']}/facts"], cfg.layout.resolve(world)
            lora = cfg.task.lora()
            assert lora is not None
            total = adapter_parameters(shape_of(cfg.model), lora)["dense"]
            share = total / (lay.tp * lay.pp * (lay.dp if lay.fsdp else 1))  # rank 0's facts
            assert f["state_numel"] == f["optimizer_numel"], c["name"]
            if lay.distributed_optimizer:  # ZeRO-1 over the adapters: rank 0 owns about half of them
                assert 0.3 < f["state_numel"] / share < 0.7, (c["name"], f)
            else:
                assert f["state_numel"] == share, (c["name"], f, share)
            assert f["param_numel"] > 4 * share, c["name"]  # the frozen base is there, and holds no state
            checked += 1
    assert checked >= 9
