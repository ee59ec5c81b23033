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
