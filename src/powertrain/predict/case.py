"""The flat description the model computes on, and where ranks sit.

:class:`Case` holds plain numbers (no pydantic) so one prediction stays in tens of microseconds.
It is built from a :class:`~powertrain.spec.run.RunConfig` by :func:`case_from_run_config`, or
directly (the calibration benchmark builds it from published runs whose models the spec catalog
does not name, e.g. with shared experts or fp8).

Rank placement (Megatron order): global rank = tp fastest, then cp, then dp (whose consecutive
``ep`` ranks form an expert group), then pp. A group of ranks spaced ``stride`` apart with ``size``
members spans ``stride × size`` consecutive ranks; it stays on the fast link when that span fits in
one NVLink domain (a node, or 72 GPUs of an NVL72 rack). So TP groups stay inside a node whenever
``tp ≤ devices_per_node``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from powertrain.core.lora import check_targets
from powertrain.hardware import (
    DeviceSpec,
    HostProbe,
    cpu_device,
    get_device,
    is_cpu_name,
    probe_host,
    rank_threads,
)

GATED_FAMILIES = ("llama", "mixtral")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
ENGINES = ("megatron", "builtin")  # predict/engines.py
# low-precision recipes predict/precision.py knows, per precision
RECIPES = {"fp8": ("delayed", "current", "blockwise", "mxfp8"), "fp4": ("nvfp4",)}
# PyTorch DDP's bucket_cap_mb counts MiB of gradients; powertrain's trainer keeps fp32 parameters (autocast)
_DDP_GRAD_BYTES = 4.0


@dataclass(slots=True)
class Case:
    """One configuration, flattened. Sizes as in ModelConfig; degrees as in Layout."""

    # model
    layers: int
    hidden: int
    ffn: int  # dense FFN inner size
    heads: int
    kv_heads: int
    vocab: int
    seq_len: int
    experts: int = 1
    top_k: int = 1
    moe_ffn: int = 0  # per-expert FFN size (0: same as ffn)
    shared_experts: int = 0
    gated: bool = True  # SwiGLU-style MLP (3 matrices) vs GELU (2)
    tied_embeddings: bool = False
    # modern MoE and attention (0 / None: the plain transformer's value; see predict/moe.py)
    head_dim: int = 0  # attention head width (0: hidden // heads); Qwen3, gpt-oss set it apart from hidden
    shared_ffn: int = 0  # total width of the shared experts (0: ffn × shared_experts); DeepSeek-V3: 2048
    dense_layers: int = 0  # leading layers with a dense MLP of width ``ffn`` in an MoE model (DeepSeek-V3: 3)
    q_lora_rank: int = 0  # MLA (DeepSeek-V2/V3, Kimi K2): query down-projection rank (0: none)
    kv_lora_rank: int = 0  # MLA: compressed K/V rank; > 0 turns multi-head latent attention on
    qk_rope_dim: int = 0  # MLA: rotary part of the query/key head (the rest is head_dim)
    v_head_dim: int = 0  # MLA: value head width (0: head_dim)
    mtp_layers: int = 0  # multi-token-prediction modules (each one extra layer and logit head)
    capacity_factor: float | None = None  # MoE token capacity per expert ÷ the mean; None: dropless
    # layout
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor parallelism; None: experts split like the dense layers (tp) and EP
    #   groups sit inside DP (older Megatron); set (parallel folding): EP spans tp·cp·dp, ranks etp apart
    vp: int = 1
    sequence_parallel: bool = False
    fsdp: bool = False
    distributed_optimizer: bool = False
    # how the optimizer states are sharded: Megatron's distributed optimizer (gradients reduce-scattered,
    # parameters all-gathered) or, True, powertrain's trainer (gradients all-reduced as without it, then
    # each parameter broadcast from its owner, one call per parameter tensor: workload/parallel/zero.py)
    owner_broadcast_optimizer: bool = False
    pp_schedule: str = "1f1b"
    pp_split: str | list[int] = "even"
    # knobs
    micro_batch: int = 1
    global_batch: int = 8
    recompute: str = "none"  # none | selective | full
    precision: str = "bf16"  # fp32 | tf32 | bf16 | fp16 | fp8 | fp4
    recipe: str = ""  # low-precision recipe: delayed | current | blockwise | mxfp8 | nvfp4 ("" = the precision's usual one)
    overlap_tp: bool = False
    overlap_dp: bool = True
    overlap_fsdp: bool = True
    overlap_param_gather: bool = False
    overlap_ep: bool = False  # EP dispatcher overlap (all-to-all hidden behind another micro-batch's compute)
    # FSDP frees each layer's gathered weights after its forward and gathers them again for its backward;
    # False (FSDP2 reshard_after_forward=False): they stay gathered until the backward, no second gather
    fsdp_reshard: bool = True
    # gradient bucket, in parameters: the last bucket's reduction starts after the backward ends, so it
    # stays exposed whatever the overlap (Megatron: 40 M; PyTorch DDP: bucket_cap_mb of fp32 gradients)
    dp_bucket_params: float = 40e6
    # FSDP that gathers parameter by parameter (DeepSpeed ZeRO-3, 2021): each rank's collectives run on its
    # own NIC share (no striping over the node's NICs); prefetched like FSDP; gradients reduced in 16 bits
    fsdp_per_param: bool = False
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None  # the SM clock lock's upper bound (the clock under load); None: unlocked
    measured_steps: int = 1  # steps of the measured window (for window totals such as energy_j)
    warmup_steps: int = 0  # steps before it (the devices heat up from idle over the whole run)
    min_measured_s: float = 0.0  # the trainer extends the measured window to at least this long
    # LoRA fine-tuning (predict/lora.py): adapters of this rank on these targets (core.lora.TARGETS) beside
    # frozen base weights; rank 0: every weight trains (pre-training, full fine-tuning)
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    moe_imbalance: float | None = None  # None: the calibration's default
    # attention kernel: "fused" (Transformer Engine's cuDNN fused attention, FlashAttention-3 class on
    # Hopper and later) or "flash2" (FlashAttention-2, what PyTorch-native stacks run: SDPA's flash
    # backend, the flash-attn package); see precision.attention_kernel_ratio
    attention_kernel: str = "fused"
    # the training stack (predict/engines.py): "megatron" (Megatron-Core/NeMo fused kernels: what published runs
    # and the shipped calibration describe) or "builtin" (powertrain's own eager PyTorch trainer: every RunConfig)
    engine: str = "megatron"
    # hardware
    device: DeviceSpec = field(default_factory=lambda: get_device("h100-sxm"))
    devices_per_node: int = 1

    # derived once (dataclasses.replace recomputes them)
    world: int = field(init=False, default=0)
    is_moe: bool = field(init=False, default=False)
    _domain: int = field(init=False, default=0, repr=False)

    def __post_init__(self) -> None:
        # a misspelt name would silently mean the default (GPipe read as 1F1B, "FP8" priced at the fp32 peak)
        if self.pp_schedule not in PP_SCHEDULES:
            raise ValueError(f"pp_schedule {self.pp_schedule!r}: use one of {', '.join(PP_SCHEDULES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: use one of {', '.join(PRECISIONS)}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine {self.engine!r}: use one of {', '.join(ENGINES)}")
        if self.recipe and self.recipe not in RECIPES.get(self.precision, ()):
            known = ", ".join(f"{p}: {'/'.join(r)}" for p, r in RECIPES.items())
            raise ValueError(f"recipe {self.recipe!r} does not apply to precision {self.precision}; recipes by "
                             f"precision: {known} (or none: the generation's usual one)")
        if self.lora_rank < 0 or bool(self.lora_rank) != bool(self.lora_targets):
            raise ValueError(f"lora_rank {self.lora_rank} with lora_targets {list(self.lora_targets)}: give a rank ≥ 1 "
                             "and its targets for LoRA, or rank 0 and no targets for full training")
        if self.lora_targets:
            check_targets(self.lora_targets)
        self.world = self.tp * self.pp * self.dp * self.cp
        self.is_moe = self.experts > 1
        self._domain = max(self.devices_per_node, min(self.device.node.nvlink_domain, self.world))

    def window_steps(self, step_s: float) -> int:
        """Steps of the measured window at ``step_s`` per step: measured_steps, and more until min_measured_s
        has passed (what workload/run_loop.py does)."""
        if self.min_measured_s > 0 and step_s > 0:
            return max(self.measured_steps, math.ceil(self.min_measured_s / step_s - 1e-9))
        return self.measured_steps

    @property
    def nodes(self) -> int:
        """Nodes the ranks occupy (a partly used node counts whole: its host draws all the same). Derived, so
        it cannot disagree with the layout the way a separately given count could."""
        return max(1, -(-self.world // max(1, self.devices_per_node)))

    @property
    def lora(self) -> bool:
        """LoRA fine-tuning: frozen base weights (no weight gradients, no optimizer states), trained adapters."""
        return self.lora_rank > 0

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn or self.ffn

    @property
    def shared_width(self) -> int:
        """Total FFN width of the shared experts (0: none)."""
        return self.shared_ffn or self.ffn * self.shared_experts

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is routed (all but the leading dense ones)."""
        return max(0, self.layers - self.dense_layers) if self.is_moe else 0

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step per pipeline (gradient-accumulation steps).

        A replica runs whole micro-batches: a global batch smaller than micro_batch × dp cannot run (it
        used to be floored at one micro-batch, costing a full micro-batch for part of one)."""
        per_step = self.micro_batch * self.dp
        if self.global_batch < per_step:
            alt = f" or micro_batch ≤ {self.global_batch // self.dp}" if self.global_batch >= self.dp else ""
            raise ValueError(
                f"global_batch ({self.global_batch}) is smaller than micro_batch × dp ({self.micro_batch} × {self.dp}):"
                f" each data-parallel replica needs a whole micro-batch; use global_batch ≥ {per_step}{alt}")
        return self.global_batch // per_step

    def peers_in_domain(self, stride: int, size: int) -> int:
        """Members of such a group (including oneself) inside one's NVLink domain."""
        d = self._domain
        return max(1, min(size, d // stride)) if stride <= d else 1


def cpu_probe_for(ranks_per_node: int, calibration: object | None = None) -> HostProbe:
    """The host probe a CPU prediction uses: the calibration's, for the thread count the ranks would run
    with (:func:`~powertrain.hardware.rank_threads`), else the calibration's nearest one scaled per
    thread, else (a profile with no probe at all) a fresh probe of this host (its ``source`` says so)."""
    threads = rank_threads(ranks_per_node)
    stored = getattr(calibration, "host_probe", None)
    got = stored(threads) if callable(stored) else None
    if got is not None:
        return got
    # a profile fitted on CPU runs of other thread counts: its nearest probe, matmul rate scaled per
    # thread (this machine's reading would differ from the one the coefficients were fitted against)
    recs = list(getattr(calibration, "host_probes", []) or [])
    if recs:
        from dataclasses import replace

        rec = min(recs, key=lambda r: abs(int(r.get("threads", 1)) - threads))
        near = stored(int(rec["threads"])) if callable(stored) else None
        if near is not None:
            scale = threads / max(1, near.threads)
            return replace(near, matmul_flops=near.matmul_flops * scale, threads=threads,
                           source=f"{near.source}; scaled from {near.threads} to {threads} thread(s)")
    return probe_host(threads)


def case_from_run_config(cfg: object, device: DeviceSpec | None = None, *,
                         host_probe: HostProbe | None = None, calibration: object | None = None) -> Case:
    """Flatten a :class:`~powertrain.spec.run.RunConfig` (resolving dp from the world size).

    ``device`` is one rank's device as is. Otherwise a CPU run's device is one rank's share of a
    host probe: ``host_probe`` (a measured run's recorded one), else the ``calibration``'s, else a
    fresh probe of this host.
    """
    from powertrain.spec.run import RunConfig

    assert isinstance(cfg, RunConfig)
    m, k, hw = cfg.model, cfg.knobs, cfg.hardware
    lay = cfg.layout
    dp = lay.dp
    if dp is None:
        rest = lay.tp * lay.pp * lay.cp
        if hw.world % rest:
            lay.resolve(hw.world)  # raises with the fix
        dp = hw.world // rest
    ov = k.overlap
    lora = cfg.task.lora()
    if device is not None:
        dev = device
    elif is_cpu_name(hw.device):
        # ranks on one host CPU split its cores (see hardware.cpu_device)
        dev = cpu_device(host_probe or cpu_probe_for(hw.devices_per_node, calibration), hw.devices_per_node)
    else:
        dev = get_device(hw.device)
        cooling = getattr(hw, "cooling", None)
        if cooling is not None and cooling != dev.cooling:  # the spec's nodes are cooled otherwise than the catalog's
            from dataclasses import replace

            from powertrain.hardware import cooling_thermal

            dev = replace(dev, cooling=cooling, thermal=cooling_thermal(cooling))
    return Case(
        layers=m.layers, hidden=m.hidden, ffn=m.dense_ffn or m.ffn, heads=m.heads, kv_heads=m.kv_heads, vocab=m.vocab,
        seq_len=m.seq_len, experts=m.experts, top_k=m.top_k, moe_ffn=m.ffn if m.experts > 1 else 0,
        head_dim=m.attention_head_dim, shared_ffn=m.shared_ffn, dense_layers=m.dense_layers,
        q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank, qk_rope_dim=m.qk_rope_dim, v_head_dim=m.v_head_dim,
        mtp_layers=m.mtp_layers,
        gated=m.family in GATED_FAMILIES, tied_embeddings=m.tied_embeddings,
        tp=lay.tp, pp=lay.pp, dp=dp, cp=lay.cp, ep=lay.ep, etp=lay.etp, vp=lay.virtual_stages,
        sequence_parallel=lay.sequence_parallel, fsdp=lay.fsdp,
        distributed_optimizer=bool(getattr(lay, "distributed_optimizer", False)),
        owner_broadcast_optimizer=True,  # a RunConfig is what powertrain's own trainer runs
        pp_schedule=lay.pp_schedule, pp_split=lay.pp_split,
        micro_batch=k.micro_batch, global_batch=k.global_batch, recompute=k.recompute,
        precision=k.precision, recipe=k.fp8_recipe or "", overlap_tp=ov.async_tp, overlap_dp=ov.grad_reduce_in_backward,
        overlap_fsdp=ov.fsdp_prefetch, fsdp_reshard=ov.fsdp_reshard_after_forward,
        dp_bucket_params=ov.ddp_bucket_mb * 2**20 / _DDP_GRAD_BYTES, power_limit_w=k.power_limit_w,
        sm_clock_mhz=float(k.sm_clock_mhz[1]) if k.sm_clock_mhz else None,
        measured_steps=cfg.protocol.measured_steps, min_measured_s=cfg.protocol.min_measured_s,
        lora_rank=lora.rank if lora else 0, lora_targets=lora.targets if lora else (),
        warmup_steps=cfg.protocol.warmup_steps, device=dev, devices_per_node=hw.devices_per_node,
        # what powertrain's trainer runs: its own kernels, and PyTorch's SDPA (FlashAttention-2 class) for attention
        engine="builtin", attention_kernel="flash2",
    )
