"""The README as a new user runs it: every ``bash`` and ``python`` block, verbatim.

Convention (visible in the README itself): a block fenced as ```` ```bash no-test ```` is not run
here — the two ``make`` commands (they set up and run everything), long sweeps, and commands on
files the reader supplies. Every other ``bash`` block runs through bash, in order, in one temporary
working directory (``examples/`` linked in, the venv's ``bin`` first on PATH, profiles written to a
temporary folder); the ``python`` block runs with a small real ``loader`` and ``train_step`` defined
first, as the README says the reader's own would be.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```\s*$", re.S | re.M)
RUNNABLE = {"bash", "python"}
NO_TEST = "no-test"


@dataclass
class Block:
    line: int
    lang: str
    flags: tuple[str, ...]
    code: str

    @property
    def skipped(self) -> bool:
        return NO_TEST in self.flags


def blocks() -> list[Block]:
    text = README.read_text()
    out = []
    for m in FENCE.finditer(text):
        info = m.group(1).split()
        out.append(Block(text.count("\n", 0, m.start()) + 1, info[0] if info else "", tuple(info[1:]), m.group(2)))
    return out


def test_every_block_is_labelled_and_few_are_skipped():
    bs = blocks()
    assert bs, "no fenced block found in README.md"
    unlabelled = [b.line for b in bs if not b.lang]
    assert not unlabelled, f"README.md blocks without a language (use text for non-code) at lines {unlabelled}"
    skipped = [b for b in bs if b.skipped]
    assert all(b.lang in RUNNABLE for b in skipped), "no-test only makes sense on a bash or python block"
    assert "make demo" in skipped[0].code and "make test" in skipped[0].code  # the two commands stay on top
    assert len(skipped) <= 6, f"{len(skipped)} README blocks skip the doc-test; keep the exceptions few"
    runnable = [b for b in bs if b.lang in RUNNABLE and not b.skipped]
    assert sum(b.lang == "python" for b in runnable) == 1 and sum(b.lang == "bash" for b in runnable) >= 4


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """A fresh directory that looks like the repository root to the README's relative paths."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # as after `source .venv/bin/activate`
    env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
    env["POWERTRAIN_PROFILES"] = str(tmp / "profiles")  # calibrate must not write into the user's home
    env.pop("POWERTRAIN_RUN_DIR", None)
    env["COLUMNS"] = "160"
    return env


@pytest.mark.slow
def test_shell_blocks_run_verbatim(workdir):
    env = _env(workdir)
    ran = 0
    for b in blocks():
        if b.lang != "bash" or b.skipped:
            continue
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", b.code], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (f"README.md block at line {b.line} exited {proc.returncode}:\n{b.code}\n"
                                      f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
        ran += 1
    assert ran >= 4
    import powertrain

    # What the blocks promise to leave behind, read back through the public API.
    assert (workdir / "runs/try1/report/report.html").is_file() and (workdir / "out/try1-trace.json").is_file()
    for run in ("try1", "dp2", "tp2", "pp2", "mlperf"):
        assert powertrain.summary(workdir / "runs" / run)["status"] == "ok", run
    dp2 = powertrain.summary(workdir / "runs/dp2")["metrics"]
    assert dp2["step_time_mean_s"] is not None and dp2["tokens_per_s"] is not None
    assert powertrain.summary(workdir / "runs/dp2-predicted")["kind"] == "prediction"
    assert (workdir / "profiles" / "mycpu.yaml").is_file()
    assert (workdir / "out/clusters.png").is_file()
    mlperf = powertrain.summary(workdir / "runs/mlperf")
    assert len(mlperf["per_node"]) == 8 and mlperf["metrics"]["energy_j"] > 0


@pytest.mark.slow
def test_python_block_runs_verbatim(workdir, capsys):
    import torch
    from torch import nn

    (block,) = [b for b in blocks() if b.lang == "python" and not b.skipped]
    # The reader's own loop, kept small: a real model, optimizer and backward pass, a few ms a step, so
    # the time goes to what the README's block does (Monitor start/stop, steps, summary), not to training.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(512, 32), nn.Linear(32, 512))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    loader = [torch.randint(0, 512, (4, 33), generator=g) for _ in range(6)]

    def train_step(batch: torch.Tensor) -> None:
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 512), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    namespace = {"loader": loader, "train_step": train_step, "__name__": "__readme__"}
    exec(compile(block.code, f"README.md:{block.line}", "exec"), namespace)  # the README's own code, verbatim

    assert "step_time_mean_s" in capsys.readouterr().out  # the block prints the summary
    run = namespace["run"]
    steps = [e for e in run.events.to_pylist() if e["kind"] == "step"]
    assert len(steps) == len(loader), "the README's loop should record one step event per batch"
    metrics = namespace["powertrain"].summary(workdir / "runs/try2")["metrics"]
    assert metrics["step_time_mean_s"] is not None, "the README promises measured step times"
    assert metrics["tokens_per_s"] is not None, "the README's step(..., tokens=) should give a throughput"
