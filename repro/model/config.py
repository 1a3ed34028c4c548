"""Model configuration of the target family (Qwen3.5/3.6-MoE, Qwen3-Next) and named presets.

Only the fields the islands need are kept. `from_hf` reads a Hugging Face `config.json`
dict, where the text model may be nested under `text_config` (the multimodal
`Qwen3_5MoeForConditionalGeneration` checkpoints do this).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from ..errors import BadInput

SUPPORTED_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
GDN = "linear_attention"
FULL = "full_attention"


# integer fields a wrong type of would fail deep in the islands (a string hidden_size gave 146
# lines of traceback): checked where the config is read
_INT_FIELDS = ("hidden_size", "num_hidden_layers", "vocab_size", "linear_num_key_heads", "linear_num_value_heads",
               "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "num_attention_heads",
               "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
               "shared_expert_intermediate_size")


class ConfigError(BadInput):
    """A config.json that does not describe a supported model."""


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    vocab_size: int
    rms_norm_eps: float
    # Gated DeltaNet (linear attention) layers
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    # full attention layers (not an island here; kept so inspect can describe them)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    # MoE, present in every layer
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool = True
    tie_word_embeddings: bool = False
    # multimodal checkpoints prefix the text model with `model.language_model.`
    multimodal: bool = True

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def prefix(self) -> str:
        return "model.language_model." if self.multimodal else "model."

    def layer_type(self, layer: int) -> str:
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise ConfigError(f"layer index must be an int, got {layer!r}")
        if not 0 <= layer < self.num_hidden_layers:
            raise ConfigError(
                f"layer {layer} is out of range: the model has {self.num_hidden_layers} layers (0..{self.num_hidden_layers - 1})")
        return self.layer_types[layer]

    def gdn_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == GDN]

    @classmethod
    def from_hf(cls, raw: dict) -> "ModelConfig":
        multimodal = "text_config" in raw
        d = dict(raw.get("text_config") or raw)
        model_type = d.get("model_type") or raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"model_type {model_type!r} is not supported (expected one of {', '.join(SUPPORTED_MODEL_TYPES)})")
        missing = [k for k in ("hidden_size", "num_hidden_layers", "vocab_size", "linear_num_key_heads",
                               "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                               "num_experts", "num_experts_per_tok", "moe_intermediate_size") if k not in d]
        if missing:
            raise ConfigError(f"config.json lacks {', '.join(missing)}")
        for k in _INT_FIELDS:
            v = d.get(k, 1)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"config.json: {k} must be a positive integer, got {json.dumps(v)[:40]}")
        if d["num_experts_per_tok"] > d["num_experts"]:
            raise ConfigError(f"config.json: num_experts_per_tok {d['num_experts_per_tok']} is larger than "
                              f"num_experts {d['num_experts']}")
        n = d["num_hidden_layers"]
        types = d.get("layer_types")
        if types is None:  # Qwen3-Next writes full_attention_interval instead
            interval = d.get("full_attention_interval", 4)
            if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
                raise ConfigError(f"config.json: full_attention_interval must be a positive integer, got {interval!r}")
            types = [FULL if (i + 1) % interval == 0 else GDN for i in range(n)]
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ConfigError("config.json: layer_types must be a list of strings")
        if len(types) != n:
            raise ConfigError(f"layer_types has {len(types)} entries but num_hidden_layers is {n}")
        bad = sorted({t for t in types if t not in (GDN, FULL)})
        if bad:
            raise ConfigError(f"unknown layer types {bad}")
        return cls(
            model_type=model_type,
            hidden_size=d["hidden_size"],
            num_hidden_layers=n,
            layer_types=tuple(types),
            vocab_size=d["vocab_size"],
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            linear_num_key_heads=d["linear_num_key_heads"],
            linear_num_value_heads=d["linear_num_value_heads"],
            linear_key_head_dim=d["linear_key_head_dim"],
            linear_value_head_dim=d["linear_value_head_dim"],
            linear_conv_kernel_dim=d.get("linear_conv_kernel_dim", 4),
            num_attention_heads=d.get("num_attention_heads", 16),
            num_key_value_heads=d.get("num_key_value_heads", 2),
            head_dim=d.get("head_dim", 256),
            num_experts=d["num_experts"],
            num_experts_per_tok=d["num_experts_per_tok"],
            moe_intermediate_size=d["moe_intermediate_size"],
            shared_expert_intermediate_size=d.get("shared_expert_intermediate_size", d["moe_intermediate_size"]),
            norm_topk_prob=bool(d.get("norm_topk_prob", True)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", d.get("tie_word_embeddings", False))),
            multimodal=multimodal,
        )

    def to_hf(self) -> dict:
        text = {
            "model_type": "qwen3_5_moe_text" if self.model_type.startswith("qwen3_5_moe") else self.model_type,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": list(self.layer_types),
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "norm_topk_prob": self.norm_topk_prob,
            "torch_dtype": "bfloat16",
        }
        if not self.multimodal:
            return text
        return {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "text_config": text,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "bfloat16",
        }

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)


# Qwen3.6-35B-A3B text model, as DESIGN.md records it.
QWEN36_35B_A3B = ModelConfig(
    model_type="qwen3_5_moe",
    hidden_size=2048,
    num_hidden_layers=40,
    layer_types=tuple(([GDN] * 3 + [FULL]) * 10),
    vocab_size=248320,
    rms_norm_eps=1e-6,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    num_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
)

# The embedded default: the real layout at a size that runs in milliseconds on a CPU.
# Ratios kept from the real model: Hv = 2 Hk, 3:1 GDN/full layers, top-k < experts.
TINY = QWEN36_35B_A3B.replace(
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=(GDN, GDN, GDN, FULL),
    vocab_size=512,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
)

# One GDN layer and one full-attention layer at real dimensions, with a cut vocabulary, for GPU
# tests and benchmarks (the real vocab of 248320 only matters for the canary head).
REAL_LAYER = QWEN36_35B_A3B.replace(num_hidden_layers=4, layer_types=(GDN, GDN, GDN, FULL), vocab_size=4096)

PRESETS = {"tiny": TINY, "real-layer": REAL_LAYER, "qwen3.6-35b-a3b": QWEN36_35B_A3B}
