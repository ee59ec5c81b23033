"""Model shapes: the one definition of an architecture's sizes, and the catalog of named models.

The study's four models are here at full size (for planning and prediction) and as ``-tiny``
variants of the same shape (same family, same heads/KV ratio, same expert count and top-k; a few
layers and d ≤ 256) that train on a laptop CPU in seconds; so are public models for planning
(Llama 3 8B and 3.1 405B, Qwen3 MoE, DeepSeek-V3, Kimi K2, with MLA, shared experts and leading dense
layers where they have them). Any other model is given inline with the same fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from powertrain.spec.values import SpecModel

Family = Literal["gpt", "llama", "mixtral"]


class ModelConfig(SpecModel):
    """Sizes of a decoder-only transformer.

    ``family`` decides the block: ``gpt`` (learned positions, LayerNorm, GELU MLP, multi-head
    attention), ``llama`` (RoPE, RMSNorm, SwiGLU, grouped-query attention), ``mixtral`` (llama blocks
    whose MLP is a top-k routed mixture of ``experts`` SwiGLU experts).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    family: Family
    layers: int = Field(gt=0, le=100_000)
    hidden: int = Field(gt=0, le=1 << 20)
    ffn: int = Field(gt=0, le=1 << 22, description="FFN inner size (per expert for MoE)")
    heads: int = Field(gt=0, le=1 << 16)
    kv_heads: int = Field(gt=0, le=1 << 16)
    vocab: int = Field(gt=0, le=1 << 24)
    seq_len: int = Field(gt=0, le=1 << 24)
    experts: int = Field(default=1, ge=1, le=1 << 16)
    top_k: int = Field(default=1, ge=1, le=1 << 16)
    tied_embeddings: bool = False
    # Modern attention and MoE (0: the plain transformer's value). The predictor costs all of them; the
    # built-in trainer builds attention_head_dim and refuses the rest (spec.validate, rule
    # model_architecture_unsupported), so a spec can plan DeepSeek-V3 or Qwen3 without being run as
    # something else.
    attention_head_dim: int = Field(default=0, ge=0, le=1 << 16,
                                    description="attention head width when heads × head width ≠ hidden (Qwen3: 128)")
    dense_layers: int = Field(default=0, ge=0, le=100_000, description="leading layers with a dense MLP (MoE only)")
    dense_ffn: int = Field(default=0, ge=0, le=1 << 22, description="FFN width of the dense layers (0: ffn)")
    shared_ffn: int = Field(default=0, ge=0, le=1 << 22, description="total width of the shared experts (MoE)")
    q_lora_rank: int = Field(default=0, ge=0, le=1 << 20, description="MLA: query down-projection rank (0: none)")
    kv_lora_rank: int = Field(default=0, ge=0, le=1 << 20, description="MLA: key/value down-projection rank; "
                              "> 0 makes the attention MLA (DeepSeek-V2/V3, Kimi K2)")
    qk_rope_dim: int = Field(default=0, ge=0, le=1 << 16, description="MLA: rotary part of the query/key head")
    v_head_dim: int = Field(default=0, ge=0, le=1 << 16, description="MLA: value head width (0: the head width)")
    mtp_layers: int = Field(default=0, ge=0, le=64, description="multi-token-prediction modules")

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.family == "gpt" and self.kv_heads != self.heads:
            raise ValueError("gpt family uses multi-head attention: kv_heads must equal heads")
        if self.family == "mixtral" and self.experts < 2:
            raise ValueError("mixtral family needs experts >= 2")
        if self.family != "mixtral" and self.experts != 1:
            raise ValueError(f"{self.family} family is dense: experts must be 1 (use family mixtral for MoE)")
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed experts ({self.experts})")
        if (self.dense_layers or self.shared_ffn) and self.experts < 2:
            raise ValueError("dense_layers and shared_ffn describe an MoE model: use family mixtral with experts >= 2")
        if self.dense_layers >= self.layers:
            raise ValueError(f"dense_layers ({self.dense_layers}) must leave MoE layers (layers = {self.layers})")
        if self.dense_ffn and not self.dense_layers:
            raise ValueError("dense_ffn is the width of the leading dense layers: set dense_layers too")
        if (self.q_lora_rank or self.qk_rope_dim or self.v_head_dim) and not self.kv_lora_rank:
            raise ValueError("q_lora_rank, qk_rope_dim and v_head_dim are MLA's: set kv_lora_rank (> 0) too")
        return self

    @property
    def head_dim(self) -> int:
        """Attention head width: attention_head_dim where set, else hidden / heads."""
        return self.attention_head_dim or self.hidden // self.heads

    def unbuilt_features(self) -> list[str]:
        """The fields the built-in trainer does not build (it refuses a spec that sets any)."""
        return [f for f in ("dense_layers", "dense_ffn", "shared_ffn", "q_lora_rank", "kv_lora_rank", "qk_rope_dim",
                            "v_head_dim", "mtp_layers") if getattr(self, f)]

    @property
    def is_moe(self) -> bool:
        return self.experts > 1


