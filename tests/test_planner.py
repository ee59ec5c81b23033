"""`powertrain plan` on the study's matrices and on small specs: exact runs, exact rejections."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from powertrain.plan.planner import plan
from powertrain.plan.sweep_spec import load_sweep_spec, parse_sweep_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# DESIGN.md's 32×H200 matrix: (model, tp, pp, ep, fsdp) → dp follows from 32 GPUs.
H200 = {
    ("gpt3-175b", 2, 16, 1, False), ("gpt3-175b", 4, 8, 1, False), ("gpt3-175b", 8, 4, 1, False),
    ("gpt3-175b", 1, 32, 1, False), ("gpt3-175b", 8, 1, 1, True),
    ("llama3-70b", 8, 2, 1, False), ("llama3-70b", 4, 4, 1, False), ("llama3-70b", 2, 8, 1, False),
    ("llama3-70b", 1, 16, 1, False), ("llama3-70b", 8, 1, 1, True),
    ("mixtral-8x22b", 1, 4, 8, False), ("mixtral-8x22b", 2, 2, 8, False), ("mixtral-8x22b", 4, 1, 8, False),
    ("mixtral-8x7b", 1, 1, 8, False), ("mixtral-8x7b", 2, 1, 4, False),
}


def _key(run):
    c = run.config
    return (c.model.name, c.layout.tp, c.layout.pp, c.layout.ep, c.layout.fsdp)


def test_h200_parallelism_sweep_is_exactly_the_studys_15_layouts():
    p = plan(load_sweep_spec(EXAMPLES / "study-h200-parallelism.yaml"))
    assert p.counts()["planned"] == 15 and len(p.runs) == 15
    assert {_key(r) for r in p.runs} == H200
    for r in p.runs:
        lay = r.config.layout
        assert lay.dp * lay.tp * lay.pp == 32  # dp derived, never typed
        assert r.mem_per_device_bytes is not None  # sized by the memory model
        # Fig. 4 ran with full recompute (block method, every layer): with it every layout fits in 141 GB
        assert r.config.knobs.recompute == "full" and r.fits is True and not r.warnings


def test_h200_microbatch_sweep_flags_exactly_the_studys_invalid_run():
    p = plan(load_sweep_spec(EXAMPLES / "study-h200-microbatch.yaml"))
    rejected = [r for r in p.runs if r.status == "rejected"]
    assert len(p.runs) == 60
    assert [(_key(r), r.config.knobs.micro_batch) for r in rejected] == [(("mixtral-8x7b", 1, 1, 8, False), 8)]
    assert "global_batch" in rejected[0].reasons[0] and "fix" in rejected[0].reasons[0]
    assert all(r.config.knobs.recompute == "full" for r in p.runs)


def test_optimization_sweep_merges_no_op_variants():
    p = plan(load_sweep_spec(EXAMPLES / "study-h200-optimizations.yaml"))
    dups = [r for r in p.runs if r.status == "duplicate"]
    # overlap switches cannot act at TP1 with a single data-parallel rank: merged into base.
    assert {r.id for r in dups} == {"gpt3-175b.tp1.pp32.overlap", "gpt3-175b.tp1.pp32.overlap-recompute"}
    assert all(r.duplicate_of for r in dups)


def test_h100_sweep_has_the_studys_15_layouts_on_64_gpus():
    p = plan(load_sweep_spec(EXAMPLES / "study-h100-parallelism.yaml"))
    assert p.counts()["planned"] == 15
    assert all(r.config.layout.dp * r.config.layout.tp * r.config.layout.pp == 64 for r in p.runs)


def test_h100_grid_ships_as_an_optimization_sweep_of_four_variants():
    p = plan(load_sweep_spec(EXAMPLES / "study-h100-optimizations.yaml"))
    assert len(p.runs) == 60 and {r.variant for r in p.runs} == {"base", "overlap", "recompute", "overlap+recompute"}
    full = {(r.config.model.name, r.config.layout.label()) for r in p.runs if r.variant == "recompute"}
    view = plan(load_sweep_spec(EXAMPLES / "study-h100-parallelism.yaml"))  # its full-recompute column
    assert full == {(r.config.model.name, r.config.layout.label()) for r in view.runs}
    assert all(r.config.knobs.recompute == "full" for r in view.runs)


def test_cpu_examples_plan_and_fit():
    for name in ("cpu-sweep", "cpu-study-parallelism", "cpu-study-optimizations", "cpu-study-microbatch",
                 "cpu-study-h100"):
        p = plan(load_sweep_spec(EXAMPLES / f"{name}.yaml"))
        assert p.to_launch, name
        assert all(r.fits for r in p.to_launch), name


def test_predicted_oom_is_rejected_by_default_with_a_fix():
    spec = parse_sweep_spec({"name": "big", "base": {
        "model": "llama3-70b", "hardware": {"nodes": 1, "devices_per_node": 8, "device": "h100-sxm"},
        "layout": {"tp": 8}, "knobs": {"global_batch": 8, "precision": "bf16"}}})
    (run,) = plan(spec).runs
    assert run.status == "rejected" and run.fits is False
    assert run.reasons[0].startswith("memory:") and "fix:" in run.reasons[0]


def test_plan_cli_prints_the_table_and_json():
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", "plan", str(EXAMPLES / "study-h200-microbatch.yaml"),
                          "--json"], capture_output=True, text=True)
    assert res.returncode == 0
    assert '"rejected": 1' in res.stdout
    res = subprocess.run([sys.executable, "-m", "powertrain.cli", "plan", "nope.yaml"], capture_output=True, text=True)
    assert res.returncode == 2 and "does not exist" in res.stderr


def test_repeats_become_separate_runs():
    spec = parse_sweep_spec({"name": "rep", "base": {"model": "gpt3-tiny", "hardware": {"devices_per_node": 2},
                                                     "protocol": {"repeats": 3}}})
    p = plan(spec)
    assert [r.id for r in p.runs] == ["run.r1", "run.r2", "run.r3"]
    assert [r.settings["repeat"] for r in p.runs] == [1, 2, 3]
