"""``layout.distributed_optimizer`` (ZeRO-1): the same losses as plain AdamW, optimizer state sharded.

One torchrun launch of 2 ranks runs every case (``powertrain.workload.equivalence``); the reference
is the single-process run of the same model and batches, as in test_workload_layouts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_workload_layouts import GPT, LLAMA, MIXTRAL, STEPS, check, one_thread  # noqa: F401 - fixture


def _case(name: str, layout: dict, model: dict = LLAMA, **knobs) -> dict:
    return {"name": name, "steps": STEPS, "optimizer_share": True,
            "config": {"model": model, "layout": {"distributed_optimizer": True, **layout},
                       "hardware": {"devices_per_node": 2},
                       "knobs": {"global_batch": 8, "micro_batch": 2, "lr": 3e-3, **knobs}}}


CASES = [
    _case("ddp_distopt", {}),
    _case("allreduce_distopt", {}, overlap={"grad_reduce_in_backward": False}),
    _case("ep_distopt", {"ep": 2}, MIXTRAL),
    _case("fsdp_distopt", {"fsdp": True}),  # FSDP shards the states itself: plain AdamW on the shards
    _case("tp_distopt", {"tp": 2, "sequence_parallel": True}, GPT, micro_batch=8),  # one replica: nothing to shard
]


@pytest.fixture(scope="module")
def losses(tmp_path_factory):
    folder = tmp_path_factory.mktemp("distopt")
    cases, out = folder / "cases.json", folder / "losses.json"
    cases.write_text(json.dumps(CASES))
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "-m", "powertrain.workload.equivalence", str(cases), str(out)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("c", CASES, ids=[c["name"] for c in CASES])
def test_distributed_optimizer_keeps_the_losses_and_shards_the_state(c, losses):
    check({**c, "skip_grad_sync": False}, losses)
    own, every = losses[f"{c['name']}/optimizer_share"]
    if c["name"] in ("ddp_distopt", "allreduce_distopt"):
        assert 0.3 < own / every < 0.7  # about half of the parameters' state on each of 2 replicas
    elif c["name"] == "ep_distopt":
        assert own < every  # the dense parameters are shared out; each rank's experts are its own
    else:
        assert own == every