_MODELS: dict[str, ModelConfig] = {}


def _add(**kw: Any) -> None:
    m = ModelConfig(**kw)
    _MODELS[m.name] = m


# Full sizes, from DESIGN.md (the study's Table of models); vocabularies from the public releases,
# GPT-3's GPT-2 BPE (50257) padded to 51200 as Megatron-LM/NeMo train it (divisible by tp ≤ 1024).
_add(name="gpt3-175b", family="gpt", layers=96, hidden=12288, ffn=49152, heads=96, kv_heads=96,
     vocab=51200, seq_len=2048)
_add(name="llama3-70b", family="llama", layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8,
     vocab=128256, seq_len=8192)
_add(name="mixtral-8x7b", family="mixtral", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8,
     vocab=32000, seq_len=4096, experts=8, top_k=2)
_add(name="mixtral-8x22b", family="mixtral", layers=56, hidden=6144, ffn=16384, heads=48, kv_heads=8,
     vocab=32768, seq_len=4096, experts=8, top_k=2)
# Tiny variants of the same shape: trainable on a CPU in seconds.
_add(name="gpt3-tiny", family="gpt", layers=4, hidden=256, ffn=1024, heads=8, kv_heads=8,
     vocab=512, seq_len=128)
_add(name="llama3-tiny", family="llama", layers=4, hidden=256, ffn=896, heads=8, kv_heads=2,
     vocab=512, seq_len=128)
_add(name="mixtral-8x7b-tiny", family="mixtral", layers=4, hidden=128, ffn=448, heads=8, kv_heads=2,
     vocab=512, seq_len=128, experts=8, top_k=2)
_add(name="mixtral-8x22b-tiny", family="mixtral", layers=4, hidden=192, ffn=512, heads=12, kv_heads=2,
     vocab=512, seq_len=128, experts=8, top_k=2)


def catalog() -> dict[str, ModelConfig]:
    """Named models (a copy: callers may not change the catalog)."""
    return dict(_MODELS)


def get_model(name_or_config: str | ModelConfig | dict[str, Any]) -> ModelConfig:
    """A catalog name, an inline dict of sizes, or a ModelConfig → ModelConfig."""
    if isinstance(name_or_config, ModelConfig):
        return name_or_config
    if isinstance(name_or_config, dict):
        return ModelConfig(**name_or_config)
    try:
        return _MODELS[name_or_config]
    except KeyError:
        raise KeyError(
            f"unknown model {name_or_config!r}; known: {', '.join(sorted(_MODELS))}, "
            "or give the sizes inline (family, layers, hidden, ffn, heads, kv_heads, vocab, seq_len)"
        ) from None


