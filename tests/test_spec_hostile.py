"""Hostile spec files: bounded reading, grid caps, exit codes when nothing valid remains, unknown devices.

Every refusal through the CLI is checked the same way: exit code ≠ 0, exactly one line on stderr
naming the file or the field, no traceback, and every file that was there before byte-identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.hardware.catalog import UnknownDeviceError, closest_devices, get_device
from powertrain.plan.planner import plan
from powertrain.plan.sweep_spec import SpecError, expand, grid_size, load_sweep_spec, parse_sweep_spec
from powertrain.spec.bounds import MAX_ALIAS_NODES, MAX_SPEC_BYTES, SpecFileError, load_spec_yaml
from powertrain.spec.run import RunConfig, load_run_config
from powertrain.spec.validate import validate

RUN = {"name": "tiny", "model": "gpt3-tiny", "hardware": {"devices_per_node": 1}}


def _bomb(levels: int = 9) -> str:
    """The classic anchor bomb: ten aliases per level, 10**levels leaves, in a variant nobody uses."""
    lines = ["    l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return ("name: bomb\nbase: {model: gpt3-tiny}\ngrid: [{variant: [a]}]\nvariants:\n  a: {}\n  unused:\n"
            + "\n".join(lines) + "\n")


def _write(tmp: Path, name: str, content: str | bytes | None) -> Path:
    path = tmp / name
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


# (id, file name, content (None: a directory), extra CLI options, text the one line names)
CASES: list[tuple[str, str, str | bytes | None, list[str], str]] = [
    ("over-1MiB", "big.yaml", yaml.safe_dump(RUN) + "#" + "x" * MAX_SPEC_BYTES + "\n", [], "1,048,576"),
    ("non-utf8", "latin1.yaml", "name: caf\xe9\nmodel: gpt3-tiny\n".encode("latin-1"), [], "UTF-8"),
    ("utf16", "utf16.yaml", yaml.safe_dump(RUN).encode("utf-16"), [], "UTF-8"),
    ("directory", "folder.yaml", None, [], "directory"),
    ("anchor-bomb", "bomb.yaml", _bomb(), [], "YAML aliases expand"),
    ("recursive-anchor", "rec.yaml", "name: r\nbase: {model: gpt3-tiny}\nvariants: {a: &a [*a]}\n", [], "recursive"),
    ("many-aliases", "aliases.yaml", "name: m\nbase: {model: gpt3-tiny}\nv: &v 1\nvariants:\n  a: ["
     + ", ".join(["*v"] * 1500) + "]\n", [], "1,000"),
    ("grid-10e10", "grid.yaml", yaml.safe_dump({"name": "g", "base": {"model": "gpt3-tiny"},
                                                "grid": [{f"knobs.seed{i}": list(range(10))} for i in range(10)]}),
     [], "10,000,000,000 points"),  # ten axes (two groups setting one axis are refused before counting)
    ("grid-over-max-points", "small-grid.yaml",
     yaml.safe_dump({"name": "g", "base": {"model": "gpt3-tiny"}, "grid": [{"knobs.seed": list(range(20))}]}),
     ["--max-points", "10"], "20 points"),
    ("partition-newline", "inj.yaml", yaml.safe_dump({"name": "i", "base": {"model": "gpt3-tiny"},
                                                      "launch": {"partition": "debug\ntouch PWNED"}}),
     [], "launch.partition"),
    ("nul-in-value", "nul.yaml", 'name: x\nmodel: "gpt3-tiny"\ndata: {kind: text, path: "a\\0b"}\n', [], "data.path"),
]
COMMANDS: dict[str, Callable[[Path, list[str]], list[str]]] = {
    "plan": lambda spec, extra: ["plan", str(spec), *extra],
    "predict": lambda spec, extra: ["predict", str(spec), *extra],
    "sweep": lambda spec, extra: ["sweep", str(spec), "--out", str(spec.parent / "results"), *extra],
    "run-check": lambda spec, extra: ["run", str(spec), "--check"],
}


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(argv: list[str], tmp: Path, names: str, exit_code: int | None = None) -> str:
    before = _digests(tmp)
    res = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code != 0 and (exit_code is None or res.exit_code == exit_code), (res.exit_code, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout
    assert len(lines) == 1, res.stderr
    assert names in lines[0], lines[0]
    assert _digests(tmp) == before
    assert not (tmp / "results").exists() and not list(tmp.rglob("PWNED"))
    return lines[0]


SWEEP_ONLY = {"grid-10e10", "partition-newline"}  # `run` refuses these as sweep specs, naming the file


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(("case", "name", "content", "extra", "names"), CASES, ids=[c[0] for c in CASES])
def test_hostile_spec_files_are_one_line_and_change_nothing(case, name, content, extra, names, command, tmp_path):
    if command == "run-check" and extra:
        pytest.skip("run takes one configuration: no grid options")
    if command == "run-check" and case in SWEEP_ONLY:
        names = "is a sweep spec"
    spec = _write(tmp_path, name, content)
    line = _refused(COMMANDS[command](spec, extra), tmp_path, names, exit_code=2)
    assert name in line  # the file, and the field or the number where there is one


def test_the_bomb_is_refused_before_anything_expands(tmp_path):
    spec = tmp_path / "bomb.yaml"
    spec.write_text(_bomb(12))  # a trillion leaves in 600 bytes
    with pytest.raises(SpecFileError) as info:
        load_spec_yaml(spec)
    expanded = int(str(info.value).split(" to ")[1].split(" nodes")[0].replace(",", ""))
    assert expanded > 10**12 and "bomb.yaml" in str(info.value)


def test_a_few_anchors_are_fine(tmp_path):
    spec = tmp_path / "anchors.yaml"
    spec.write_text("name: a\nbase: &b {model: gpt3-tiny, knobs: {global_batch: 8}}\n"
                    "variants:\n  x: {knobs.recompute: full}\n  y: &y {knobs.seed: 1}\n  z: *y\n"
                    "grid: [{variant: [x, y, z]}]\n")
    assert len(expand(load_sweep_spec(spec))) == 3
    assert MAX_ALIAS_NODES >= 1000


def test_endless_input_is_refused_before_it_is_read(tmp_path):
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    with pytest.raises(SpecFileError, match="is a character device, not a regular file"):
        load_spec_yaml(Path("/dev/zero"))


def test_grid_is_counted_before_expansion():
    raw = {"name": "g", "base": {"model": "gpt3-tiny"},
           "grid": [{"knobs.seed": list(range(1000)), "knobs.lr": [0.1] * 1000},
                    {"zip": {"layout.tp": [1] * 1000, "layout.pp": [1] * 1000}}]}
    spec = parse_sweep_spec(raw)
    assert grid_size(spec) == 10**9
    with pytest.raises(SpecError, match=r"1,000,000,000 points, over the limit of 100,000"):
        expand(spec)
    assert len(plan(parse_sweep_spec({"name": "g", "base": {"model": "gpt3-tiny"},
                                      "grid": [{"knobs.seed": [1, 2, 3]}]}), max_points=5).runs) == 3
    # repeats are counted too
    with pytest.raises(SpecError, match=r"protocol\.repeats"):
        plan(parse_sweep_spec({"name": "g", "base": {"model": "gpt3-tiny", "protocol": {"repeats": 3}},
                               "grid": [{"knobs.seed": [1, 2]}]}), max_points=5)


def test_max_points_option_lets_a_big_grid_through(tmp_path):
    spec = tmp_path / "g.yaml"
    spec.write_text(yaml.safe_dump({"name": "g", "base": {"model": "gpt3-tiny"},
                                    "grid": [{"knobs.seed": list(range(20))}]}))
    res = CliRunner().invoke(app, ["plan", str(spec), "--max-points", "20", "--json"])
    assert res.exit_code == 0, res.stderr


def test_variants_composed_many_times_resolve_once_each():
    variants: dict = {"v0": {"knobs.seed": 1}}
    for i in range(1, 60):  # without memoising, 2**60 resolutions
        variants[f"v{i}"] = [f"v{i - 1}", f"v{i - 1}"]
    spec = parse_sweep_spec({"name": "v", "base": {"model": "gpt3-tiny"}, "grid": [{"variant": ["v59"]}],
                             "variants": variants})
    (run,) = expand(spec)
    assert run.config is not None and run.config.knobs.seed == 1


@pytest.mark.parametrize("field", ["layout.tp", "knobs.global_batch", "hardware.devices_per_node",
                                   "protocol.measured_steps", "knobs.lr", "hardware.nodes"])
@pytest.mark.parametrize("value", [10**30, float("inf"), float("nan")], ids=["huge", "inf", "nan"])
def test_absurd_numbers_are_refused_by_name(field, value):
    if field == "knobs.lr" and value == 10**30:
        pytest.skip("a huge learning rate diverges, but is a number the trainer can take")
    section, key = field.split(".")
    with pytest.raises(ValueError, match=key):
        RunConfig.model_validate({"model": "gpt3-tiny", section: {key: value}})


# --- nothing valid remains → non-zero exit, one line -------------------------------------------------

def test_plan_exits_1_when_every_run_is_rejected(tmp_path):
    spec = tmp_path / "all-bad.yaml"
    spec.write_text(yaml.safe_dump({"name": "bad", "base": {"model": "gpt3-tiny", "hardware": {"devices_per_node": 2}},
                                    "grid": [{"layout.tp": [3, 5]}]}))
    line = _refused(["plan", str(spec)], tmp_path, "all-bad.yaml", exit_code=1)
    assert "nothing to launch" in line and "2 rejected" in line
    line = _refused(["plan", str(spec), "--json"], tmp_path, "nothing to launch", exit_code=1)
    line = _refused(["sweep", str(spec), "--out", str(tmp_path / "results")], tmp_path, "nothing to launch",
                    exit_code=1)


def test_plan_exits_0_when_one_run_remains(tmp_path):
    spec = tmp_path / "some.yaml"
    spec.write_text(yaml.safe_dump({"name": "some", "base": {"model": "gpt3-tiny", "hardware": {"devices_per_node": 2}},
                                    "grid": [{"layout.tp": [2, 3]}]}))
    res = CliRunner().invoke(app, ["plan", str(spec)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.stderr


def test_predict_exits_1_when_every_configuration_is_skipped(tmp_path):
    spec = tmp_path / "skip.yaml"
    spec.write_text(yaml.safe_dump({"name": "skip", "base": {"model": "gpt3-tiny", "hardware": {"device": "h900x"}},
                                    "grid": [{"knobs.seed": [1, 2]}]}))
    line = _refused(["predict", str(spec)], tmp_path, "skip.yaml", exit_code=1)
    assert "nothing was predicted" in line and "h900x" in line and "and 1 more" in line


def test_run_check_exits_2_on_an_unknown_device_naming_the_closest(tmp_path):
    spec = tmp_path / "dev.yaml"
    spec.write_text(yaml.safe_dump({**RUN, "hardware": {"device": "h900x"}}))
    line = _refused(["run", str(spec), "--check"], tmp_path, "dev.yaml", exit_code=2)
    assert "unknown_device" in line and "h900x" in line and "h200" in line and "fix:" in line
    line = _refused(["plan", str(spec)], tmp_path, "h900x", exit_code=1)
    assert "h200" in line


# --- unknown devices ----------------------------------------------------------------------------------

def test_unknown_device_names_the_closest_catalog_names():
    with pytest.raises(UnknownDeviceError) as info:
        get_device("h900x")
    assert isinstance(info.value, KeyError)  # callers that catch KeyError keep working
    assert "h200" in info.value.closest and "closest:" in str(info.value) and "h900x" in str(info.value)
    assert closest_devices("H100 SXM")[0] == "h100-sxm"
    assert closest_devices("zzzzzzzz") == []
    (v,) = validate(RunConfig(model="gpt3-tiny", hardware={"device": "h900x"}))
    assert v.rule == "unknown_device" and "h200" in v.message
    assert not [x for x in validate(RunConfig(model="gpt3-tiny", hardware={"device": "H200"}))
                if x.rule == "unknown_device"]


def test_run_config_loader_refuses_like_the_sweep_loader(tmp_path):
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        load_run_config(tmp_path / "d.yaml")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run_config(tmp_path / "missing.yaml")
    bad = tmp_path / "nl.yaml"
    bad.write_text(yaml.safe_dump({**RUN, "name": "a\nb"}))
    with pytest.raises(ValueError, match="name holds a newline"):
        load_run_config(bad)
