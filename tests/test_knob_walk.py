"""Every knob real or refused: a walk over every field of the run spec and the sweep spec.

:data:`WALK` maps each field path (``knobs.overlap.async_tp``; sweep fields start with ``sweep.``) to
how it is shown to act — ``wired``: the test that measures the difference it makes (in the process,
its command, run.json / sweep.json or the telemetry), one of this file or another — and, where it
cannot apply, ``refused``: the rule and a configuration that breaks it. The walk fails when a field
is added to a spec model without an entry here (or an entry outlives its field), when a named test
does not exist, and when a named refusal does not happen.

The measurements that no other test makes are made here: the trainer knobs inside one 2-rank
launch (what the ranks build: DDP bucket, gradient sync mode, FSDP resharding and prefetch,
optimizer state per rank, and losses), the single-process knobs, and the launch options.
"""

from __future__ import annotations

import ast
import json
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from equivalence_cases import CPU2, KNOB_CASES, KNOB_PREFIX, TINY
from powertrain.launch.controls import visible_devices_env
from powertrain.launch.local import _note_placement, rank_map
from powertrain.launch.sweep import SweepOptions, SweepRunner, _run_command, sbatch_script
from powertrain.plan.planner import plan
from powertrain.plan.state import SweepState
from powertrain.plan.sweep_spec import LaunchOptions, SweepSpec, parse_sweep_spec
from powertrain.spec.run import RunConfig
from powertrain.spec.validate import validate
from powertrain.workload.run_loop import profiled_steps

TESTS = Path(__file__).resolve().parent
ON_GPU = {"hardware": {"device": "h100-sxm", "devices_per_node": 2}}
LAYERS = "tests/test_workload_layouts.py::test_two_ranks_match_single_process"
TRAINER = "tests/test_workload_trainer.py::"
RUN = "tests/test_workload_run.py::test_run_writes_a_complete_run_directory"
HERE = "tests/test_knob_walk.py::"

MOE = {**TINY, "family": "mixtral", "experts": 4, "top_k": 2}

