"""The models refengine knows by name (presets), and what a model name resolves to without loading weights: its
`ModelConfig` and its tokenizer, for a preset or a local Hugging Face folder. A preset name wins over a folder of
the same name. No torch here, so that the command line can plan and check a run in a moment; weights are
refengine/models/loader.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

from refengine.models.hf_folder import config_from_hf, generation_config
from refengine.models.model_config import ModelConfig, RopeScaling
from refengine.tokenizer import QWEN_EOS, QWEN_VOCAB, HFTokenizer, NoTokenizer, QwenTokenizer, Tokenizer

_LLAMA31_ROPE = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)

PRESETS: dict[str, ModelConfig] = {
    # the default model: a Qwen2 small enough for CPU tests that still uses the real Qwen vocabulary.
    "tiny-qwen2": ModelConfig(
        vocab_size=QWEN_VOCAB,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        attention_bias=True,
        bos_token_id=None,
        eos_token_id=QWEN_EOS,
        architecture="Qwen2ForCausalLM",
    ),
    # The Llama code path at toy size (untied, no bias, Llama-3.1 RoPE scaling); Qwen vocab so the Qwen
    # tokenizer's ids are all in range.
    "tiny-llama": ModelConfig(
        vocab_size=QWEN_VOCAB,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=768,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attention_bias=False,
        bos_token_id=None,
        eos_token_id=QWEN_EOS,
        architecture="LlamaForCausalLM",
        rope_scaling=RopeScaling(
            factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=1024
        ),
    ),
    "qwen2.5-0.5b": ModelConfig(
        vocab_size=QWEN_VOCAB,
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=4864,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        attention_bias=True,
        bos_token_id=None,
        eos_token_id=QWEN_EOS,
        architecture="Qwen2ForCausalLM",
    ),
    "qwen2.5-7b": ModelConfig(
        vocab_size=152064,
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=18944,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        attention_bias=True,
        bos_token_id=None,
        eos_token_id=QWEN_EOS,
        architecture="Qwen2ForCausalLM",
    ),
    # Real Llama-3.1-8B shapes and special ids; text goes through the Qwen tokenizer with ids folded into range.
    "llama-3.1-8b": ModelConfig(
        vocab_size=128256,
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        attention_bias=False,
        bos_token_id=128000,
        eos_token_id=(128001, 128008, 128009),
        architecture="LlamaForCausalLM",
        rope_scaling=_LLAMA31_ROPE,
    ),
    # Real Llama-3.1-70B shapes (for simulated GPUs and tensor parallelism; random weights if ever built)
    "llama-3.1-70b": ModelConfig(
        vocab_size=128256,
        hidden_size=8192,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=28672,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        attention_bias=False,
        bos_token_id=128000,
        eos_token_id=(128001, 128008, 128009),
        architecture="LlamaForCausalLM",
        rope_scaling=_LLAMA31_ROPE,
    ),
    # Real Qwen2.5-72B(-Instruct) shapes: the 152064-row padded vocabulary, qkv biases
    "qwen2.5-72b": ModelConfig(
        vocab_size=152064,
        hidden_size=8192,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=29568,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        attention_bias=True,
        bos_token_id=None,
        eos_token_id=QWEN_EOS,
        architecture="Qwen2ForCausalLM",
    ),
}
# tiny-qwen2 with an 8192-row vocabulary, for the test suites: the vocab-sized logits GEMM is most of a tiny-qwen2
# decode step on a CPU, and here it is 18x smaller. Text goes through the Qwen BPE with ids folded into range (as for
# llama-3.1-8b); end of sequence is where Qwen's two EOS ids fold to.
TEST_VOCAB = 8192
TEST_MODEL = "tiny-qwen2-8k"
PRESETS[TEST_MODEL] = PRESETS["tiny-qwen2"].replace(
    vocab_size=TEST_VOCAB, eos_token_id=tuple(i % TEST_VOCAB for i in QWEN_EOS)
)


def load_model_config(model: str) -> ModelConfig:
    """The ModelConfig of a preset name or a local HF folder, without its weights."""
    if model in PRESETS:
        return PRESETS[model]
    folder = model_folder(model)
    return config_from_hf(json.loads((folder / "config.json").read_text()), generation_config(folder))


def model_folder(model: str) -> Path:
    """The local Hugging Face folder `model` names; ValueError if it is neither a preset nor such a folder."""
    folder = Path(model)
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a local folder with a config.json"
        )
    return folder


def load_tokenizer(model: str) -> Tokenizer:
    """Presets: the Qwen BPE. Folders: tokenizer.json, else the Qwen BPE for a Qwen-sized vocab, else none."""
    config = load_model_config(model)
    if model in PRESETS:
        return QwenTokenizer(config.eos_token_ids[0], config.vocab_size)
    folder = model_folder(model)
    eos = config.eos_token_ids[0] if config.eos_token_ids else None
    if (folder / "tokenizer.json").is_file():
        return HFTokenizer(folder / "tokenizer.json", eos)
    if config.vocab_size in (QWEN_VOCAB, 152064):  # Qwen2.5 small / large embedding padding
        return QwenTokenizer(eos, config.vocab_size)
    return NoTokenizer(model, eos, config.vocab_size)
