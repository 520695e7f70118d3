"""Where models and tokenizers come from: presets with seeded random weights, or a local Hugging Face folder.

Nothing here touches the network. A preset is a `ModelConfig` at a real or toy shape whose weights are drawn
from a seeded generator; a folder is config.json + *.safetensors (sharded or not) of the Llama / Qwen2 /
Mistral families. `to_hf_model` (refengine/hf_twin.py, re-exported here) builds the equivalent transformers model
with identical weights, for the conformance tests and for the Hugging Face perf peers.

Model and tokenizer are resolved the same way: a preset name wins over a folder of the same name. What a folder's
files mean (config.json, generation_config.json, the safetensors) is refengine/hf_folder.py's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from refengine.attention import default_backend_name, get_attention_backend
from refengine.config import ATTENTION_BACKENDS
from refengine.engine_setup import check_memory  # noqa: F401  (re-exported: it moved with the memory checks)
from refengine.hf_folder import config_from_hf as config_from_hf  # (re-exported: sim/presets and perf import it here)
from refengine.hf_folder import generation_config, load_safetensors
from refengine.hf_twin import hf_config_for, to_hf_model  # noqa: F401  (re-exported)
from refengine.model import CausalLM, ModelConfig, RopeScaling
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
# tiny-qwen2 with an 8192-row vocabulary, for the test suites: the vocab-sized logits GEMM is most of a tiny-qwen2
# decode step on a CPU, and here it is 18x smaller. Text goes through the Qwen BPE with ids folded into range (as for
# llama-3.1-8b); end of sequence is where Qwen's two EOS ids fold to.
TEST_VOCAB = 8192
TEST_MODEL = "tiny-qwen2-8k"
PRESETS[TEST_MODEL] = PRESETS["tiny-qwen2"].replace(
    vocab_size=TEST_VOCAB, eos_token_id=tuple(i % TEST_VOCAB for i in QWEN_EOS)
)

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


def _empty_model(
    config: ModelConfig, device: str | torch.device, dtype: torch.dtype, attention_backend: str | None
) -> CausalLM:
    """Allocate the model directly at its device and dtype: built on `meta`, then materialised uninitialised."""
    backend = get_attention_backend(attention_backend or default_backend_name(torch.device(device)))
    with torch.device("meta"):
        model = CausalLM(config, backend)
    # What `to_empty` does, with torch.empty for torch.empty_like: empty_like of a meta tensor goes through torch's
    # Python decompositions and imports torch.fx's symbolic shapes on first use, 1.2 s of every fresh process's load.
    model = model.to(dtype=dtype)
    model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))  # type: ignore[no-untyped-call]
    model.tie_weights()  # parameters are replaced one module at a time, which unties a shared weight
    return model.eval().requires_grad_(False)


def _draw(name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """float32 CPU tensor for one parameter; its own generator, so the order and threading of draws is moot."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    # The CPU generator keeps only 32 bits of its seed, so seed and name are hashed together into 32 bits.
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
    return torch.empty(shape).normal_(0.0, INIT_STD, generator=gen)


def build_random_model(
    config: ModelConfig,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    seed: int = 0,
    attention_backend: str | None = None,
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
    model: str,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    seed: int = 0,
    attention_backend: str | None = None,
) -> tuple[CausalLM, ModelConfig]:
    """A preset name (random weights from `seed`) or a local HF folder (config.json + *.safetensors)."""
    config = load_model_config(model)
    if model in PRESETS:
        return build_random_model(
            config, device=device, dtype=dtype, seed=seed, attention_backend=attention_backend
        ), config
    lm = _empty_model(config, device, resolve_dtype(dtype, device), attention_backend)
    load_safetensors(lm, _folder(model))
    return lm, config


def load_model_config(model: str) -> ModelConfig:
    """The ModelConfig of a preset name or a local HF folder, without its weights."""
    if model in PRESETS:
        return PRESETS[model]
    folder = _folder(model)
    return config_from_hf(json.loads((folder / "config.json").read_text()), generation_config(folder))


def _folder(model: str) -> Path:
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
    folder = _folder(model)
    eos = config.eos_token_ids[0] if config.eos_token_ids else None
    if (folder / "tokenizer.json").is_file():
        return HFTokenizer(folder / "tokenizer.json", eos)
    if config.vocab_size in (QWEN_VOCAB, 152064):  # Qwen2.5 small / large embedding padding
        return QwenTokenizer(eos, config.vocab_size)
    return NoTokenizer(model, eos, config.vocab_size)
