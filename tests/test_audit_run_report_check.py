"""`powertrain run --check` runs the option checks a launch runs (node options, --rate, --backends,
--out), and node options that a one-node launch (torchrun --standalone) cannot use are refused
instead of dropped without a word."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.launch.local import check_node_options
from powertrain.spec.run import RunConfig

runner = CliRunner()
ONE_NODE = str(Path(__file__).parents[1] / "examples" / "run-llama-dp2.yaml")
TWO_NODES = {"name": "mn", "model": "llama3-tiny", "layout": {}, "knobs": {"micro_batch": 2, "global_batch": 4},
             "hardware": {"nodes": 2, "devices_per_node": 1}, "protocol": {"warmup_steps": 1, "measured_steps": 2}}


@pytest.fixture(autouse=True)
def not_under_slurm(monkeypatch):
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)


def _run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, ["run", *args])
    return res.exit_code, " ".join(res.output.split())


@pytest.mark.parametrize(("args", "message"), [
    (["--nnodes", "7"], "the spec asks for 1 node(s) but this launch has 7; pass --nnodes 1"),
    (["--master-addr", "10.9.9.9"], "--master-addr applies to a run of several nodes (hardware.nodes > 1) and this "
                                     "spec runs on one node; drop it"),
    (["--master-addr", "10.9.9.9", "--master-port", "29999"], "--master-addr, --master-port apply to a run of several "
                                                              "nodes"),
    (["--node-rank", "0"], "--node-rank applies to a run of several nodes"),
    (["--rate", "99999"], "--rate must be in (0, 1000] samples per second, got 99999"),
    (["--rate", "nan"], "--rate must be in (0, 1000]"),
    (["--backends", "host,nvdia"], "--backends 'host,nvdia': give auto, or a comma list of nvidia, amd, host"),
])
def test_check_refuses_what_a_launch_refuses(args, message):
    code, out = _run(ONE_NODE, "--check", *args)
    assert code == 2, out
    assert message in out and "is valid" not in out


def test_a_real_launch_refuses_node_options_of_a_one_node_spec_before_anything_starts(tmp_path):
    code, out = _run(ONE_NODE, "--out", str(tmp_path / "r"), "--master-addr", "10.9.9.9", "--master-port", "29999")
    assert code == 2 and "--master-addr, --master-port apply to a run of several nodes" in out, out
    assert not (tmp_path / "r").exists()


def test_check_of_a_multi_node_spec_takes_the_node_options_and_wants_a_shared_out(tmp_path):
    spec = tmp_path / "two.yaml"
    spec.write_text(yaml.safe_dump(TWO_NODES))
    nodes = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "h0", "--master-port", "29999"]
    code, out = _run(str(spec), "--check", *nodes)
    assert code == 2 and "several nodes need one shared run directory: pass --out DIR" in out, out
    code, out = _run(str(spec), "--check", "--out", str(tmp_path / "shared"), *nodes)
    assert code == 0 and "is valid" in out, out
    code, out = _run(str(spec), "--check", "--out", str(tmp_path / "shared"), "--nnodes", "2", "--node-rank", "0")
    assert code == 2 and "--master-addr A --master-port P" in out, out


def test_check_refuses_an_out_that_holds_a_run(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run.json").write_text("{}")
    code, out = _run(ONE_NODE, "--check", "--out", str(tmp_path / "old"))
    assert code == 2 and "already holds a run (run.json exists); choose a new --out folder" in out, out
    code, out = _run(ONE_NODE, "--check", "--out", str(tmp_path / "new"))
    assert code == 0 and "is valid" in out, out
    assert not (tmp_path / "new").exists()  # --check starts nothing


def test_launch_api_refuses_a_master_address_for_one_node():
    cfg = RunConfig.model_validate({"model": "llama3-tiny", "hardware": {"devices_per_node": 2}})
    check_node_options(cfg, 1, 0, None, None)  # the defaults: fine
    with pytest.raises(ValueError, match=r"--master-port applies to a run of several nodes"):
        check_node_options(cfg, 1, 0, None, 29500)
