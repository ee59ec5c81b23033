"""Lightning callback: a 2-rank torchrun run → one run directory, per-rank steps, report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning", reason="needs the [lightning] extra: pip install 'powertrain[lightning]'")

from powertrain.integrations.lightning import batch_counts
from test_integrations_hf import check_two_rank_run

SCRIPT = Path(__file__).parent / "fixtures" / "trainers" / "lightning_tiny.py"


def test_batch_counts():
    ids = torch.zeros(4, 16, dtype=torch.long)
    assert batch_counts(ids) == (4, 64)
    assert batch_counts((ids, torch.zeros(4))) == (4, 64)
    assert batch_counts({"input_ids": ids, "labels": ids}) == (4, 64)
    assert batch_counts(torch.zeros(4, 3)) == (4, None)  # features, not token ids
    assert batch_counts("text") == (None, None)


@pytest.mark.slow
def test_lightning_two_ranks_under_torchrun(tmp_path):
    out = tmp_path / "pl-run"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(SCRIPT), str(out)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    check_two_rank_run(out, steps=5, samples=4, tokens=4 * 16)
