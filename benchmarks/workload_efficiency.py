"""How much does the built-in trainer cost over a plain PyTorch loop, and how does DP-2 scale here?

1. Overhead: step time of ``powertrain run`` (1 process under torchrun, telemetry sampler on, step
   and phase markers written) vs a plain PyTorch loop over the same model, batches, micro-batching
   and optimizer, in this process. Target: ratio ≤ 1.10.
2. Scaling: tokens/s of ``powertrain run`` with DP-2 (DDP, 2 processes) vs 1 process, same global
   batch. On a 2-core machine shared with other work this shows what 2 ranks get, not a GPU figure.

Both sides are measured in this run, alternating, and compared as ratios of medians.

    python benchmarks/workload_efficiency.py [--model llama3-tiny] [--steps 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from powertrain.launch.local import launch_local
from powertrain.spec.run import RunConfig
from powertrain.store import read_events
from powertrain.workload.data import Batches
from powertrain.workload.models import build_model


def config(model: str, world: int, steps: int, micro: int, batch: int) -> RunConfig:
    return RunConfig(name=f"bench-{world}", model=model, hardware={"devices_per_node": world},
                     knobs={"global_batch": batch, "micro_batch": micro},
                     protocol={"warmup_steps": 3, "measured_steps": steps})


def plain_loop(cfg: RunConfig) -> list[float]:
    """Seconds per measured step of a textbook loop (no markers, no telemetry, no process group)."""
    torch.manual_seed(cfg.knobs.seed)
    model = build_model(cfg.model, moe_aux_coeff=cfg.knobs.moe_aux_coeff)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.knobs.lr)
    data = Batches(cfg.data, cfg.model, cfg.knobs.global_batch, cfg.knobs.seed)
    n_micro = cfg.knobs.global_batch // cfg.knobs.micro_batch
    times = []
    for i in range(cfg.protocol.warmup_steps + cfg.protocol.measured_steps):
        t0 = time.perf_counter()
        for mb in data.local(i).split(cfg.knobs.micro_batch):
            loss = F.cross_entropy(model(mb[:, :-1]).flatten(0, 1).float(), mb[:, 1:].flatten()) / n_micro
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= cfg.protocol.warmup_steps:
            times.append(time.perf_counter() - t0)
    return times


def trainer_steps(cfg: RunConfig, out: Path, threads: int) -> list[float]:
    """Seconds per measured step of rank 0 from the events of a ``powertrain run``."""
    res = launch_local(cfg, out, echo=False, env={"OMP_NUM_THREADS": str(threads)})
    if res.status != "ok":
        raise SystemExit(f"benchmark run failed: {res.reason}\n{res.info.get('error_tail', '')}")
    ev = read_events(out).to_pylist()
    return [(e["t_end_ns"] - e["t_start_ns"]) / 1e9 for e in ev
            if e["kind"] == "step" and e["window"] == "measured" and e["rank"] == 0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama3-tiny")
    p.add_argument("--steps", type=int, default=10, help="measured steps per run")
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2, help="alternating repeats of each side")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads per process, the same on both sides (torchrun's default for >1 rank is 1; "
                        "on a shared 2-core machine more threads spin against each other)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    one = config(args.model, 1, args.steps, args.micro, args.batch)
    two = config(args.model, 2, args.steps, args.micro, args.batch)
    plain: list[float] = []
    built: list[float] = []
    dp2: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            plain += plain_loop(one)
            built += trainer_steps(one, Path(tmp) / f"one-{r}", args.threads)
            dp2 += trainer_steps(two, Path(tmp) / f"two-{r}", args.threads)
    tokens = args.batch * one.model.seq_len
    med = {k: statistics.median(v) for k, v in (("plain", plain), ("trainer", built), ("dp2", dp2))}
    print(f"model {args.model}, global batch {args.batch} × seq {one.model.seq_len}, micro-batch {args.micro}, "
          f"{args.steps} measured steps × {args.repeats} repeats, torch threads {torch.get_num_threads()}")
    print(f"plain PyTorch loop        : median step {med['plain'] * 1e3:8.1f} ms  ({tokens / med['plain']:,.0f} tokens/s)")
    print(f"powertrain run, 1 process : median step {med['trainer'] * 1e3:8.1f} ms  ({tokens / med['trainer']:,.0f} tokens/s)")
    print(f"powertrain run, DP-2 (DDP): median step {med['dp2'] * 1e3:8.1f} ms  ({tokens / med['dp2']:,.0f} tokens/s)")
    ratio = med["trainer"] / med["plain"]
    print(f"overhead ratio trainer/plain = {ratio:.3f}  (target ≤ 1.10: {'met' if ratio <= 1.10 else 'NOT met'})")
    print(f"DP-2 speed-up over 1 process = {med['trainer'] / med['dp2']:.2f}×  "
          f"(scaling efficiency {med['trainer'] / med['dp2'] / 2:.0%} of ideal 2×)")


if __name__ == "__main__":
    main()
