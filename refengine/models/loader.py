"""Where models and tokenizers come from: presets with seeded random weights, or a local Hugging Face folder.

Nothing here touches the network. A preset is a `ModelConfig` at a real or toy shape whose weights are drawn
from a seeded generator; a folder is config.json + *.safetensors (sharded or not) of the Llama / Qwen2 /
Mistral families. `to_hf_model` (refengine/models/hf_twin.py) builds the equivalent transformers model with identical
weights, for the conformance tests and for the Hugging Face perf peers.

Model and tokenizer are resolved the same way: a preset name wins over a folder of the same name. The presets and
that resolution (config and tokenizer, no weights, no torch) are refengine/models/presets.py's. What a
folder's files mean (config.json, generation_config.json, the safetensors) is refengine/models/hf_folder.py's.
"""

from __future__ import annotations

import importlib.util
import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import torch

from refengine.config import ATTENTION_BACKENDS, DTYPE_NAMES, dtype_name
from refengine.layers.attention import default_backend_name, get_attention_backend
from refengine.models.decoder import CausalLM
from refengine.models.hf_folder import load_safetensors
from refengine.models.model_config import ModelConfig
from refengine.models.presets import PRESETS, load_model_config, model_folder

INIT_STD = 0.02  # normal(0, 0.02) for weights and biases, ones for norms: the usual initializer_range
_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, canonical) for name, canonical in DTYPE_NAMES.items()}


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
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be a float type ({sorted(_DTYPES)}), got {dtype}")
        return dtype
    return _DTYPES[dtype_name(dtype, str(torch.device(device)))]


def _empty_model(
    config: ModelConfig, device: str | torch.device, dtype: torch.dtype, attention_backend: str | None
) -> CausalLM:
    """Allocate the model directly at its device and dtype: built on `meta`, then materialised uninitialised."""
    backend = get_attention_backend(attention_backend or default_backend_name(torch.device(device)))
    with torch.device("meta"):
        model = CausalLM(config, backend)
    # What `to_empty` does, with torch.empty for torch.empty_like: empty_like of a meta tensor goes through torch's
    # Python decompositions and imports torch.fx's symbolic shapes on first use, a cost every fresh process's load
    # would pay (docs/measurements.md).
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
    # drawn per checkpoint name (q_proj, k_proj, ... even where they are stored merged), so that the weights do not
    # depend on how the model stores them; a tied lm_head appears once, as model.embed_tokens.weight
    weights = list(model.checkpoint_weights())

    def fill(item: tuple[str, torch.Tensor]) -> None:
        name, dst = item
        dst.copy_(_draw(name, dst.shape, seed))

    # Draws are CPU-bound and release the GIL; threads make an 8B preset take seconds rather than minutes. (Shards
    # of one merged weight are disjoint rows: threads copying into them do not overlap.)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(fill, weights))
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
    load_safetensors(lm, model_folder(model))
    return lm, config