# Architecture details beyond the plain transformer sizes, for public models that published runs name
# (their `model.name`), from each model's released config.json. Fields are predict.Case's: head_dim
# (attention head width when heads × head_dim ≠ hidden), shared_ffn (total shared-expert width),
# dense_layers (leading dense-MLP layers of an MoE model), MLA ranks (q_lora_rank, kv_lora_rank,
# qk_rope_dim, v_head_dim; head_dim is then the non-rotary query/key width), mtp_layers.
ARCHITECTURE_DETAILS: dict[str, dict[str, int]] = {
    # Qwen3 (Qwen/Qwen3-*/config.json): head_dim 128 everywhere
    "qwen3-30b-a3b": {"head_dim": 128}, "qwen3-235b-a22b": {"head_dim": 128}, "qwen3-32b": {"head_dim": 128},
    "qwen3-14b": {"head_dim": 128}, "qwen3-8b": {"head_dim": 128}, "qwen3-4b": {"head_dim": 128},
    "qwen3-1.7b": {"head_dim": 128}, "qwen3-0.6b": {"head_dim": 128},
    # gpt-oss (openai/gpt-oss-*/config.json): head_dim 64, hidden 2880
    "gpt-oss-120b": {"head_dim": 64}, "gpt-oss-20b": {"head_dim": 64},
    # DeepSeek-V3/R1 (deepseek-ai/DeepSeek-V3/config.json): MLA, 1 shared expert of 2048, first 3 dense, 1 MTP
    "deepseek-v3": {"head_dim": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_dim": 64,
                    "v_head_dim": 128, "shared_ffn": 2048, "dense_layers": 3, "mtp_layers": 1},
    "deepseek-r1": {"head_dim": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_dim": 64,
                    "v_head_dim": 128, "shared_ffn": 2048, "dense_layers": 3, "mtp_layers": 1},
    # DeepSeek-V2 (deepseek-ai/DeepSeek-V2/config.json): 2 shared experts of 1536, first 1 dense
    "deepseek-v2": {"head_dim": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_dim": 64,
                    "v_head_dim": 128, "shared_ffn": 3072, "dense_layers": 1},
    "deepseek-v2-lite": {"head_dim": 128, "kv_lora_rank": 512, "qk_rope_dim": 64, "v_head_dim": 128,
                         "shared_ffn": 2816, "dense_layers": 1},
    # Kimi K2 (moonshotai/Kimi-K2-*/config.json): DeepSeek-V3 blocks, 64 heads, 384 experts, first 1 dense
    "kimi-k2": {"head_dim": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_dim": 64,
                "v_head_dim": 128, "shared_ffn": 2048, "dense_layers": 1},
    # Moonlight / DeepSeek-style small MoE
    "moonlight-16b-a3b": {"head_dim": 128, "kv_lora_rank": 512, "qk_rope_dim": 64, "v_head_dim": 128,
                          "shared_ffn": 2816, "dense_layers": 1},
}


def _add_public(name: str, **kw: Any) -> None:
    """A public model at full size for planning (predict, advise), its details from ARCHITECTURE_DETAILS."""
    d = dict(ARCHITECTURE_DETAILS.get(name, {}))
    hd = d.pop("head_dim", 0)
    if (hd and hd != kw["hidden"] // kw["heads"]) or d.get("kv_lora_rank"):
        d["attention_head_dim"] = hd
    _add(name=name, **kw, **d)


# Released configs (config.json of each): MoE `ffn` is the routed expert's width, `dense_ffn` the
# leading dense layers'. Planning only: the built-in trainer refuses their MLA / shared / dense layers.
_add_public("llama3-8b", family="llama", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8,
            vocab=128256, seq_len=8192)
_add_public("llama3.1-405b", family="llama", layers=126, hidden=16384, ffn=53248, heads=128, kv_heads=8,
            vocab=128256, seq_len=8192)
_add_public("qwen3-30b-a3b", family="mixtral", layers=48, hidden=2048, ffn=768, heads=32, kv_heads=4,
            vocab=151936, seq_len=4096, experts=128, top_k=8)
_add_public("qwen3-235b-a22b", family="mixtral", layers=94, hidden=4096, ffn=1536, heads=64, kv_heads=4,
            vocab=151936, seq_len=4096, experts=128, top_k=8)
_add_public("deepseek-v3", family="mixtral", layers=61, hidden=7168, ffn=2048, dense_ffn=18432, heads=128,
            kv_heads=128, vocab=129280, seq_len=4096, experts=256, top_k=8)
_add_public("kimi-k2", family="mixtral", layers=61, hidden=7168, ffn=2048, dense_ffn=18432, heads=64,
            kv_heads=64, vocab=163840, seq_len=4096, experts=384, top_k=8)


def architecture_details(name: str | None) -> dict[str, int]:
    """The extra architecture fields of a public model named ``name`` (free text: "DeepSeek-V3 671B",
    "Qwen3-30B-A3B"), or {} when the name is not one of them. The longest matching key wins."""
    def norm(text: str) -> str:  # "DeepSeek V3", "deepseek-v3", "DeepSeek_V3" read alike
        return "".join(ch for ch in text.lower() if ch.isalnum())

    key = norm(str(name or ""))
    best = ""
    for k in ARCHITECTURE_DETAILS:
        if norm(k) in key and len(k) > len(best):
            best = k
    return dict(ARCHITECTURE_DETAILS[best]) if best else {}
