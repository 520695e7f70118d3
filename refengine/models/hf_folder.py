"""A local Hugging Face model folder read: config.json (+ generation_config.json) and the *.safetensors.

The config becomes a ModelConfig; the weights (sharded or not) are copied into a built model, each checkpoint
tensor into the rows it owns of a merged projection where the model stores q/k/v or gate/up as one
(`CausalLM.checkpoint_weights`).

Only the Llama / Qwen2 / Mistral families, with a bias-free SwiGLU MLP and plain or Llama-3 RoPE, are read; any
other config fails with ValueError naming what is unsupported, rather than building a model that computes
something else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from refengine.models.model_config import ARCHITECTURES, ModelConfig, RopeScaling

if TYPE_CHECKING:
    from refengine.models.decoder import CausalLM


def generation_config(folder: Path) -> dict[str, Any]:
    path = folder / "generation_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _as_ids(value: int | list[int] | None) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def config_from_hf(cfg: dict[str, Any], generation_config: dict[str, Any] | None = None) -> ModelConfig:
    """HF config.json (transformers 4 `rope_theta`/`rope_scaling` or 5 `rope_parameters`) -> ModelConfig."""
    by_type = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
    model_type: str | None = cfg.get("model_type")
    arch = (cfg.get("architectures") or [by_type.get(model_type or "", model_type)])[0]
    if arch not in ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")
    if cfg.get("hidden_act", "silu") != "silu" or cfg.get("mlp_bias", False):
        raise ValueError(
            f"{arch}: only a bias-free SiLU (SwiGLU) MLP is supported, got hidden_act="
            f"{cfg.get('hidden_act')!r} mlp_bias={cfg.get('mlp_bias')!r}"
        )
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or rope
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if rope_type not in ("default", "llama3") or scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{arch}: rope scaling {rope_type!r} is not supported (only plain RoPE and 'llama3')")
    rope_scaling = (
        None
        if rope_type == "default"
        else RopeScaling(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    )
    heads = cfg["num_attention_heads"]
    max_pos = cfg.get("max_position_embeddings", 4096)
    # We attend to the full context. That equals sliding-window attention as long as no sequence outgrows the
    # window, so the window caps the usable length instead of being silently ignored.
    window = cfg.get("sliding_window") if (arch != "Qwen2ForCausalLM" or cfg.get("use_sliding_window")) else None
    if window:
        max_pos = min(max_pos, window)
    eos = list(dict.fromkeys(_as_ids(cfg.get("eos_token_id")) + _as_ids((generation_config or {}).get("eos_token_id"))))
    return ModelConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate_size=cfg["intermediate_size"],
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=True if arch == "Qwen2ForCausalLM" else bool(cfg.get("attention_bias", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=eos[0] if len(eos) == 1 else (tuple(eos) or None),
        architecture=arch,
        rope_scaling=rope_scaling,
    )


def load_safetensors(model: CausalLM, folder: Path) -> None:
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model folder {str(folder)!r} has no *.safetensors weights")
    # checkpoint names (merged projections by their shards: rows of the merged weight), both names of a tied weight
    targets = dict(model.checkpoint_weights(remove_duplicate=False))
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(folder / file), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith("rotary_emb.inv_freq"):  # older checkpoints store the RoPE buffer
                    continue
                if name not in targets:
                    raise ValueError(f"{folder}/{file}: unexpected tensor {name!r}")
                tensor = f.get_tensor(name)
                if tensor.shape != targets[name].shape:
                    raise ValueError(
                        f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(targets[name].shape)}"
                    )
                targets[name].copy_(tensor)
                loaded.add(name)
    if model.config.tie_word_embeddings and "lm_head.weight" in loaded:
        loaded.add("model.embed_tokens.weight")
    missing = [n for n, _ in model.checkpoint_weights() if n not in loaded]
    if missing:
        raise ValueError(
            f"model folder {str(folder)!r} lacks weights: {missing[:5]}{' ...' if len(missing) > 5 else ''}"
        )
