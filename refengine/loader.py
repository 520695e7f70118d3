"""Where models and tokenizers come from: presets with seeded random weights, or a local Hugging Face folder.

Nothing here touches the network. A preset is a `ModelConfig` at a real or toy shape whose weights are drawn
from a seeded generator; a folder is config.json + *.safetensors (sharded or not) of the Llama / Qwen2 /
Mistral families. `to_hf_model` (refengine/hf_twin.py, re-exported here) builds the equivalent transformers model
with identical weights, for the conformance tests and for the Hugging Face perf peers.

Model and tokenizer are resolved the same way: a preset name wins over a folder of the same name.
"""

from __future__ import annotations

import importlib.util
import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from refengine.attention import ATTENTION_BACKENDS, default_backend_name, get_attention_backend
from refengine.hf_twin import hf_config_for, to_hf_model  # noqa: F401  (re-exported)
from refengine.model import ARCHITECTURES, CausalLM, ModelConfig, RopeScaling
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
}

INIT_STD = 0.02  # normal(0, 0.02) for weights and biases, ones for norms: the usual initializer_range
_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
}


def resolve_device(device: str | torch.device) -> torch.device:
    """ "cpu", "cuda" or "cuda:N" -> torch.device; ValueError naming `device` for anything else, or for CUDA on a
    machine without it (rather than torch's assertion at the first allocation)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r}, but CUDA is not available here (torch {torch.__version__}): use device='cpu'"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}, but there are only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def check_attention_backend(name: str, device: torch.device) -> None:
    """Triton needs CUDA, or TRITON_INTERPRET=1 (its interpreter, which the conformance suite uses on the CPU):
    fail when the engine is built, not at the first step."""
    if not isinstance(name, str) or name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "triton" and importlib.util.find_spec("triton") is None:
        raise ValueError("attention_backend='triton' needs the triton package, which is not installed")
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"attention_backend='triton' needs a CUDA device (device={str(device)!r}); set "
            "TRITON_INTERPRET=1 to run the kernels in Triton's interpreter, or use 'torch'"
        )


def _host_memory_total() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(device: torch.device, needs: list[tuple[str, int, torch.device]]) -> None:
    """The engine's up-front buffers, as (knob that sizes it, bytes, device), must fit: on CUDA in the memory free
    now, on the host in its physical memory (not what is free this moment: pages are committed lazily, and a busy
    shared machine must not turn a good config into an error). Otherwise ValueError naming the knob, instead of a
    failed allocation or, on the host, a later OOM kill."""
    room = {"cpu": _host_memory_total()}
    if device.type == "cuda":
        room["cuda"] = torch.cuda.mem_get_info(device)[0]
    for name, nbytes, where in needs:
        left = room[where.type]
        if nbytes > left:
            what = "free on the device" if where.type == "cuda" else "left of the host's memory"
            raise ValueError(
                f"{name}: the engine would allocate {nbytes / 2**30:.2f} GiB on {where.type}, but only "
                f"{left / 2**30:.2f} GiB is {what}"
            )
        room[where.type] = left - nbytes


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device | str) -> torch.dtype:
    """None / "auto" -> float32 on the CPU, bfloat16 on CUDA; names like "bf16" -> the torch dtype."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be a float type ({sorted(_DTYPES)}), got {dtype}")
        return dtype
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or 'auto', got {dtype!r}")
    return _DTYPES[dtype]


def _empty_model(config: ModelConfig, device, dtype: torch.dtype, attention_backend: str | None) -> CausalLM:
    """Allocate the model directly at its device and dtype: built on `meta`, then materialised uninitialised."""
    backend = get_attention_backend(attention_backend or default_backend_name(torch.device(device)))
    with torch.device("meta"):
        model = CausalLM(config, backend)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.tie_weights()  # to_empty replaces parameters one module at a time, which unties a shared weight
    return model.eval().requires_grad_(False)


def _draw(name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """float32 CPU tensor for one parameter; its own generator, so the order and threading of draws is moot."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    # The CPU generator keeps only 32 bits of its seed, so seed and name are hashed together into 32 bits.
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
    return torch.empty(shape).normal_(0.0, INIT_STD, generator=gen)


def build_random_model(
    config: ModelConfig, *, device="cpu", dtype=None, seed: int = 0, attention_backend: str | None = None
) -> CausalLM:
    """The model of `config` with weights drawn on the CPU in float32 from generators seeded by (`seed`,
    parameter name), then cast and moved: identical on every device and run, untouched by global RNG state."""
    model = _empty_model(config, device, resolve_dtype(dtype, device), attention_backend)
    params = list(model.named_parameters())  # a tied lm_head appears once, as model.embed_tokens.weight

    def fill(item: tuple[str, torch.nn.Parameter]) -> None:
        name, p = item
        p.copy_(_draw(name, p.shape, seed))

    # Draws are CPU-bound and release the GIL; threads make an 8B preset take seconds rather than minutes.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(fill, params))
    return model


def load_model(
    model: str, *, device="cpu", dtype=None, seed: int = 0, attention_backend: str | None = None
) -> tuple[CausalLM, ModelConfig]:
    """A preset name (random weights from `seed`) or a local HF folder (config.json + *.safetensors)."""
    config = load_model_config(model)
    if model in PRESETS:
        return build_random_model(
            config, device=device, dtype=dtype, seed=seed, attention_backend=attention_backend
        ), config
    lm = _empty_model(config, device, resolve_dtype(dtype, device), attention_backend)
    _load_safetensors(lm, _folder(model))
    return lm, config


def load_model_config(model: str) -> ModelConfig:
    """The ModelConfig of a preset name or a local HF folder, without its weights."""
    if model in PRESETS:
        return PRESETS[model]
    folder = _folder(model)
    return config_from_hf(json.loads((folder / "config.json").read_text()), _generation_config(folder))


def _folder(model: str) -> Path:
    folder = Path(model)
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a local folder with a config.json"
        )
    return folder


def _generation_config(folder: Path) -> dict:
    path = folder / "generation_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _as_ids(value) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def config_from_hf(cfg: dict, generation_config: dict | None = None) -> ModelConfig:
    """HF config.json (transformers 4 `rope_theta`/`rope_scaling` or 5 `rope_parameters`) -> ModelConfig."""
    by_type = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
    arch = (cfg.get("architectures") or [by_type.get(cfg.get("model_type"), cfg.get("model_type"))])[0]
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


def _load_safetensors(model: CausalLM, folder: Path) -> None:
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model folder {str(folder)!r} has no *.safetensors weights")
    targets = dict(model.named_parameters(remove_duplicate=False))  # both names of a tied weight
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
    missing = [n for n, _ in model.named_parameters() if n not in loaded]
    if missing:
        raise ValueError(
            f"model folder {str(folder)!r} lacks weights: {missing[:5]}{' ...' if len(missing) > 5 else ''}"
        )


def load_tokenizer(model: str) -> Tokenizer:
    """Presets: the Qwen BPE. Folders: tokenizer.json, else the Qwen BPE for a Qwen-sized vocab, else none."""
    config = load_model_config(model)
    if model in PRESETS:
        return QwenTokenizer(config.eos_token_ids[0], config.vocab_size)
    folder = _folder(model)
    eos = config.eos_token_ids[0] if config.eos_token_ids else None
    if (folder / "tokenizer.json").is_file():
        return HFTokenizer(folder / "tokenizer.json", eos)
    if config.vocab_size in (QWEN_VOCAB, 152064):  # Qwen2.5 small / large embedding padding
        return QwenTokenizer(eos, config.vocab_size)
    return NoTokenizer(model, eos, config.vocab_size)
