"""Deterministic training batches: synthetic token sequences, or windows of a byte-tokenized text file.

Sample ``j`` of step ``s`` is a pure function of ``(seed, s, j)``, so any layout can load exactly
the samples its data-parallel rank owns and a single-process run sees the same global batch — the
basis of the loss-equivalence checks. Each sample has ``seq_len + 1`` tokens (inputs and the
next-token targets).

Synthetic sequences are learnable on purpose (``t_i = (a + d·i) mod vocab`` with a random start
``a`` and stride ``d``), so the loss falls and a broken gradient sync shows. Text is read as bytes
(token = byte value, vocab 256) with windows at deterministic pseudo-random offsets.
"""

from __future__ import annotations

from pathlib import Path

import torch

from powertrain.spec.model import ModelConfig
from powertrain.spec.run import Data

MAX_STRIDE = 8


class Batches:
    """Global and per-data-parallel-rank batches of ``global_batch`` samples per step."""

    def __init__(self, data: Data, model: ModelConfig, global_batch: int, seed: int = 0) -> None:
        self.seq_len, self.vocab, self.global_batch, self.seed = model.seq_len, model.vocab, global_batch, seed
        self.text: torch.Tensor | None = None
        if data.kind == "text":
            if data.path is None:
                raise ValueError("data.kind text needs data.path (a plain text file)")
            raw = Path(data.path).read_bytes()
            if len(raw) < self.seq_len + 2:
                raise ValueError(f"{data.path} has {len(raw)} bytes, fewer than seq_len + 2 = {self.seq_len + 2}")
            self.text = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()

    def sample(self, step: int, j: int) -> torch.Tensor:
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 100_003 + j)
        n = self.seq_len + 1
        if self.text is not None:
            start = int(torch.randint(0, self.text.numel() - n, (1,), generator=g))
            return self.text[start:start + n]
        a = int(torch.randint(0, self.vocab, (1,), generator=g))
        d = int(torch.randint(1, MAX_STRIDE, (1,), generator=g))
        return (a + d * torch.arange(n)) % self.vocab

    def local(self, step: int, dp_rank: int = 0, dp: int = 1) -> torch.Tensor:
        """``(global_batch/dp, seq_len+1)`` tokens: data-parallel rank ``dp_rank``'s contiguous share."""
        per = self.global_batch // dp
        return torch.stack([self.sample(step, j) for j in range(dp_rank * per, (dp_rank + 1) * per)])
