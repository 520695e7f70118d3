"""The Hugging Face twin of a refengine model: the transformers config and model with identical weights, for the
conformance tests (tokens against transformers) and the Hugging Face perf peers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from refengine.models.decoder import CausalLM
from refengine.models.model_config import ModelConfig

if TYPE_CHECKING:  # transformers is imported only when a twin is built: it is slow to import
    from transformers import PretrainedConfig, PreTrainedModel


def hf_config_for(config: ModelConfig) -> PretrainedConfig:
    """The transformers config (Qwen2Config / LlamaConfig / MistralConfig) that describes the same model."""
    import transformers

    kw: dict[str, Any] = dict(  # the config fields, of several types
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act="silu",
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=config.bos_token_id,
        eos_token_id=list(config.eos_token_ids) or None,
        architectures=[config.architecture],
    )
    if config.rope_scaling is not None:
        rs = config.rope_scaling
        kw["rope_scaling"] = dict(
            rope_type="llama3",
            factor=rs.factor,
            low_freq_factor=rs.low_freq_factor,
            high_freq_factor=rs.high_freq_factor,
            original_max_position_embeddings=rs.original_max_position_embeddings,
        )
    if config.architecture == "LlamaForCausalLM":
        return transformers.LlamaConfig(**kw, attention_bias=config.attention_bias, mlp_bias=False)
    # HF's Qwen2 always has a q/k/v bias and Mistral never does.
    want_bias = config.architecture == "Qwen2ForCausalLM"
    if config.attention_bias != want_bias:
        raise ValueError(f"{config.architecture} in transformers requires attention_bias={want_bias}")
    if want_bias:
        return transformers.Qwen2Config(**kw, use_sliding_window=False)
    return transformers.MistralConfig(**kw, sliding_window=None)


def to_hf_model(model: CausalLM, config: ModelConfig, *, attn_implementation: str = "eager") -> PreTrainedModel:
    """A transformers `*ForCausalLM` on `model`'s device and dtype holding a copy of its weights."""
    import transformers

    p = model.model.embed_tokens.weight
    cls = getattr(transformers, config.architecture)
    with torch.device(p.device):
        hf: PreTrainedModel = cls._from_config(
            hf_config_for(config), attn_implementation=attn_implementation, dtype=p.dtype
        )
    # the checkpoint's names: merged projections split back into q/k/v and gate/up (views, copied by the load)
    hf.load_state_dict(dict(model.checkpoint_weights(remove_duplicate=False)), strict=True)
    hf.train(False)  # (eval(): transformers overrides it untyped)
    hf.requires_grad_(False)
    return hf
