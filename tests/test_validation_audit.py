"""Validation you can audit (issue 31): the ledger of held-out sets, reading rules as data, the ranking rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from powertrain.predict import published, validation
from powertrain.predict.published import HELDOUT_FILES, PublishedRun, run_from_entry
from powertrain.predict.reading_rules import reading_rules
from powertrain.predict.validation import comparable_pairs, is_right, ledger, order_pairs, record_of

REPO = Path(__file__).resolve().parents[1]


def test_every_held_out_file_has_a_ledger_entry_and_validation_says_why() -> None:
    books = ledger()
    for path in HELDOUT_FILES:
        entry = record_of(path)
        assert entry.status in ("clean", "validation"), path.name
        if entry.status == "validation":
            assert entry.commit and entry.reason, path.name
    assert books["calibration_runs.yaml"].status == "fit"
    assert not set(books) - {p.name for p in HELDOUT_FILES} - {"calibration_runs.yaml"}  # no stale entry


def test_a_file_without_a_ledger_entry_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match=r"validation_ledger\.yaml: add it"):
        record_of("heldout_nobody_wrote_down.yaml")


# era names are what the rules produce, not sources: code may compare an era to "torchtitan"
_ERA_WORDS = {"megatron"} | {str(r.value["era"]) for r in reading_rules().eras}


def _named_sources(path: Path) -> set[str]:
    """Source words (authors, commits, source labels: what data/reading_rules.yaml matches on) in the strings
    of ``path``'s code; docstrings may name the sources a rule came from."""
    rules = reading_rules()
    words = {w for r in (*rules.eras, *rules.tflops_counts) for w in (*r.match.any, *r.match.all)
             if not w.isdigit() and w not in _ERA_WORDS}
    words |= {str(r.value["label"]).lower() for r in rules.source_labels if "label" in r.value} - _ERA_WORDS
    tree = ast.parse(path.read_text())
    docs = {id(b.body[0].value) for b in ast.walk(tree)
            if isinstance(b, ast.Module | ast.FunctionDef | ast.ClassDef) and b.body
            and isinstance(b.body[0], ast.Expr) and isinstance(b.body[0].value, ast.Constant)}
    strings = [n.value for n in ast.walk(tree)
               if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]
    return {w for s in strings for w in words if w in s.lower()}


@pytest.mark.parametrize("path", [Path(published.__file__), Path(validation.__file__),
                                  REPO / "benchmarks" / "predict_accuracy.py", REPO / "benchmarks" / "advise_accuracy.py"])
def test_no_code_branches_on_a_sources_name_commit_or_authors(path: Path) -> None:
    assert not _named_sources(path), f"{path.name} names a source in code: move the rule to data/reading_rules.yaml"


def test_the_source_name_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "reader.py"
    bad.write_text('def flops(src):\n    return "hardware" if src == "Narayanan21" or "6985e58" in src else "model"\n')
    assert _named_sources(bad) == {"narayanan", "narayanan21", "6985e58"}


def _entry(**over: object) -> dict[str, object]:
    e: dict[str, object] = {
        "id": "x", "source": {"ref": "Some paper (2020)"}, "framework": "Megatron-LM (2020)",
        "model": {"layers": 24, "hidden": 2048, "heads": 16, "seq_len": 2048, "vocab": 51200},
        "hardware": {"gpu": "A100-SXM4-80GB", "count": 8, "gpus_per_node": 8},
        "parallel": {"tp": 2, "pp": 1, "dp": 4}, "batch": {"micro": 4, "global": 64},
        "precision": "fp16", "measured": {"tokens_per_s_per_gpu": 1000.0}}
    e.update(over)
    return e


def test_the_legacy_recompute_rule_is_applied_by_the_reader_and_said() -> None:
    run = run_from_entry(_entry())
    assert run.case is not None and run.case.recompute == "full"
    assert run.recompute_rule == "recompute-megatron-lm-2019-21-scripts" and not run.recompute_stated
    assert any("recompute not published: full assumed" in a and "--checkpoint-activations" in a
               for a in run.assumptions)
    modern = run_from_entry(_entry(framework="Megatron-Core r0.12", source={"ref": "Some table (2025)"}))
    assert modern.recompute_rule is None and not modern.recompute_stated  # the scorer picks the least that fits


