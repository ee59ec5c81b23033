"""The trainer in one process: models, knobs that must not change the math, data, and step markers."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

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


def test_a_head_width_apart_from_hidden_is_built_and_counted():
    # Qwen3's attention: heads × head width ≠ hidden; the trainer builds it and the FLOP model counts the same
    from powertrain.core.flops import parameter_counts, shape_of

    cfg = RunConfig(model={**LLAMA, "attention_head_dim": 16}).model
    attn = build_model(cfg).layers["0"].attention
    assert (attn.wq.in_features, attn.wq.out_features, attn.wo.in_features) == (32, 4 * 16, 4 * 16)
    model = build_model(cfg)
    built = sum(p.numel() for n, p in model.named_parameters() if ".attention." in n)  # not attention_norm
    assert built == parameter_counts(shape_of(cfg))["attention"]


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


@pytest.fixture(scope="module")
def pp_run(pp_launch) -> Path:
    return Path(pp_launch["run"])


N_MICRO = 4


@pytest.mark.slow
def test_pipeline_run_records_each_stage_call_in_1f1b_order(pp_run):
    ev = read_events(pp_run).to_pylist()
    for step in (0, 1, 2):
        for rank in (0, 1):  # rank r holds stage r
            calls = sorted((e for e in ev if e["rank"] == rank and e["step"] == step
                            and e["kind"] in ("forward", "backward")), key=lambda e: e["t_start_ns"])
            stage = [json.loads(e["attrs"]) for e in calls]
            assert {a["stage"] for a in stage} == {rank}
            work = [(e["kind"][0].upper(), e["microbatch"]) for e, a in zip(calls, stage, strict=True)
                    if a.get("part") != "loss"]
            # one row per micro-batch per direction, no more
            assert sorted(work) == [(d, k) for d in "BF" for k in range(N_MICRO)], work
            if rank == 1:  # the last stage alternates: F0 B0 F1 B1 … (1F1B), its loss right after each F
                assert work == [(d, k) for k in range(N_MICRO) for d in "FB"], work
                loss = [e["microbatch"] for e, a in zip(calls, stage, strict=True) if a.get("part") == "loss"]
                assert loss == list(range(N_MICRO))
            else:  # the first stage warms up with two forwards, then 1B1F, then cools down
                assert work == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)], work
            pipe = next(e for e in ev if e["rank"] == rank and e["step"] == step and e["kind"] == "phase"
                        and e["name"] == "pipeline")
            assert all(pipe["t_start_ns"] <= e["t_start_ns"] <= e["t_end_ns"] <= pipe["t_end_ns"] for e in calls)
            # the calls never overlap: what the pipeline phase keeps beyond them is its bubble
            assert all(a["t_end_ns"] <= b["t_start_ns"] for a, b in itertools.pairwise(calls))


@pytest.mark.slow
def test_pipeline_run_trace_and_report_show_the_stage_calls(pp_run, tmp_path):
    from powertrain.report import build_report
    from powertrain.trace import export_trace

    export_trace(pp_run, tmp_path / "t.json")
    slices = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "X"]
    for rank in (0, 1):
        mine = [e for e in slices if e["tid"] == rank and e["args"].get("step") == 2]
        fb = [e for e in mine if e["cat"] in ("forward", "backward") and "loss" not in e["name"]]
        assert len(fb) == 2 * N_MICRO and {e["name"] for e in fb} == {f"stage{rank}.mb{k}" for k in range(N_MICRO)}
        assert all(e["args"]["microbatch"] in range(N_MICRO) and e["args"]["attrs"]["stage"] == rank for e in fb)
        pipe = next(e for e in mine if e["cat"] == "phase" and e["name"] == "pipeline")
        assert all(pipe["ts"] <= e["ts"] and e["ts"] + e["dur"] <= pipe["ts"] + pipe["dur"] + 1e-3 for e in fb)
    html = build_report(pp_run, tmp_path / "rep", ("svg",)).read_text()
    assert 'id="fig-pipeline_schedule"' in html and "Per pipeline stage" in html
    svg = (tmp_path / "rep" / "figures" / "pipeline_schedule.svg").read_text()
    labels = set(re.findall(r"<text[^>]*>([FB]\d)</text>", svg))
    assert labels == {f"{d}{k}" for d in "FB" for k in range(N_MICRO)}, labels  # every call of the step drawn
    assert "stage 0 (rank 0)" in svg and "stage 1 (rank 1)" in svg
    # the table: 4 forwards and 4 backwards per step on each stage, and a bubble share
    assert re.search(r"<tr><td>1</td><td>1</td><td>4</td><td>4</td>.*?<td>\d+\.\d %</td></tr>", html)
    assert "pipeline bubble + p2p wait" in (tmp_path / "rep" / "figures" / "phases.svg").read_text()