W = dict[str, Any]
WALK: dict[str, W] = {
    # -- the run spec (RunConfig) ---------------------------------------------------------------------
    "name": {"wired": "tests/test_control_sweep.py::test_power_cap_sweep_applies_records_and_restores"},
    "model.name": {"wired": "tests/test_planner.py::test_h200_parallelism_sweep_is_exactly_the_studys_15_layouts"},
    **{f"model.{f}": {"wired": TRAINER + "test_families_have_their_architecture"}
       for f in ("family", "layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "experts", "top_k")},
    "model.seq_len": {"wired": TRAINER + "test_batches_are_deterministic_and_split_over_dp"},
    "model.tied_embeddings": {"refused": ("tied_embeddings_unsupported", {"model": {**TINY, "tied_embeddings": True}})},
    "layout.dp": {"wired": RUN, "refused": ("world_size", {"layout": {"dp": 3}})},
    **{f"layout.{f}": {"wired": LAYERS} for f in ("tp", "pp", "ep", "fsdp", "sequence_parallel", "pp_schedule",
                                                   "virtual_stages", "pp_split")},
    "layout.cp": {"refused": ("context_parallel_unsupported", {"layout": {"cp": 2}, **CPU2})},
    "knobs.fp8_recipe": {"wired": "tests/test_predict_precision.py::test_a_spec_plans_fp8_with_its_recipe",
                         "refused": ("recipe_needs_fp8", {"knobs": {"fp8_recipe": "delayed"}})},
    "layout.etp": {"refused": ("expert_tp_unsupported", {"model": MOE, "layout": {"tp": 2, "ep": 2, "etp": 1}, **CPU2})},
    "model.attention_head_dim": {"wired": TRAINER + "test_a_head_width_apart_from_hidden_is_built_and_counted"},
    **{f"model.{f}": {"refused": ("model_architecture_unsupported", {"model": {**MOE, **over}})}
       for f, over in (("dense_layers", {"dense_layers": 1}), ("dense_ffn", {"dense_layers": 1, "dense_ffn": 96}),
                       ("shared_ffn", {"shared_ffn": 64}), ("kv_lora_rank", {"kv_lora_rank": 16}),
                       ("q_lora_rank", {"kv_lora_rank": 16, "q_lora_rank": 16}),
                       ("qk_rope_dim", {"kv_lora_rank": 16, "qk_rope_dim": 4}),
                       ("v_head_dim", {"kv_lora_rank": 16, "v_head_dim": 8}), ("mtp_layers", {"mtp_layers": 1}))},
    "layout.distributed_optimizer": {"wired": HERE + "test_trainer_knobs_change_what_the_ranks_build"},
    "knobs.micro_batch": {"wired": TRAINER + "test_trainer_marks_steps_and_phases"},
    "knobs.global_batch": {"wired": TRAINER + "test_trainer_marks_steps_and_phases"},
    "knobs.recompute": {"wired": HERE + "test_single_process_knobs_change_the_model_and_the_losses"},
    **{f"knobs.overlap.{f}": {"wired": HERE + "test_trainer_knobs_change_what_the_ranks_build"}
       for f in ("fsdp_prefetch", "fsdp_reshard_after_forward", "ddp_bucket_mb", "grad_reduce_in_backward")},
    # Applied on CUDA only (symmetric memory + torch.compile's micro-pipeline TP pass): the applying
    # path runs on a GPU (scripts/gpu_check.sh); here, the refusals are what can be measured.
    "knobs.overlap.async_tp": {"wired": HERE + "test_async_tp_is_refused_in_one_line_where_pytorch_lacks_it",
                               "refused": ("async_tp_needs_cuda", {"layout": {"tp": 2}, **CPU2,
                                                                   "knobs": {"overlap": {"async_tp": True}}})},
    "knobs.precision": {"wired": TRAINER + "test_bf16_autocast_trains_close_to_fp32"},
    "knobs.power_limit_w": {"wired": "tests/test_control_sweep.py::test_power_cap_sweep_applies_records_and_restores",
                            "refused": ("control_needs_gpu", {"knobs": {"power_limit_w": 300}})},
    "knobs.sm_clock_mhz": {"wired": "tests/test_control.py::test_apply_records_requested_and_in_effect_then_restores",
                           "refused": ("control_needs_gpu", {"knobs": {"sm_clock_mhz": [1200, 1500]}})},
    "knobs.mem_clock_mhz": {"wired": "tests/test_control.py::test_apply_records_requested_and_in_effect_then_restores",
                            "refused": ("control_needs_gpu", {"knobs": {"mem_clock_mhz": 1600}})},
    "knobs.seed": {"wired": TRAINER + "test_seed_and_lr_do_change_losses"},
    "knobs.lr": {"wired": TRAINER + "test_seed_and_lr_do_change_losses"},
    "knobs.moe_aux_coeff": {"wired": HERE + "test_single_process_knobs_change_the_model_and_the_losses"},
    "hardware.nodes": {"wired": "tests/test_multinode_run.py::test_two_nodes_on_localhost_make_one_run_with_one_sampler_per_node"},
    "hardware.devices_per_node": {"wired": RUN},
    "hardware.device": {"wired": "tests/test_control.py::test_a_gpu_spec_on_a_cpu_node_needs_stand_in",
                        "refused": ("unknown_device", {"hardware": {"device": "h900x"}})},
    "hardware.stand_in": {"wired": "tests/test_control.py::test_a_gpu_spec_on_a_cpu_node_needs_stand_in",
                          "refused": ("stand_in_needs_device", {"hardware": {"stand_in": True}})},
    "hardware.cooling": {"wired": "tests/test_predict_physics.py::test_cooling_is_read_from_the_spec",
                         "refused": ("cooling_needs_gpu", {"hardware": {"cooling": "liquid"}})},
    **{f"protocol.{f}": {"wired": TRAINER + "test_protocol_windows_and_minimum_measured_time"}
       for f in ("warmup_steps", "measured_steps", "min_measured_s")},
    "protocol.repeats": {"wired": "tests/test_planner.py::test_repeats_become_separate_runs"},
    "protocol.cooldown_s": {"wired": "tests/test_sweep.py::test_temperature_gate_waits_until_cool_or_timeout"},
    "protocol.cooldown_until_temp_c": {"wired": "tests/test_sweep.py::test_temperature_gate_waits_until_cool_or_timeout"},
    "protocol.idle_baseline_s": {"wired": HERE + "test_idle_baseline_is_recorded_once_per_sweep"},
    "data.kind": {"wired": TRAINER + "test_batches_are_deterministic_and_split_over_dp",
                  "refused": ("data_path", {"data": {"kind": "text", "path": "/nonexistent/corpus.txt"}})},
    "data.path": {"wired": TRAINER + "test_batches_are_deterministic_and_split_over_dp"},
    # LoRA (task: kind lora): what trains in one process here, under every layout in test_workload_layouts
    "task.kind": {"wired": "tests/test_workload_lora.py::test_lora_starts_at_the_base_model_and_trains_only_its_adapters",
                  "refused": ("lora_expert_targets_unsupported", {"model": MOE, "task": {"kind": "lora", "rank": 4,
                                                                                          "targets": ["up_proj"]}})},
    "task.rank": {"wired": "tests/test_workload_lora.py::test_rank_and_alpha_change_what_trains",
                  "refused": ("lora_rank_le_dim", {"task": {"kind": "lora", "rank": 64}})},
    "task.alpha": {"wired": "tests/test_workload_lora.py::test_rank_and_alpha_change_what_trains"},
    "task.targets": {"wired": "tests/test_workload_lora.py::test_targets_name_each_familys_own_layers_and_a_missing_one_is_refused",
                     "refused": ("lora_fused_qkv_unsupported", {"task": {"kind": "lora", "rank": 4,
                                                                         "targets": ["qkv_proj"]}})},
    "profile.enabled": {"wired": RUN},
    "profile.ranks": {"wired": RUN},
    "profile.steps": {"wired": HERE + "test_profile_steps_and_in_measured_choose_the_traced_steps"},
    "profile.in_measured": {"wired": HERE + "test_profile_steps_and_in_measured_choose_the_traced_steps"},
    "launch.device_order": {"wired": HERE + "test_launch_options_reach_the_process_and_its_records",
                            "refused": ("device_order_needs_gpu", {"launch": {"device_order": [0]}})},
    # -- the sweep spec (SweepSpec, LaunchOptions) -------------------------------------------------------
    "sweep.name": {"wired": "tests/test_sweep.py::test_a_second_sweep_on_the_same_folder_is_refused"},
    "sweep.description": {"wired": HERE + "test_launch_options_reach_the_process_and_its_records"},
    "sweep.base": {"wired": "tests/test_planner.py::test_h200_parallelism_sweep_is_exactly_the_studys_15_layouts"},
    "sweep.grid": {"wired": "tests/test_planner.py::test_h200_microbatch_sweep_flags_exactly_the_studys_invalid_run"},
    "sweep.variants": {"wired": "tests/test_planner.py::test_optimization_sweep_merges_no_op_variants"},
    "sweep.launch.backend": {"wired": "tests/test_sweep.py::test_example_cpu_sweep_through_local_slurm"},
    "sweep.launch.time_limit_min": {"wired": HERE + "test_launch_options_reach_the_process_and_its_records"},
    "sweep.launch.retries": {"wired": "tests/test_retries.py::test_a_failed_run_is_retried_with_doubling_back_off_and_every_attempt_kept"},
    "sweep.launch.retry_backoff_s": {"wired": "tests/test_retries.py::test_a_failed_run_is_retried_with_doubling_back_off_and_every_attempt_kept"},
    **{f"sweep.launch.{f}": {"wired": "tests/test_slurm_injection.py::test_safe_values_pass_and_reach_the_script_as_written"}
       for f in ("partition", "account", "qos", "slurm_extra")},
    "sweep.launch.pending_limit_min": {"wired": "tests/test_sweep_folder_safety.py::"
                                                "test_a_job_pending_past_the_bound_is_cancelled_and_its_run_failed"},
    "sweep.launch.sampler_rate_hz": {"wired": HERE + "test_launch_options_reach_the_process_and_its_records"},
    "sweep.launch.memory_check": {"wired": "tests/test_planner.py::test_predicted_oom_is_rejected_by_default_with_a_fix"},
}


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (also inside ``X | None``), else None (a leaf)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        subs = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return subs[0] if len(subs) == 1 else None
    return None


def field_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every leaf field of ``model``, recursively, as dotted paths."""
    out: set[str] = set()
    for name, info in model.model_fields.items():
        sub = _submodel(info.annotation)
        out |= field_paths(sub, f"{prefix}{name}.") if sub else {f"{prefix}{name}"}
    return out


def _test_exists(ref: str) -> bool:
    path, name = ref.split("::")
    tree = ast.parse((TESTS.parent / path).read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def test_every_spec_field_is_wired_or_refused():
    fields = field_paths(RunConfig) | {f"sweep.{p}" for p in field_paths(SweepSpec)}
    missing, stale = sorted(fields - set(WALK)), sorted(set(WALK) - fields)
    assert not missing, f"fields neither wired nor refused (add them to WALK with their evidence): {missing}"
    assert not stale, f"WALK names fields the specs no longer have: {stale}"
    for path, entry in WALK.items():
        assert entry.get("wired") or entry.get("refused"), path
        if "wired" in entry:
            assert _test_exists(entry["wired"]), f"{path}: no test {entry['wired']}"
        if "refused" in entry:
            rule, over = entry["refused"]
            cfg = RunConfig.model_validate({"model": TINY, **over})
            assert rule in {v.rule for v in validate(cfg)}, f"{path}: {over} is not refused by {rule}"


def test_the_walk_fails_for_a_new_unwired_field():
    class Knobs2(BaseModel):
        power_limit_w: float | None = None
        new_knob: int = 0

    class Run2(BaseModel):
        knobs: Knobs2 = Knobs2()

    assert field_paths(Run2) - set(WALK) == {"knobs.new_knob"}


def test_single_process_knobs_change_the_model_and_the_losses():
    from powertrain.workload.equivalence import max_rel_diff
    from powertrain.workload.parallel.recompute import Checkpointed
    from powertrain.workload.trainer import Trainer

    def trainer(**knobs: Any) -> Trainer:
        return Trainer(RunConfig.model_validate({"model": {**TINY, "family": "mixtral", "experts": 4, "top_k": 2},
                                                 "knobs": {"global_batch": 2, "lr": 3e-3, **knobs}}))

    full = trainer(recompute="full").par.module
    assert all(isinstance(b, Checkpointed) for b in full.layers.values())
    assert not any(isinstance(b, Checkpointed) for b in trainer().par.module.layers.values())
    a, b = trainer(moe_aux_coeff=0.0), trainer(moe_aux_coeff=1.0)
    la, lb = [a.step(i).loss for i in range(3)], [b.step(i).loss for i in range(3)]
    assert max_rel_diff(la, lb) > 1e-4  # the load-balancing loss is in the objective


def test_async_tp_is_refused_in_one_line_where_pytorch_lacks_it():
    from powertrain.launch.controls import check_node_device
    from powertrain.workload.parallel.async_tp import async_tp_unavailable

    assert async_tp_unavailable("cpu") == "async TP needs CUDA (symmetric memory); this rank runs on cpu"
    stand_in = RunConfig.model_validate({"model": TINY, "layout": {"tp": 2}, "knobs": {"overlap": {"async_tp": True}},
                                         "hardware": {"device": "h100-sxm", "devices_per_node": 2, "stand_in": True}})
    assert validate(stand_in) == []  # an NVIDIA spec may ask for it …
    with pytest.raises(ValueError, match=r"async_tp needs CUDA.*stand-in trains on the CPU"):
        check_node_device(stand_in, "cpu")  # … but a CPU rehearsal of it is refused before launch


def test_profile_steps_and_in_measured_choose_the_traced_steps():
    def config(**prof: Any) -> RunConfig:
        return RunConfig.model_validate({"model": TINY, "profile": {"enabled": True, **prof},
                                         "protocol": {"warmup_steps": 3}})

    def steps(**prof: Any) -> list[int]:
        return profiled_steps(config(**prof))

    assert steps() == [2]  # the last warm-up step
    # a measured step is left out … (the spec rule refuses such a spec; the trainer's filter stays a guard)
    assert steps(steps=[0, 4]) == [0]
    assert "profile_measured_needs_in_measured" in {v.rule for v in validate(config(steps=[0, 4]))}
    assert steps(steps=[0, 4], in_measured=True) == [0, 4]  # … unless asked for
    assert validate(config(steps=[0, 4], in_measured=True)) == []


def test_launch_options_reach_the_process_and_its_records(tmp_path):
    gpu = RunConfig.model_validate({"model": TINY, **ON_GPU, "launch": {"device_order": [1, 0]}})
    assert visible_devices_env(gpu, "cuda") == {"CUDA_VISIBLE_DEVICES": "1,0"}
    info: dict[str, Any] = {"rank_map": rank_map(gpu, "h", "cuda")}
    _note_placement(info, gpu, None, [], {})
    assert info["device_order"] == [1, 0] and [r["local_device"] for r in info["rank_map"]] == [1, 0]
    spec = parse_sweep_spec({"name": "w", "description": "why this sweep", "base": {"model": TINY},
                             "launch": {"sampler_rate_hz": 5, "time_limit_min": 7}})
    runner = SweepRunner(plan(spec), tmp_path / "s", SweepOptions())
    assert _run_command(runner.opts, tmp_path / "x.yaml", tmp_path / "r")[-2:] == ["--rate", "5"]
    script = sbatch_script(runner.opts, LaunchOptions(time_limit_min=7), RunConfig(model=TINY), tmp_path / "x.yaml",
                           tmp_path / "s" / "r", 7 * 60)
    assert "#SBATCH --time=7\n" in script and "--rate 5" in script
    state = SweepState.create_or_merge(tmp_path / "s", plan(spec))
    assert json.loads(state.path.read_text())["spec"]["description"] == "why this sweep"


@pytest.mark.slow
def test_idle_baseline_is_recorded_once_per_sweep(tmp_path):
    spec = parse_sweep_spec({"name": "b", "base": {"model": TINY, "protocol": {"idle_baseline_s": 0.5}}})
    runner = SweepRunner(plan(spec), tmp_path, SweepOptions())
    runner.state = SweepState.create_or_merge(tmp_path, runner.plan)
    runner._baseline()
    info = json.loads((tmp_path / ".baseline" / "run.json").read_text())
    assert info["name"] == "idle-baseline" and runner.state.data["idle_baseline"]["seconds"] == 0.5


# -- the trainer knobs, measured inside one 2-rank launch ---------------------------------------------
@pytest.fixture(scope="module")
def built(world2: dict[str, Any]) -> dict[str, Any]:
    """These cases' losses and facts, from the layouts' shared 2-rank launch (they ride along in it)."""
    return {k.removeprefix(KNOB_PREFIX): v for k, v in world2.items() if k.startswith(KNOB_PREFIX)}


@pytest.mark.slow
def test_trainer_knobs_change_what_the_ranks_build(built):
    from powertrain.workload.equivalence import max_rel_diff

    f = {c["name"]: built[f"{c['name']}/facts"] for c in KNOB_CASES}
    assert f["ddp"]["dp_mode"] == "ddp" and f["allreduce"]["dp_mode"] == "allreduce"  # grad_reduce_in_backward
    assert f["ddp"]["ddp_bucket_bytes"] == 25 * 2**20 and f["ddp_bucket_1mb"]["ddp_bucket_bytes"] == 2**20
    assert f["fsdp"]["fsdp_reshard_after_forward"] is True and f["fsdp"]["fsdp_forward_prefetch"] == 1
    assert f["fsdp_no_reshard_no_prefetch"]["fsdp_reshard_after_forward"] is False
    assert f["fsdp_no_reshard_no_prefetch"]["fsdp_forward_prefetch"] == 0
    for name in ("ddp_distopt", "allreduce_distopt"):  # ZeRO-1: about half the optimizer state per rank …
        assert 0.3 < f[name]["optimizer_numel"] / f[name]["param_numel"] < 0.7
        assert max_rel_diff(built[name], built["ddp"]) <= 1e-5  # … and the same losses as plain AdamW
    assert f["ddp"]["optimizer_numel"] == f["ddp"]["param_numel"]
    assert f["ep_distopt"]["optimizer_numel"] < f["ep_distopt"]["param_numel"]
    for name in ("ddp_bucket_1mb", "allreduce", "fsdp", "fsdp_no_reshard_no_prefetch"):
        assert max_rel_diff(built[name], built["ddp"]) <= 1e-4, name  # how, not what, they compute


def _measured_run(folder: Path, device: str, rank_device: str, stand_in: bool = False) -> Path:
    folder.mkdir(parents=True)
    info: dict[str, Any] = {"schema": "powertrain.run/1", "name": folder.name, "status": "ok", "kind": "run",
                            "config": {"model": "gpt3-tiny", "hardware": {"device": device}},
                            "rank_map": [{"rank": 0, "device": rank_device}]}
    if stand_in:
        info["stand_in"] = {"device": device, "ran_on": "cpu"}
    (folder / "run.json").write_text(json.dumps(info))
    return folder


def test_calibrate_refuses_runs_measured_on_another_device(tmp_path):
    from powertrain.cli.calibrate import _check_devices, measured_device

    stand_in = _measured_run(tmp_path / "a", "h200", "cpu", stand_in=True)
    real = _measured_run(tmp_path / "b", "h200", "cuda:0")
    cpu = _measured_run(tmp_path / "c", "cpu", "cpu")
    assert measured_device(stand_in) == ("h200", "cpu") and measured_device(real) == ("h200", "h200")
    with pytest.raises(ValueError, match=r"names h200 but it was measured on cpu \(a stand-in run\)"):
        _check_devices([real, stand_in], "default")
    with pytest.raises(ValueError, match="several devices"):
        _check_devices([real, cpu], "default")
    _check_devices([real], "default")  # one device, measured on it: accepted
