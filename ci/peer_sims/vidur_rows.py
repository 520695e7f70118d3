"""Vidur 0.0.26 on every measured row, from what its wheel carries: runs in .venv-vidur.

    .venv-vidur/bin/python ci/peer_sims/vidur_rows.py PART_CSV [--limit N]

Vidur predicts a step from per-operator profiles of one model on one device, measured in bf16. Each row is checked
against what the installed package itself declares, and every reason it cannot be predicted is written down:
- the model, matched by shape (layers, heads, KV heads, hidden and MLP sizes, head size) against Vidur's model
  configs, so Llama-3.1-8B is Vidur's Llama-3-8B and Llama-3.1-70B its Llama-3-70B; Qwen3-32B matches none;
- the GPU, against Vidur's device SKUs (A40, A100, H100, L40: no H200);
- the dtype: the rows run fp8 GEMMs; Vidur's model configs have no dtype and its profiles are bf16;
- the length: isl + osl must fit the Vidur model's max_model_len;
- the profiles: for each (model, device) Vidur knows, a real Simulator is built offline (HF_HUB_OFFLINE=1; a cache
  given in VIDUR_CACHE_DIR is used, else an empty one). The 0.0.26 wheel ships no profile: its sklearn predictor
  downloads them from Hugging Face datasets at run time, which no machine of this project reaches.
A row with any reason is `unsupported`. The mapping a fitting row would get (vllm scheduler, batch_size_cap =
concurrency, 20c fixed-length requests all arriving at t=0, TTFT from arrival) is not built: no row fits today, and
code that has never run would be a claim, not a prediction. A row that fits all checks is written as `error` saying so.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub is imported: no network at run time
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fixed_closed_loop, prediction, runner_start, write_part  # noqa: E402

SIMULATOR = "vidur"
PINNED = "0.0.26"
# the measured models' shapes, from their Hugging Face config.json (as aiconfigurator-core 0.12.0 ships them):
# (num_layers, num_q_heads, num_kv_heads, embedding_dim, mlp_hidden_dim, head_dim, vocab_size); the vocabulary tells
# Llama-3-70B from Llama-2-70B, whose layers are the same
SHAPES = {
    "llama-3.1-8b": (32, 32, 8, 4096, 14336, 128, 128256),
    "llama-3.1-70b": (80, 64, 8, 8192, 28672, 128, 128256),
    "qwen3-32b": (64, 64, 8, 5120, 25600, 128, 151936),  # head_dim 128 != 5120 / 64: Vidur's config cannot say it
}
NETWORK_DEVICE = "h100_dgx"  # the one node type of Vidur's with 8 GPUs on NVLink, as the measured H100 nodes


def vidur_models() -> dict[tuple[int, ...], Any]:
    """Vidur's model configs by shape; abstract family configs that cannot be built are skipped."""
    from vidur.config.model_config import BaseModelConfig
    from vidur.config.utils import get_all_subclasses

    found: dict[tuple[int, ...], Any] = {}
    for cls in get_all_subclasses(BaseModelConfig):
        try:
            m = cls()
        except TypeError:
            continue
        shape = (m.num_layers, m.num_q_heads, m.num_kv_heads, m.embedding_dim, m.mlp_hidden_dim)
        found.setdefault((*shape, m.embedding_dim // m.num_q_heads, m.vocab_size), m)
    return found


def vidur_devices() -> list[str]:
    from vidur.types import DeviceSKUType

    return [str(t) for t in DeviceSKUType]


def probe_profiles(model_name: str, device: str, tp: int) -> str | None:
    """Build Vidur's simulator for (model, device) offline; None if it could, else why not (its own error)."""
    from vidur.config import SimulationConfig
    from vidur.simulator import Simulator

    dataset = f"project-vajra/dev-staging-{model_name.lower().replace('/', '-')}-{device}"  # the default's pattern
    work = tempfile.mkdtemp(prefix="vidur-probe-")
    cache = os.environ.get("VIDUR_CACHE_DIR") or f"{work}/cache"
    prefix = "--random_forrest_execution_time_predictor_config_"
    argv = [
        "vidur",
        f"--replica_config_model_name={model_name}",
        f"--replica_config_device={device}",
        f"--replica_config_network_device={NETWORK_DEVICE}",
        f"--replica_config_tensor_parallel_size={tp}",
        "--replica_scheduler_config_type=vllm",
        f"{prefix}model_profiling_dataset={dataset}",
        f"{prefix}cache_dir={cache}",
        f"--metrics_config_output_dir={work}/out",
    ]
    saved, sys.argv = sys.argv, argv
    try:
        Simulator(SimulationConfig.create_from_cli_args())
    except Exception as e:  # what Vidur raises is the finding
        first = str(e).split(".")[0][:100]
        return f"no profile on disk for {model_name} on {device} ({dataset}): {type(e).__name__}: {first}"
    finally:
        sys.argv = saved
    return None


def reasons(row: dict[str, str], models: dict[tuple[int, ...], Any], devices: list[str]) -> tuple[list[str], Any]:
    """Every static reason Vidur cannot take the row, and the Vidur model it maps to (None if none)."""
    out: list[str] = []
    unfit = fixed_closed_loop(row)
    if unfit:
        out.append(unfit)
    model = models.get(SHAPES.get(row["model"], ()))
    if model is None:
        out.append(f"no Vidur model has {row['model']}'s shape")
    if row["gpu"] not in devices:
        out.append(f"gpu {row['gpu']} is not a Vidur device ({', '.join(devices)})")
    if row["dtype"] != "bfloat16":
        out.append(f"{row['dtype']} GEMMs, but Vidur has no dtype and its profiles are bf16")
    if model is not None and row["isl"] and int(row["isl"]) + int(row["osl"]) > model.max_model_len:
        out.append(f"isl+osl over {model.get_name()}'s max_model_len {model.max_model_len}")
    return out, model


def predict_all(rows: list[dict[str, str]], version: str) -> list[dict[str, str]]:
    models, devices = vidur_models(), vidur_devices()
    probes: dict[tuple[str, str], str | None] = {}
    out = []
    for row in rows:
        why, model = reasons(row, models, devices)
        how = "not run"
        if model is not None:
            how = f"not run; would be {model.get_name()} on {row['gpu']}, tp {row['tensor_parallel_size']}"
            if row["gpu"] in devices:
                key = (model.get_name(), row["gpu"])
                if key not in probes:
                    probes[key] = probe_profiles(key[0], key[1], int(row["tensor_parallel_size"]))
                missing = probes[key]
                if missing:
                    why.append(missing)
        if why:
            out.append(prediction(row["id"], SIMULATOR, version, "unsupported", how, error="; ".join(why)))
        else:
            error = "fits every check, but the Vidur simulation path is not built (no row needed it before)"
            out.append(prediction(row["id"], SIMULATOR, version, "error", how, error=error))
    return out


def main() -> int:
    part, version, rows = runner_start(__doc__ or "", SIMULATOR, PINNED)
    out = predict_all(rows, version)
    write_part(part, out)
    print(f"  vidur: {len(out)} rows, {sum(r['status'] == 'ok' for r in out)} predicted", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