def test_a_tflops_convention_comes_from_the_rules_table() -> None:
    rules = reading_rules()
    assert rules.tflops_count("Narayanan et al., SC'21") == "hardware"
    assert rules.tflops_count("NVIDIA NeMo performance summary") == "model"


@pytest.mark.parametrize(("measured", "predicted", "right"), [
    (1.10, 1.05, True), (1.10, 0.95, False), (0.90, 0.80, True),
    (1.02, 1.005, True),  # a predicted tie on a measured near-tie
    (1.10, 1.005, False),  # a predicted tie where the measurement chose
    (1.02, 1.05, True), (1.02, 0.95, False),  # outside a predicted tie the sign decides, even on a near-tie
])
def test_the_ordering_rule(measured: float, predicted: float, right: bool) -> None:
    assert is_right(measured, predicted) is right


def _run(rid: str, micro: int, tps: float, ref: str = "Doc A", framework: str = "Megatron-Core r0.12",
         gb: int = 64) -> PublishedRun:
    r = run_from_entry(_entry(id=rid, source={"ref": ref}, framework=framework, recompute="none",
                              batch={"micro": micro, "global": gb}, measured={"tokens_per_s_per_gpu": tps}))
    assert r.case is not None, r.skip
    return r


def test_pairs_are_within_one_document_and_release_and_differ_only_in_a_choice() -> None:
    a, b = _run("a", 1, 1000.0), _run("b", 2, 1100.0)
    other_doc = _run("c", 4, 1200.0, ref="Doc B")
    other_release = _run("d", 4, 1200.0, framework="Megatron-Core r0.13")
    other_batch = _run("e", 4, 1200.0, gb=128)
    same = _run("f", 1, 990.0)  # the same configuration as a: not a choice
    pairs = comparable_pairs([a, b, other_doc, other_release, other_batch, same])
    assert {(x.id, y.id) for x, y in pairs} == {("a", "b"), ("b", "f")}
    judged = order_pairs(pairs, {"a": 1.0, "b": 1.2, "f": 1.0})
    assert [p.right for p in judged] == [True, True] and judged[0].differs == "micro_batch 1→2"


def test_a_megatron_deepspeed_run_gets_its_stacks_defaults_not_megatron_cores() -> None:
    """The 2022 forks had no sequence parallelism, TP-comm or parameter-gather overlap, and DeepSpeed's pipeline
    engine reduces gradients after the backward; a stated ZeRO-1 is a distributed optimizer."""
    run = run_from_entry(_entry(framework="Megatron-DeepSpeed (bigscience fork), Feb 2022", recompute="full",
                                parallel={"tp": 2, "pp": 1, "dp": 4, "zero": 1}))
    c = run.case
    assert c is not None
    assert (c.sequence_parallel, c.overlap_tp, c.overlap_dp, c.overlap_param_gather) == (False, False, False, False)
    assert c.distributed_optimizer
    assert not any("sequence parallelism not published" in a for a in run.assumptions)
    core = run_from_entry(_entry(framework="Megatron-Core r0.12", source={"ref": "a 2025 table"}, recompute="full"))
    assert core.case is not None and core.case.sequence_parallel and core.case.overlap_tp


def test_a_run_predicted_not_to_fit_is_listed_with_what_the_reader_assumed() -> None:
    from powertrain.predict.calibration import Coefficients
    from powertrain.predict.validation import not_fitting

    fits = run_from_entry(_entry(recompute="full"))
    huge = run_from_entry(_entry(id="huge", model={"layers": 96, "hidden": 12288, "heads": 96, "seq_len": 2048},
                                 parallel={"tp": 1, "pp": 1, "dp": 8}))
    (verdict,) = not_fitting([fits, huge], Coefficients())
    assert verdict.id == "huge" and verdict.need_over_capacity > 1
    assert any("recompute not published: full assumed" in a for a in verdict.assumed)
