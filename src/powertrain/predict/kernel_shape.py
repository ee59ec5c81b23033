"""How fast a GEMM or a fused-attention kernel of a given shape runs, relative to a large one of its kind.

A GPU kernel splits its output into tiles, one thread block (CTA) each, and runs them in **waves** of one
block per streaming multiprocessor (SM; compute unit on AMD). Three losses follow from the shape alone
(NVIDIA, "Matrix Multiplication Background User's Guide", Deep Learning Performance documentation: tile
quantisation, wave quantisation, and the library's choice of tile size):

* **tile quantisation** — an output of m × n is covered by ⌈m/tm⌉·⌈n/tn⌉ tiles of tm × tn; the padding
  computes nothing;
* **wave quantisation** — t tiles on S SMs take ⌈t/S⌉ waves; the last wave leaves SMs idle;
* **tile size** — a smaller tile reloads its operands more often per multiply-add (arithmetic intensity
  tm·tn/(tm + tn) elements per element loaded), so it runs slower per SM; the library (cuBLAS, hipBLASLt)
  picks, among the tiles it has, the one that finishes the GEMM soonest, which is what is modelled: the
  best of :data:`GEMM_TILES`.

Each tile also pays a fixed mainloop fill and epilogue, worth :data:`K_FILL` elements of its reduction
dimension k. The factor is normalised so that a large GEMM (many full waves of the largest tile, long k)
runs at 1: the calibrated ``gemm_eff_*`` stays the efficiency of large GEMMs.

Fused attention (FlashAttention-2/3, cuDNN) runs one block per (sequence, head, block of
:data:`ATTN_Q_BLOCK` query rows): at few heads per device (high TP) and a small micro-batch its blocks fill a
fraction of the last wave.

Why it matters for the choice a user makes: micro-batch, TP and EP change m (tokens per micro-batch and
per expert) and n (hidden ÷ TP), so these losses are what makes a larger micro-batch faster per token
at high TP, against the pipeline bubble that makes it slower at a fixed global batch (predict/steptime.py).
A device without a known SM count (a host CPU) gets no wave model: factor 1.
"""

from __future__ import annotations

import math
from functools import lru_cache

# CTA tiles (tm, tn) the GEMM libraries choose among, largest first (CUTLASS and cuBLAS Hopper/Ampere tiles;
# hipBLASLt's are of the same sizes).
GEMM_TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
# Operand feed cost, in multiply-adds per element loaded, at which a tile's mainloop runs at half its
# tensor-core rate: the per-tile efficiency is I/(I + FEED_I0) with I = tm·tn/(tm + tn). With 16, a 128×128
# tile runs at 95 % of a 256×128 one and a 64×64 at 79 % (the order of CUTLASS profiler figures).
FEED_I0 = 16.0
# Mainloop fill and epilogue of one tile, in elements of k: a few pipeline stages of 64 (CUTLASS defaults).
K_FILL = 128.0
ATTN_Q_BLOCK = 128  # query rows per attention thread block (FlashAttention-2/3)


def _tile_rate(tm: int, tn: int) -> float:
    i = tm * tn / (tm + tn)
    return i / (i + FEED_I0)


_BEST_RATE = max(_tile_rate(tm, tn) for tm, tn in GEMM_TILES)


@lru_cache(maxsize=1 << 16)
def gemm_efficiency(m: float, k: float, n: float, sms: int, groups: float = 1.0) -> float:
    """Throughput of ``groups`` m×k·k×n GEMMs in one launch (a grouped GEMM: each group's own tiles, all of
    them filling the waves together) on ``sms`` SMs, relative to a large GEMM (≤ 1; module doc)."""
    mi, ni = max(1, math.ceil(m - 1e-9)), max(1, math.ceil(n - 1e-9))
    g = max(1, math.ceil(groups - 1e-9))
    best = 0.0
    for tm, tn in GEMM_TILES:
        tiles = g * math.ceil(mi / tm) * math.ceil(ni / tn)
        waves = math.ceil(tiles / sms)
        useful = g * m * n / (waves * sms * tm * tn)  # padding and the idle part of the last wave
        e = useful * _tile_rate(tm, tn)
        if e > best:
            best = e
    return best / _BEST_RATE * k / (k + K_FILL)


@lru_cache(maxsize=1 << 14)
def attention_efficiency(sequences: float, heads: float, seq_len: float, sms: int) -> float:
    """Throughput of a fused attention kernel over ``sequences`` × ``heads`` (per device) × ``seq_len`` query
    rows relative to one that fills every wave: its blocks over ⌈blocks/S⌉ waves (module doc)."""
    blocks = max(1, math.ceil(sequences - 1e-9)) * max(1, math.ceil(heads - 1e-9)) * math.ceil(seq_len / ATTN_Q_BLOCK)
    return blocks / (math.ceil(blocks / sms) * sms)
