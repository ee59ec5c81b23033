"""Count the memory traffic of powertrain's own trainer, op by op, and write the table the predictor reads.

The built-in trainer (src/powertrain/workload/) is eager PyTorch: fp32 master weights under bf16
autocast (every Linear casts its weight and its input), RoPE in fp32, grouped-query K/V repeated,
unfused SwiGLU and residual adds, an fp32 cross-entropy, torch.optim.AdamW's multi-tensor (foreach)
step. Its memory-bound work is therefore several times what Megatron-Core's fused kernels move, and
the predictor has to know it (the built-in engine, predict/engines.py).

This script runs one forward, backward and optimizer step of the real models (workload.models) on
this CPU under a dispatch-level counter (every ATen op: bytes of its tensor inputs and outputs; views
are free; GEMMs and the attention kernel are counted apart, the predictor costs them from FLOPs), for
random small shapes, and fits the bytes per term of the shape by least squares:

* per layer and micro-batch: ``n·h`` (norms, casts, residuals), ``n·hq`` (RoPE on queries, the
  attention output), ``n·hkv`` (RoPE on keys, K/V repeats), ``n·f`` (the MLP's activation), ``P``
  (the layer's parameters: weight casts forward, gradient casts backward), and for MoE layers
  ``n·k·h`` (routed copies) and ``n·k·f`` (expert activations);
* per micro-batch for the model's ends: ``n·V`` (logits in bf16 and fp32, the loss), ``V·h``
  (embedding and output weights), ``n·h`` (final norm, embedding);
* the optimizer: bytes per parameter.

Two substitutions for what a GPU runs instead of this CPU: RMSNorm is counted as one fused kernel
(PyTorch's CUDA ``_fused_rms_norm``: forward reads x and writes y, backward reads x and dy and writes dx)
where the CPU runs it as five elementwise ops. ``n`` is tokens per micro-batch, ``h`` hidden,
``hq``/``hkv`` query and key/value widths, ``f`` the MLP width, ``V`` the vocabulary.

    python benchmarks/builtin_traffic.py [--write] [--samples 18]

``--write`` stores the fitted table in src/powertrain/predict/data/builtin_traffic.yaml (with the fit's
worst residual); tests/test_builtin_engine.py re-counts fresh shapes against it.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from powertrain.spec.model import ModelConfig
from powertrain.workload.models import build_model
from powertrain.workload.trainer import loss_fn

OUT = Path(__file__).resolve().parents[1] / "src" / "powertrain" / "predict" / "data" / "builtin_traffic.yaml"
FREE = {"view", "_unsafe_view", "transpose", "t", "expand", "permute", "unsqueeze", "squeeze", "select", "slice",
        "as_strided", "unbind", "split", "split_with_sizes", "alias", "detach", "_reshape_alias", "unflatten",
        "reshape", "lift_fresh", "empty", "new_empty", "new_empty_strided", "empty_strided", "_local_scalar_dense",
        "_record_function_enter_new", "_record_function_exit", "set_", "is_same_size"}
GEMM = {"mm", "addmm", "bmm", "baddbmm"}
ATTENTION = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"}
LAYER_TERMS = ("nh", "nhq", "nhkv", "nf", "params")
MOE_TERMS = ("nkh", "nkf", "expert_selects")
END_TERMS = ("nV", "Vh", "nh")
FAMILIES = ("llama", "gpt", "mixtral")


class ByteCounter(TorchDispatchMode):
    """Bytes of every ATen op's tensor inputs and outputs, split into elementwise, GEMM and attention."""

    def __init__(self) -> None:
        super().__init__()
        self.elementwise = 0
        self.gemm = 0
        self.attention = 0
        self.ops: collections.Counter[str] = collections.Counter()
        self.paused = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if self.paused or name in FREE:
            return out
        nbytes = 0

        def add(x: Any) -> None:
            nonlocal nbytes
            if isinstance(x, torch.Tensor):
                nbytes += x.numel() * x.element_size()
            elif isinstance(x, list | tuple):
                for y in x:
                    add(y)

        add(list(args))
        add(list((kwargs or {}).values()))
        add(out)
        if name in GEMM:
            self.gemm += nbytes
        elif name in ATTENTION:
            self.attention += nbytes
        else:
            self.elementwise += nbytes
            self.ops[name] += nbytes
        return out


_ACTIVE: list[ByteCounter] = []


