"""Model shapes: the one definition of an architecture's sizes, and the catalog of named models.

The study's four models are here at full size (for planning and prediction) and as ``-tiny``
variants of the same shape (same family, same heads/KV ratio, same expert count and top-k; a few
layers and d ≤ 256) that train on a laptop CPU in seconds. Any other model is given inline with the
same fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Family = Literal["gpt", "llama", "mixtral"]


class ModelConfig(BaseModel):
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
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

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
