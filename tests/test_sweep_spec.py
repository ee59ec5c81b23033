"""Sweep specs: grid expansion (cases, zip, product, variants) and clear errors."""

import pytest

from powertrain.plan.sweep_spec import SpecError, expand, load_sweep_spec, parse_sweep_spec

BASE = {"model": "gpt3-tiny", "hardware": {"devices_per_node": 2}, "knobs": {"global_batch": 8}}


def test_product_zip_cases_and_variants_multiply_in_order():
    spec = parse_sweep_spec({
        "name": "s",
        "base": BASE,
        "grid": [
            {"zip": {"layout.tp": [1, 2], "layout.pp": [2, 1]}},
            {"knobs.micro_batch": [1, 2]},
            {"variant": ["base", "rc"]},
        ],
        "variants": {"base": {}, "rc": {"knobs.recompute": "full"}},
    })
    runs = expand(spec)
    assert len(runs) == 2 * 2 * 2
    first, last = runs[0].config, runs[-1].config
    assert (first.layout.tp, first.layout.pp, first.knobs.micro_batch, first.knobs.recompute) == (1, 2, 1, "none")
    assert (last.layout.tp, last.layout.pp, last.knobs.micro_batch, last.knobs.recompute) == (2, 1, 2, "full")
    assert runs[-1].settings == {"layout.tp": 2, "layout.pp": 1, "knobs.micro_batch": 2, "variant": "rc"}


def test_cases_with_nested_mappings_merge_into_base():
    spec = parse_sweep_spec({"name": "s", "base": {**BASE, "layout": {"fsdp": True}},
                             "grid": [{"cases": [{"model": "llama3-tiny", "layout": {"tp": 2}}]}]})
    (run,) = expand(spec)
    assert run.config.model.name == "llama3-tiny"
    assert run.config.layout.tp == 2 and run.config.layout.fsdp  # merged, not replaced


def test_composed_variants_and_unknown_variant():
    spec = parse_sweep_spec({
        "name": "s", "base": BASE, "grid": [{"variant": ["both"]}],
        "variants": {"a": {"knobs.recompute": "full"}, "b": {"knobs.overlap.async_tp": True}, "both": ["a", "b"]},
    })
    (run,) = expand(spec)
    assert run.config.knobs.recompute == "full" and run.config.knobs.overlap.async_tp
    bad = parse_sweep_spec({"name": "s", "base": BASE, "grid": [{"variant": ["nope"]}], "variants": {"a": {}}})
    with pytest.raises(SpecError, match=r"unknown variant 'nope'.*known: a"):
        expand(bad)


def test_bad_values_are_reported_per_run_not_raised():
    spec = parse_sweep_spec({"name": "s", "base": BASE, "grid": [{"knobs.recompute": ["none", "sometimes"]}]})
    ok, bad = expand(spec)
    assert ok.config is not None and bad.config is None
    assert "knobs.recompute" in bad.error


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([1, 2], "expected a mapping"),
        ({"name": "s", "grid": [{"zip": {"a": [1], "b": [1, 2]}}]}, "differ in length"),
        ({"name": "s", "grid": [{"cases": [1]}]}, "list of mappings"),
        ({"name": "s", "grid": [{"x": []}]}, "empty list"),
        ({"name": "bad name!"}, "name"),
        ({"name": "s", "colour": "red"}, "colour"),
    ],
)
def test_malformed_specs_name_the_problem(raw, message):
    with pytest.raises(SpecError, match=message):
        expand(parse_sweep_spec(raw))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_sweep_spec(tmp_path / "nope.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_sweep_spec(p)


def test_single_run_spec_is_a_sweep_of_one(tmp_path):
    spec = parse_sweep_spec({"name": "one", **BASE})
    (run,) = expand(spec)
    assert run.config.model.name == "gpt3-tiny"
