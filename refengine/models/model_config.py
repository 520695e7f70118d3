"""The architecture of a decoder: `ModelConfig` (HF config.json names, frozen and validated), its Llama-3.1 RoPE
scaling (`RopeScaling`) and the rotary inverse frequencies it implies (`rope_inv_freq`). refengine.models.decoder builds the
modules from it."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3.1 RoPE scaling (`rope_type: "llama3"`), the only scaling supported; others fail at load."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self) -> None:
        if self.rope_type != "llama3":
            raise ValueError(f"rope_scaling.rope_type {self.rope_type!r} is not supported (only 'llama3')")
        if self.factor <= 0 or self.low_freq_factor <= 0 or self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"rope_scaling: need factor > 0 and high_freq_factor > low_freq_factor > 0, got {self}")
        if self.original_max_position_embeddings <= 0:
            raise ValueError("rope_scaling.original_max_position_embeddings must be positive")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder; HF config.json names. `eos_token_id` is an int, a tuple of ints or None
    (a list is turned into a tuple so the config stays hashable); use `eos_token_ids` to read it."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    architecture: str = "LlamaForCausalLM"
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"ModelConfig.num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"ModelConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"ModelConfig.architecture {self.architecture!r} is not one of {ARCHITECTURES}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(f"ModelConfig.rope_scaling must be a RopeScaling or None, got {self.rope_scaling!r}")
        ids = [("eos_token_id", t) for t in self.eos_token_ids]
        if self.bos_token_id is not None:
            ids.append(("bos_token_id", self.bos_token_id))
        for name, tok in ids:
            if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < self.vocab_size:
                raise ValueError(f"ModelConfig.{name} {tok!r} is not a token id in [0, {self.vocab_size})")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every end-of-sequence id, as a tuple (empty when the model has none)."""
        if self.eos_token_id is None:
            return ()
        return (self.eos_token_id,) if isinstance(self.eos_token_id, int) else tuple(self.eos_token_id)

    def replace(self, **changes: Any) -> ModelConfig:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return ModelConfig(**values)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies on the CPU, with Llama-3.1 scaling when configured."""
    import torch  # (here: the presets and their configs import without torch, for the CLI's plan and checks)

    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim))
    rs = config.rope_scaling
    if rs is None:
        return inv_freq
    # Llama 3.1: long wavelengths (beyond the original context / low_freq_factor) are slowed by `factor`,
    # short ones (below original / high_freq_factor) are kept, and the band between is interpolated linearly.
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
    high_freq_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rs.factor, inv_freq)
    smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, smoothed, scaled)
