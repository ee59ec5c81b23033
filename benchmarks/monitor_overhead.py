"""How much does the sampler slow down training, and how much CPU does it use itself?

A CPU training-like loop (a small transformer, forward + backward + AdamW, torch using every core)
is timed with and without the per-node sampler at 20 Hz, alternating on/off so that drift in the
machine's speed hits both sides equally. Prints the median slowdown ratio (target ≤ 1.01) and the
sampler's own CPU share (CPU seconds of the sampler process ÷ wall seconds, % of one core).

    .venv/bin/python benchmarks/monitor_overhead.py [--pairs 6] [--steps 25] [--rate 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from powertrain import Monitor


def build_loop(steps: int):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(192, nhead=4, dim_feedforward=768, batch_first=True, norm_first=True)
    model = nn.Sequential(nn.Embedding(512, 192), nn.TransformerEncoder(layer, 3), nn.Linear(192, 512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 512, (steps, 8, 129), generator=torch.Generator().manual_seed(0))

    def loop() -> float:
        t0 = time.perf_counter()
        for x in data:
            loss = nn.functional.cross_entropy(model(x[:, :-1]).reshape(-1, 512), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return time.perf_counter() - t0

    return loop


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--rate", type=float, default=20.0)
    args = p.parse_args()
    loop = build_loop(args.steps)
    loop()  # warm-up: allocator, kernels
    off, on, shares = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            off.append(loop())
            with Monitor(out=Path(tmp) / f"run{i}", rate_hz=args.rate) as m:
                assert m.sampler is not None
                c0, w0 = cpu_seconds(m.sampler.pid), time.perf_counter()
                on.append(loop())
                shares.append((cpu_seconds(m.sampler.pid) - c0) / (time.perf_counter() - w0))
            print(f"pair {i}: without {off[-1]:.3f} s, with sampler {on[-1]:.3f} s, "
                  f"ratio {on[-1] / off[-1]:.4f}", flush=True)
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    print(f"\nloop: {args.steps} steps, torch threads {torch.get_num_threads()}, sampler {args.rate:g} Hz")
    print(f"median time without sampler: {statistics.median(off):.3f} s")
    print(f"median time with sampler:    {statistics.median(on):.3f} s")
    print(f"slowdown ratio (median of pairs): {statistics.median(ratios):.4f}  (target <= 1.01)")
    print(f"slowdown ratio (median on / median off): {statistics.median(on) / statistics.median(off):.4f}")
    print(f"sampler CPU share: {100 * statistics.median(shares):.2f} % of one core "
          f"({100 * statistics.median(shares) / os.cpu_count():.2f} % of the machine)")


if __name__ == "__main__":
    main()
