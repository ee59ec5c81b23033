"""`powertrain plan` of a large grid summarises its table (issue 29: a 99 360-point grid's table took 290 s
and 4.8 GB to draw) and says how to see every row; ``--all`` prints them, ``--json`` streams them.

The threshold is made small (monkeypatched) so a 160-point grid shows the summary in well under a second."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from powertrain.cli import app
from powertrain.cli import plan as plan_cli
from powertrain.plan.planner import plan
from powertrain.plan.sweep_spec import load_sweep_spec

runner = CliRunner()
GRID = """name: biggrid
base:
  model: gpt3-175b
  hardware: {nodes: 8, devices_per_node: 8, device: h100}
  knobs: {global_batch: 256, micro_batch: 1, precision: bf16}
grid:
  - layout.tp: [1, 2, 4, 8]
    layout.pp: [1, 2, 4, 8, 16]
  - knobs.micro_batch: [1, 2, 4, 8]
  - knobs.recompute: [none, full]
"""
ID = re.compile(r"^│ (tp\d+\.pp\d+\.mb\d+\.rc\w+) ", re.MULTILINE)


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(plan_cli, "TABLE_MAX_ROWS", 20)
    monkeypatch.setattr(plan_cli, "SUMMARY_ROWS_EACH", 3)
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    return path


def _printed(spec: Path, every_row: bool = False) -> str:
    con = Console(record=True, width=400)  # a row on one line
    plan_cli.print_plan(plan(load_sweep_spec(spec)), console=con, spec=spec, every_row=every_row)
    return con.export_text()


def test_a_large_table_is_summarised_and_says_how_to_see_every_row(spec: Path) -> None:
    p = plan(load_sweep_spec(spec))
    counts = p.counts()
    assert len(p.runs) == 160 and counts["planned"] and counts["rejected"]
    text = _printed(spec)
    ids = ID.findall(text)
    statuses = [s for s, n in counts.items() if n]
    assert len(ids) == sum(min(3, counts[s]) for s in statuses), text  # the first 3 of each status
    assert ids == [r.id for r in p.runs if r.id in set(ids)]  # in plan order
    assert f"{160 - len(ids)} of 160 rows left out" in text
    assert f"`powertrain plan {spec} --all` prints every row" in text and f"powertrain plan {spec} --json" in text
    groups = Counter((r.status, plan_cli._rule((r.reasons + r.warnings)[0])) for r in p.runs
                     if r.status != "planned" or r.warnings)
    assert "by reason" in text and groups
    for (status, rule), n in groups.items():  # every run that will not launch is counted under its rule
        assert re.search(rf"│ {status}\s+│ {rule}\s+│ {n}\s+│", text), (status, rule, n, text)
    assert "160 runs:" in text  # the counts line, as before


def test_all_prints_every_row_and_a_small_plan_is_whole(spec: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(ID.findall(_printed(spec, every_row=True))) == 160
    monkeypatch.setattr(plan_cli, "TABLE_MAX_ROWS", 160)
    text = _printed(spec)
    assert len(ID.findall(text)) == 160 and "left out" not in text and "by reason" not in text


def test_the_commands_say_it_too(spec: Path) -> None:
    res = runner.invoke(app, ["plan", str(spec)])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "rows left out" in flat and "--all` prints every row" in flat
    res = runner.invoke(app, ["plan", str(spec), "--problems"])
    assert "--problems --all` prints every row" in " ".join(res.output.split())


def test_json_is_streamed_and_reads_as_before(spec: Path) -> None:
    p = plan(load_sweep_spec(spec))
    for extra, show_all in (([], True), (["--problems"], False)):
        res = runner.invoke(app, ["plan", str(spec), "--json", *extra])
        assert res.exit_code == 0, res.output
        whole = json.dumps({"name": p.spec.name, "counts": p.counts(),
                            "runs": [r.to_dict() for r in plan_cli.shown_runs(p, show_all)]}, indent=2, default=str)
        assert res.stdout == whole + "\n"  # byte for byte what one json.dumps wrote
