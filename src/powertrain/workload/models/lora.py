"""LoRA fine-tuning of the built-in models: adapters on the targeted linear layers, every base weight frozen.

:func:`apply_lora` replaces each targeted ``nn.Linear`` by a :class:`LoRALinear` holding it as ``base``
and computing ``base(x) + (alpha/rank)·lora_b(lora_a(x))``; then every parameter but the adapters'
gets ``requires_grad = False``, so backward computes no gradient for it and the optimizer keeps no
state for it (the trainer hands it only trainable parameters). ``lora_a`` starts small and random
(PEFT's Kaiming-uniform, drawn from a generator seeded with ``knobs.seed``, after the base model's
own draws, so the base weights are those of the same seed's full run), ``lora_b`` at zero: step 0's
loss is the base model's.

The spec's model-neutral target names map onto each family's modules (:data:`MODULES`): attention
``wq``/``wk``/``wv``/``wo`` everywhere; the MLP's ``w1``/``w3``/``w2`` (SwiGLU: gate, up, down) or
GELU ``w1``/``w2`` (up, down). Mixtral's experts are stacked tensors, not linear layers, and the
fused ``qkv_proj`` adapter has no single layer here: ``spec.validate`` refuses both for this trainer.

Adapters are applied before any parallelism (``parallelize`` step 0), so pipeline stages copy them,
tensor parallelism shards them (``parallel.tensor_parallel``) and data parallelism reduces only
their gradients.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from powertrain.spec.run import Task
from powertrain.workload.models.layers import Transformer

# target → module path inside a block, per family (a family missing a target cannot take it)
_ATTENTION = {"q_proj": "attention.wq", "k_proj": "attention.wk", "v_proj": "attention.wv", "o_proj": "attention.wo"}
MODULES: dict[str, dict[str, str]] = {
    "llama": {**_ATTENTION, "gate_proj": "feed_forward.w1", "up_proj": "feed_forward.w3",
              "down_proj": "feed_forward.w2"},
    "gpt": {**_ATTENTION, "up_proj": "feed_forward.w1", "down_proj": "feed_forward.w2"},
    "mixtral": dict(_ATTENTION),
}
# the generator of the adapters' initial A is seeded apart from the model's stream (seed + this), so
# adding adapters never shifts the base model's initial weights
_SEED_OFFSET = 0x4C6F5241  # "LoRA"


class LoRALinear(nn.Module):
    """A frozen ``base`` linear layer plus a trainable low-rank update: ``base(x) + scale·B(A(x))``."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        self.scale = alpha / rank
        with torch.no_grad():
            # PEFT's init: A Kaiming-uniform (as nn.Linear's own), B zero, so the update starts at 0
            nn.init.kaiming_uniform_(self.lora_a.weight, a=math.sqrt(5), generator=generator)
            nn.init.zeros_(self.lora_b.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * self.lora_b(self.lora_a(x))


def target_modules(family: str, targets: list[str] | tuple[str, ...]) -> list[str]:
    """Module paths inside a block for ``targets``; ``ValueError`` naming the fix for one the family lacks."""
    names = MODULES[family]
    missing = [t for t in targets if t not in names]
    if missing:
        raise ValueError(f"LoRA target {', '.join(missing)} is not a linear layer of the built-in {family} model "
                         f"(it has {', '.join(names)}); drop it from task.targets")
    return [names[t] for t in targets]


def apply_lora(model: Transformer, task: Task, seed: int) -> Transformer:
    """Adapters on ``task.targets`` of every block, every other parameter frozen (in place; returns ``model``).

    Call it on the model as built, on the CPU: the adapters' initial values come from a CPU generator."""
    assert task.rank is not None and task.alpha is not None and task.targets is not None, "a lora task is filled"
    paths = target_modules(model.cfg.family, task.targets)
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed((seed + _SEED_OFFSET) % 2**64)
    for block in model.layers.values():  # layers in index order: the same draws on every rank and layout
        for path in paths:
            parent_path, _, name = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            base = getattr(parent, name)
            assert isinstance(base, nn.Linear), f"{path} of a built-in block is a linear layer"
            setattr(parent, name, LoRALinear(base, task.rank, task.alpha, gen))
    return model


def trainable(params: list[nn.Parameter]) -> list[nn.Parameter]:
    """The parameters that get gradients (all of them without LoRA; the adapters with it)."""
    return [p for p in params if p.requires_grad]


def unfrozen_base(named: list[tuple[str, nn.Parameter]]) -> list[str]:
    """Names of parameters that require grad but are no adapter's: empty after :func:`apply_lora`, unless a
    later transformation re-created a frozen weight as a trainable one."""
    return [n for n, p in named if p.requires_grad and ".lora_a." not in n and ".lora_b." not in n]
