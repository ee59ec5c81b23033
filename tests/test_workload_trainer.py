"""The trainer in one process: models, knobs that must not change the math, data, and step markers."""

from __future__ import annotations

import json

import pytest
import torch

from powertrain import hooks
from powertrain.spec.model import catalog
from powertrain.spec.run import RunConfig
from powertrain.store import read_events
from powertrain.workload.data import Batches
from powertrain.workload.equivalence import max_rel_diff
from powertrain.workload.models import build_model
from powertrain.workload.trainer import Trainer

LLAMA = {"name": "llama-test", "family": "llama", "layers": 2, "hidden": 32, "ffn": 64, "heads": 4,
         "kv_heads": 2, "vocab": 128, "seq_len": 16}
MODELS = {
    "gpt": {**LLAMA, "name": "gpt-test", "family": "gpt", "kv_heads": 4},
    "llama": LLAMA,
    "mixtral": {**LLAMA, "name": "mixtral-test", "family": "mixtral", "experts": 4, "top_k": 2},
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tiny ops on a shared 2-core machine: one intra-op thread avoids spinning threads fighting.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def losses(model: dict, steps: int = 5, **knobs) -> list[float]:
    cfg = RunConfig(model=model, knobs={"global_batch": 4, "lr": 3e-3, **knobs})
    t = Trainer(cfg)
    return [t.step(i).loss for i in range(steps)]


@pytest.mark.parametrize("family", MODELS)
def test_micro_batch_and_recompute_do_not_change_losses(family):
    base = losses(MODELS[family])
    assert base[-1] < base[0]  # it learns
    for micro, recompute in ((2, "none"), (4, "none"), (1, "selective"), (2, "full")):
        got = losses(MODELS[family], micro_batch=micro, recompute=recompute)
        assert max_rel_diff(got, base) <= 1e-5, (micro, recompute, got, base)


def test_seed_and_lr_do_change_losses():
    base = losses(LLAMA, steps=3)
    assert max_rel_diff(losses(LLAMA, steps=3, seed=1), base) > 1e-3
    assert max_rel_diff(losses(LLAMA, steps=3, lr=1e-2), base) > 1e-4


def test_bf16_autocast_trains_close_to_fp32():
    fp32 = losses(LLAMA, steps=3)
    bf16 = losses(LLAMA, steps=3, precision="bf16")
    assert all(torch.isfinite(torch.tensor(bf16)))
    assert max_rel_diff(bf16, fp32) < 2e-2


def test_families_have_their_architecture():
    gpt, llama, moe = (build_model(RunConfig(model=MODELS[f]).model) for f in ("gpt", "llama", "mixtral"))
    assert hasattr(gpt.embed, "pos") and gpt.rope is None and isinstance(gpt.layers["0"].ffn_norm, torch.nn.LayerNorm)
    assert llama.rope is not None and isinstance(llama.layers["0"].ffn_norm, torch.nn.RMSNorm)
    attn = llama.layers["0"].attention
    assert attn.wk.out_features == attn.wq.out_features // 2  # 4 heads share 2 KV heads
    assert moe.layers["0"].feed_forward.w1.shape == (4, 32, 64)
    for name, cfg in catalog().items():  # the study's sizes and the tiny twins keep the same shape
        if name.endswith("-tiny"):
            big = catalog()[{"gpt3-tiny": "gpt3-175b", "llama3-tiny": "llama3-70b"}.get(name, name.removesuffix("-tiny"))]
            assert (cfg.family, cfg.experts, cfg.top_k, cfg.heads // cfg.kv_heads > 1) == \
                   (big.family, big.experts, big.top_k, big.heads // big.kv_heads > 1)
            assert cfg.hidden <= 256


def test_batches_are_deterministic_and_split_over_dp(tmp_path):
    cfg = RunConfig(model=LLAMA)
    b = Batches(cfg.data, cfg.model, global_batch=8, seed=0)
    whole = b.local(3)
    assert torch.equal(torch.cat([b.local(3, r, 4) for r in range(4)]), whole)
    assert torch.equal(Batches(cfg.data, cfg.model, 8, 0).local(3), whole)
    assert not torch.equal(b.local(4), whole)
    assert whole.shape == (8, 17) and int(whole.max()) < 128
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    tb = Batches(RunConfig(model={**LLAMA, "vocab": 256}, data={"kind": "text", "path": text}).data,
                 cfg.model, global_batch=2)
    sample = bytes(tb.local(0)[0].tolist())
    assert sample.decode() in text.read_text()


def test_trainer_marks_steps_and_phases(tmp_path):
    rec = hooks.Recorder(tmp_path, rank=0)
    cfg = RunConfig(model=LLAMA, knobs={"global_batch": 4, "micro_batch": 2})
    t = Trainer(cfg, recorder=rec)
    rec.set_window("warmup")
    t.step(0)
    rec.set_window("measured")
    t.step(1)
    rec.close()
    ev = read_events(tmp_path).to_pylist()
    steps = [e for e in ev if e["kind"] == "step"]
    assert [(e["step"], e["window"]) for e in steps] == [(0, "warmup"), (1, "measured")]
    assert all(e["tokens"] == 4 * 16 and e["samples"] == 4 for e in steps)
    assert all(e["loss"] is not None and e["mem_peak_bytes"] is None for e in steps)  # CPU: unknown, not 0
    assert json.loads(steps[0]["attrs"])["global_tokens"] == 64
    kinds = [(e["kind"], e["microbatch"]) for e in ev if e["step"] == 1]
    assert ("forward", 0) in kinds and ("backward", 1) in kinds and ("optimizer", None) in kinds


def test_protocol_windows_and_minimum_measured_time(tmp_path):
    from powertrain.workload.run_loop import run_protocol

    cfg = RunConfig(model=LLAMA, knobs={"global_batch": 2},
                    protocol={"warmup_steps": 2, "measured_steps": 1, "min_measured_s": 0.3})
    rec = hooks.Recorder(tmp_path)
    results = run_protocol(Trainer(cfg, recorder=rec), None)
    rec.close()
    windows = [r.window for r in results]
    assert windows[:2] == ["warmup", "warmup"] and set(windows[2:]) == {"measured"}
    steps = [e for e in read_events(tmp_path).to_pylist() if e["kind"] == "step" and e["window"] == "measured"]
    assert (steps[-1]["t_end_ns"] - steps[0]["t_start_ns"]) / 1e9 >= 0.3  # the window lasts long enough
