"""Model FLOPs: the definition MFU/HFU use, checked against published closed forms."""

from __future__ import annotations

import pytest

from powertrain.core.flops import (
    active_parameters,
    hardware_flops_per_step,
    model_flops_per_step,
    model_flops_per_token,
    parameter_counts,
)
from powertrain.spec.model import ModelConfig, get_model


def _gpt(layers: int, h: int, vocab: int, seq: int) -> ModelConfig:
    return ModelConfig(family="gpt", layers=layers, hidden=h, ffn=4 * h, heads=h // 128, kv_heads=h // 128,
                       vocab=vocab, seq_len=seq)


@pytest.mark.parametrize(("layers", "h"), [(96, 12288), (24, 2304), (128, 25600)])
def test_full_recompute_matches_narayanan_eq3(layers: int, h: int) -> None:
    """96·B·s·l·h²·(1 + s/6h + V/16lh) — Narayanan et al. SC'21, Eq. 3 (GELU MLP, MHA, full recompute)."""
    s, v, b = 2048, 51200, 512
    m = _gpt(layers, h, v, s)
    eq3 = 96 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))
    assert hardware_flops_per_step(m, b, "full") == pytest.approx(eq3, rel=1e-12)


def test_model_flops_are_six_n_plus_attention() -> None:
    m = get_model("llama3-70b")
    p = parameter_counts(m)
    n_matmul = p["attention"] + p["mlp"] + p["head"]
    attn = 12 * m.layers * m.hidden * m.seq_len
    assert model_flops_per_token(m) == pytest.approx(6 * n_matmul + attn, rel=1e-12)
    assert model_flops_per_step(m, 128) == pytest.approx(model_flops_per_token(m) * 128 * m.seq_len)


def test_moe_counts_active_experts_only() -> None:
    mix = get_model("mixtral-8x7b")
    dense_all = mix.model_copy(update={"top_k": 8})
    assert model_flops_per_token(mix) < model_flops_per_token(dense_all)
    # ~47B parameters, ~13B active (Mixtral 8x7B)
    assert 45e9 < sum(parameter_counts(mix).values()) < 48e9
    assert 12.5e9 < active_parameters(mix) < 13.5e9


def test_recompute_changes_hardware_not_model_flops() -> None:
    m = get_model("gpt3-175b")
    base = model_flops_per_step(m, 8)
    assert hardware_flops_per_step(m, 8, "none") == base
    assert base < hardware_flops_per_step(m, 8, "selective") < hardware_flops_per_step(m, 8, "full")
    with pytest.raises(ValueError, match="recompute"):
        hardware_flops_per_step(m, 8, "sometimes")
