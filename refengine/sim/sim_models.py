"""The models a simulated GPU runs: shapes only, no weights, no forward.

`sim_model(model)` resolves a name or a folder to (ModelConfig, ModelShape, Tokenizer):
- the engine's presets at real shapes (qwen2.5-0.5b, qwen2.5-7b, llama-3.1-8b; the toy ones work too);
- `opt-13b`, which exists only here (the engine has no OPT forward): facebook/opt-13b's config.json fields;
- a local folder's config.json, of any architecture `ModelShape.from_hf_config` reads (no weights are read).
The ModelConfig is the engine's bookkeeping (vocabulary, EOS ids, context length); the ModelShape feeds the cost
model. Preset text goes through the Qwen BPE (ids folded into a smaller vocabulary, as the engine's presets do).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from refengine.models.model_config import ModelConfig
from refengine.sim.model_shape import ModelShape
from refengine.tokenizer import HFTokenizer, NoTokenizer, QwenTokenizer, Tokenizer

# facebook/opt-13b config.json (the fields the shape needs): MHA, a two-GEMM ReLU MLP of ffn_dim, learned positions
OPT_13B = {
    "model_type": "opt",
    "hidden_size": 5120,
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "ffn_dim": 20480,
    "vocab_size": 50272,
    "max_position_embeddings": 2048,
    "bos_token_id": 2,
    "eos_token_id": 2,
}
# Qwen/Qwen3-32B config.json (the fields the shape needs): the engine has no Qwen3 forward (per-head q/k norms), so
# it exists only here, for the measured Qwen3-32B runs the simulator is validated against
QWEN3_32B = {
    "model_type": "qwen3",
    "hidden_size": 5120,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 64,
    "intermediate_size": 25600,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}


def _config(model_type: str, layers: int, hidden: int, heads: int, inter: int, vocab: int, **kw: Any) -> dict[str, Any]:
    """The config.json fields a shape needs (8 KV heads of 128 dims unless given), for the presets below."""
    return {
        "model_type": model_type,
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kw.pop("kv_heads", 8),
        "head_dim": kw.pop("head_dim", 128),
        "intermediate_size": inter,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        **kw,
    }


# Models of the measured serving runs (perf/sim/data/measured_runs.csv) that the engine has no preset for: their
# published config.json fields (Qwen/Qwen3-8B, Qwen/Qwen3-14B, mistralai/Mistral-7B-Instruct-v0.3,
# mistralai/Mistral-Nemo-Instruct-2407, mistralai/Mistral-Large-Instruct-2407, meta-llama/Llama-3.1-405B)
MEASURED_MODELS: dict[str, dict[str, Any]] = {
    "qwen3-8b": _config("qwen3", 36, 4096, 32, 12288, 151936, max_position_embeddings=40960, eos_token_id=151645),
    "qwen3-14b": _config("qwen3", 40, 5120, 40, 17408, 151936, max_position_embeddings=40960, eos_token_id=151645),
    "mistral-7b": _config("mistral", 32, 4096, 32, 14336, 32768, max_position_embeddings=32768, eos_token_id=2),
    "mistral-nemo-12b": _config("mistral", 40, 5120, 32, 14336, 131072, max_position_embeddings=131072, eos_token_id=2),
    "mistral-large-123b": _config(
        "mistral", 88, 12288, 96, 28672, 32768, max_position_embeddings=131072, eos_token_id=2
    ),
    "llama-3.1-405b": _config(
        "llama", 126, 16384, 128, 53248, 128256, max_position_embeddings=131072, eos_token_id=128001
    ),
}
SIM_ONLY_PRESETS: dict[str, dict[str, Any]] = {"opt-13b": OPT_13B, "qwen3-32b": QWEN3_32B, **MEASURED_MODELS}
# the architectures loader.config_from_hf also reads (their tokenizer rules are the loader's)
_ENGINE_TYPES = ("qwen2", "llama", "mistral")


def _hf_fields(mc: ModelConfig) -> dict[str, Any]:
    return {
        "model_type": "qwen2" if mc.architecture == "Qwen2ForCausalLM" else "llama",  # qwen2: qkv biases
        "tie_word_embeddings": mc.tie_word_embeddings,
        "num_hidden_layers": mc.num_hidden_layers,
        "hidden_size": mc.hidden_size,
        "num_attention_heads": mc.num_attention_heads,
        "num_key_value_heads": mc.num_key_value_heads,
        "head_dim": mc.head_dim,
        "intermediate_size": mc.intermediate_size,
        "vocab_size": mc.vocab_size,
    }


def _bookkeeping_config(shape: ModelShape, cfg: dict[str, Any]) -> ModelConfig:
    """A ModelConfig for an architecture the engine cannot run (it is never built into a model)."""
    eos = cfg.get("eos_token_id")
    return ModelConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
    )


def sim_model(model: str) -> tuple[ModelConfig, ModelShape, Tokenizer]:
    from refengine.models.hf_folder import config_from_hf
    from refengine.models.presets import PRESETS, load_tokenizer

    if model in PRESETS:
        mc = PRESETS[model]
        return mc, ModelShape.from_hf_config(_hf_fields(mc)), load_tokenizer(model)
    if model in SIM_ONLY_PRESETS:
        cfg = SIM_ONLY_PRESETS[model]
        shape = ModelShape.from_hf_config(cfg)
        return _bookkeeping_config(shape, cfg), shape, QwenTokenizer(cfg["eos_token_id"], cfg["vocab_size"])
    path = Path(model) / "config.json"
    if not path.is_file():
        known = ", ".join([*PRESETS, *SIM_ONLY_PRESETS])
        raise ValueError(f"model {model!r} is neither a preset ({known}) nor a local folder with a config.json")
    cfg = json.loads(path.read_text())
    try:
        shape = ModelShape.from_hf_config(cfg)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"model {model!r}: config.json lacks a field the simulated shape needs: {exc}") from None
    if cfg.get("model_type") in _ENGINE_TYPES:
        return config_from_hf(cfg), shape, load_tokenizer(model)
    mc = _bookkeeping_config(shape, cfg)
    eos = mc.eos_token_ids[0] if mc.eos_token_ids else None
    tok_json = Path(model) / "tokenizer.json"
    tok = HFTokenizer(tok_json, eos) if tok_json.is_file() else NoTokenizer(model, eos, mc.vocab_size)
    return mc, shape, tok
