"""A plain PyTorch training loop (a small transformer on synthetic tokens) for trying the monitor.

    powertrain monitor --out runs/loop -- python examples/cpu_train_loop.py --steps 30
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def build(vocab: int = 512, d: int = 128, layers: int = 2, seq: int = 64) -> nn.Module:
    layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, batch_first=True, norm_first=True)
    return nn.Sequential(nn.Embedding(vocab, d), nn.TransformerEncoder(layer, layers), nn.Linear(d, vocab))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    args = p.parse_args()
    torch.manual_seed(0)
    model = build(seq=args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for step in range(args.steps):
        x = torch.randint(0, 512, (args.batch, args.seq + 1), generator=g)
        logits = model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 512), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
