"""LoRA in the built-in trainer, in one process: adapters where the targets say, the base frozen and unchanged,
step 0 equal to the base model, and rank, alpha and targets each changing what trains.

The layouts (DDP, FSDP, TP + SP, pipeline, EP) reproduce these single-process losses in
test_workload_layouts (the ``lora_*`` cases)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from powertrain.spec.run import RunConfig
from powertrain.workload.models.lora import LoRALinear, target_modules
from powertrain.workload.trainer import Trainer

TINY = {"family": "llama", "layers": 2, "hidden": 32, "ffn": 64, "heads": 4, "kv_heads": 2, "vocab": 128, "seq_len": 16}
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def trainer(task: dict[str, Any] | None = None, model: dict[str, Any] | None = None) -> Trainer:
    return Trainer(RunConfig.model_validate({"model": model or TINY, "knobs": {"global_batch": 4, "lr": 1e-2},
                                             **({"task": task} if task else {})}))


def test_lora_starts_at_the_base_model_and_trains_only_its_adapters():
    full, lora = trainer(), trainer({"kind": "lora", "rank": 4, "targets": ALL})
    base = {n: p.detach().clone() for n, p in lora.par.module.named_parameters() if not p.requires_grad}
    adapters = {n: p for n, p in lora.par.module.named_parameters() if p.requires_grad}
    assert adapters and all(".lora_a." in n or ".lora_b." in n for n in adapters)
    assert all(not p.any() for n, p in adapters.items() if ".lora_b." in n)  # B starts at zero
    lf, ll = [full.step(i).loss for i in range(3)], [lora.step(i).loss for i in range(3)]
    assert ll[0] == lf[0]  # the update starts at 0: the same seed's base model
    assert ll[1:] != lf[1:]
    after = dict(lora.par.module.named_parameters())
    assert all(torch.equal(after[n], v) and after[n].grad is None for n, v in base.items())  # frozen, no gradient
    assert all(p.grad is None for p in adapters.values())  # zeroed after the step, but …
    assert any(p.abs().sum() > 0 for n, p in adapters.items() if ".lora_b." in n)  # … B has trained
    state = {id(p) for p in lora.optimizer.state}
    assert state == {id(p) for p in adapters.values()}  # optimizer state for the adapters alone


def test_targets_name_each_familys_own_layers_and_a_missing_one_is_refused():
    gpt = {**TINY, "family": "gpt", "kv_heads": 4}
    t = trainer({"kind": "lora", "rank": 4, "targets": ["up_proj", "down_proj"]}, gpt)
    block = t.par.module.layers["0"]
    assert isinstance(block.feed_forward.w1, LoRALinear) and isinstance(block.feed_forward.w2, LoRALinear)
    assert not isinstance(block.attention.wq, LoRALinear)
    llama = trainer({"kind": "lora", "rank": 4, "targets": ["gate_proj", "v_proj"]}).par.module.layers["1"]
    assert isinstance(llama.feed_forward.w1, LoRALinear) and not isinstance(llama.feed_forward.w3, LoRALinear)
    assert isinstance(llama.attention.wv, LoRALinear) and not isinstance(llama.attention.wk, LoRALinear)
    assert target_modules("llama", ["up_proj"]) == ["feed_forward.w3"]
    with pytest.raises(ValueError, match=r"gate_proj is not a linear layer of the built-in gpt model.*drop it"):
        target_modules("gpt", ["gate_proj"])


def test_rank_and_alpha_change_what_trains():
    def losses(**task: Any) -> list[float]:
        t = trainer({"kind": "lora", **task})
        return [float(t.step(i).loss or 0.0) for i in range(3)]

    r4 = trainer({"kind": "lora", "rank": 4}).par.module.layers["0"].attention.wq
    r8 = trainer({"kind": "lora", "rank": 8}).par.module.layers["0"].attention.wq
    assert r4.lora_a.weight.shape == (4, 32) and r8.lora_b.weight.shape == (32, 8)
    assert r4.scale == 32 / 4 and r8.scale == 32 / 8  # alpha / rank, alpha 32 by default
    base = losses(rank=4)
    assert losses(rank=4, alpha=1.0)[1:] != base[1:]  # the update's scale
    assert losses(rank=8)[1:] != base[1:]