class _FusedRMSNorm(torch.autograd.Function):
    """RMSNorm counted as the one fused kernel a CUDA build runs (the CPU's five ops are not counted)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float | None) -> torch.Tensor:  # type: ignore[override]
        counter = _ACTIVE[-1]
        counter.paused = True
        with torch.enable_grad():
            xd, wd = x.detach().requires_grad_(), w.detach().requires_grad_()
            y = torch.rms_norm(xd, (x.shape[-1],), wd, eps)
        counter.paused = False
        rows = x.numel() // x.shape[-1]
        counter.elementwise += 2 * x.numel() * x.element_size() + w.numel() * w.element_size() + 4 * rows
        ctx.save_for_backward(xd, wd, y)
        return y.detach()

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        xd, wd, y = ctx.saved_tensors
        counter = _ACTIVE[-1]
        counter.paused = True
        gx, gw = torch.autograd.grad(y, (xd, wd), gy)
        counter.paused = False
        rows = xd.numel() // xd.shape[-1]
        counter.elementwise += 3 * xd.numel() * xd.element_size() + 2 * wd.numel() * wd.element_size() + 4 * rows
        return gx, gw, None


def _fused_rms_forward(self: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    return _FusedRMSNorm.apply(x, self.weight, self.eps)


def count_step(cfg: ModelConfig, batch: int, precision: str) -> dict[str, float]:
    """Elementwise bytes of one forward and one backward (and the optimizer's per parameter) of ``cfg``."""
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randint(0, cfg.vocab, (batch, cfg.seq_len + 1))
    saved = nn.RMSNorm.forward
    nn.RMSNorm.forward = _fused_rms_forward  # type: ignore[method-assign]
    try:
        out = {}
        for phase in ("forward", "backward", "optimizer"):
            counter = ByteCounter()
            _ACTIVE.append(counter)
            with counter:
                if phase == "forward":
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                        loss = loss_fn(model(x[:, :-1]), x[:, 1:])
                elif phase == "backward":
                    loss.backward()
                else:
                    opt.step()
            _ACTIVE.pop()
            out[phase] = float(counter.elementwise)
        out["params"] = float(sum(p.numel() for p in model.parameters()))
        return out
    finally:
        nn.RMSNorm.forward = saved  # type: ignore[method-assign]


def features(cfg: ModelConfig, batch: int) -> dict[str, float]:
    """The shape terms of :data:`LAYER_TERMS` (× layers), :data:`MOE_TERMS` and :data:`END_TERMS`."""
    n, h, f, v = batch * cfg.seq_len, cfg.hidden, cfg.ffn, cfg.vocab
    hq, hkv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    moe = cfg.experts > 1
    mats = 2 if cfg.family == "gpt" else 3
    per_layer = h * hq + 2 * h * hkv + hq * h + (cfg.experts if moe else 1) * mats * h * f + (h * cfg.experts if moe else 0)
    L = cfg.layers
    out = {"nh": L * n * h, "nhq": L * n * hq, "nhkv": L * n * hkv, "nf": 0.0 if moe else L * n * f,
           "params": L * per_layer, "nkh": L * n * cfg.top_k * h if moe else 0.0,
           "nkf": L * n * cfg.top_k * f if moe else 0.0,
           # the experts' weights are stacked (E, h, f) and indexed per expert: the backward of each index writes a
           # gradient of the whole stack, so E experts move E × the stack (quadratic in E)
           "expert_selects": L * cfg.experts * cfg.experts * mats * h * f if moe else 0.0,
           "end_nV": n * v, "end_Vh": v * h, "end_nh": n * h}
    return out


def random_config(rng: random.Random, family: str) -> tuple[ModelConfig, int]:
    hd = rng.choice([16, 32])
    h = rng.choice([128, 192, 256])
    heads = h // hd
    kv = heads if family == "gpt" else rng.choice([d for d in (1, 2, 4, heads) if heads % d == 0])
    own_hd = rng.choice([0, 0, 48]) if family != "gpt" else 0  # a head width of its own separates n·h from n·hq
    extra: dict[str, Any] = {"attention_head_dim": own_hd} if own_hd else {}
    if family == "mixtral":
        extra.update(experts=rng.choice([2, 4]), top_k=rng.choice([1, 2]))
    cfg = ModelConfig(name=f"count-{family}", family=family, layers=rng.choice([1, 2, 3]), hidden=h,  # type: ignore[arg-type]
                      ffn=rng.choice([256, 384, 512]), heads=heads, kv_heads=kv, vocab=rng.choice([128, 256, 512]),
                      seq_len=rng.choice([16, 32, 48]), **extra)
    return cfg, rng.choice([1, 2, 3])


def fit(family: str, precision: str, samples: int, seed: int = 0) -> dict[str, Any]:
    """Bytes per shape term (forward, backward) and optimizer bytes per parameter, with the fit's residual."""
    rng = random.Random(f"{family}/{precision}/{seed}")
    terms = list(LAYER_TERMS) + (list(MOE_TERMS) if family == "mixtral" else []) + [f"end_{t}" for t in END_TERMS]
    if family == "mixtral":
        terms.remove("nf")
    rows, y_f, y_b, per_param = [], [], [], []
    for _ in range(samples):
        cfg, batch = random_config(rng, family)
        got = count_step(cfg, batch, precision)
        feat = features(cfg, batch)
        rows.append([feat[t] for t in terms])
        y_f.append(got["forward"])
        y_b.append(got["backward"])
        per_param.append(got["optimizer"] / got["params"])
    x = np.asarray(rows)
    out: dict[str, Any] = {"terms": terms}
    for key, y in (("forward", np.asarray(y_f)), ("backward", np.asarray(y_b))):
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        out[key] = {t: round(float(v), 3) for t, v in zip(terms, coef, strict=True)}
        out[f"{key}_worst_residual"] = round(float(np.max(np.abs(x @ coef - y) / y)), 4)
    out["optimizer_bytes_per_param"] = round(float(np.median(per_param)), 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"store the table in {OUT}")
    ap.add_argument("--samples", type=int, default=18)
    args = ap.parse_args()
    table: dict[str, Any] = {
        "about": "bytes of HBM traffic of powertrain's built-in trainer per shape term (benchmarks/builtin_traffic.py): "
                 "a dispatch-level count of every ATen op of one step of workload.models, least-squares per term; "
                 "RMSNorm counted as CUDA's fused kernel; GEMMs and attention excluded (costed from FLOPs)",
        "torch": str(torch.__version__), "families": {}}
    for family in FAMILIES:
        for precision in ("bf16", "fp32"):
            got = fit(family, precision, args.samples)
            table["families"].setdefault(family, {})[precision] = got
            print(f"{family:8s} {precision}: forward {got['forward']} (worst {got['forward_worst_residual']:.1%}); "
                  f"backward worst {got['backward_worst_residual']:.1%}; optimizer {got['optimizer_bytes_per_param']} B/param")
    if args.write:
        OUT.write_text(yaml.safe_dump(table, sort_keys=False))
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
