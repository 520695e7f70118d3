"""The sampler's inputs of one step, from the InputBatch's host copies: which sampler paths the step needs and the
int64 index arrays they read (`sampling_arrays`, packed with the model inputs so that they cross to the device in the
same copy), then the SamplingMetadata over their device views (`sampling_metadata`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from refengine.sample.penalties import PenaltyStep
from refengine.sample.sampler import SamplingMetadata
from refengine.worker.input_batch import NO_SEED, InputBatch


def sampling_arrays(batch: InputBatch, rows: np.ndarray) -> tuple[dict[str, Any], list[np.ndarray]]:
    """From the host copies: which sampler paths this step needs, and the int64 arrays they read (packed with
    the model inputs, so that they cross to the device in the same copy)."""
    num_out = batch.num_tokens[rows] - batch.num_prompt_tokens[rows]  # [n] output tokens so far
    masked = np.flatnonzero(num_out < batch.min_tokens[rows])
    pairs = [(i, t) for i in masked.tolist() for t in batch.banned[rows[i]]]
    names: list[str] = []
    arrays: list[np.ndarray] = []
    if pairs:
        names += ["banned_rows", "banned_tokens"]
        arrays += [np.array([i for i, _ in pairs]), np.array([t for _, t in pairs])]
    penalties = batch.penalties.step_arrays(rows, batch.token_ids, batch.num_tokens, batch.num_prompt_tokens)
    if penalties is not None:  # (greedy rows too: vLLM penalises before the argmax)
        names += PenaltyStep.ARRAY_NAMES
        arrays += penalties.arrays
    greedy = batch.greedy[rows]
    info: dict[str, Any] = {"all_greedy": bool(greedy.all()), "names": names, "rows": None, "penalties": penalties}
    if not info["all_greedy"]:
        rand = np.flatnonzero(~greedy)  # [r]
        rrows = rows[rand]
        seeded = np.flatnonzero(batch.seeds[rrows] != NO_SEED)
        info.update(
            rows=rrows,
            mixed=len(rand) < len(rows),
            top_k=bool(batch.top_k_on[rrows].any()),
            top_p=bool(batch.top_p_on[rrows].any()),
            min_p=bool(batch.min_p_on[rrows].any()),
            any_seeded=len(seeded) > 0,
            any_unseeded=len(seeded) < len(rand),
        )
        names += ["random_idx", "random_rows"]
        arrays += [rand, rrows]
        if len(seeded):
            names += ["seeded_idx", "output_index"]
            arrays += [seeded, num_out[rand][seeded]]
    return info, arrays


def sampling_metadata(batch: InputBatch, info: dict[str, Any], views: list[torch.Tensor]) -> SamplingMetadata:
    t = dict(zip(info["names"], views))
    md = SamplingMetadata(
        all_greedy=info["all_greedy"], banned_rows=t.get("banned_rows"), banned_tokens=t.get("banned_tokens")
    )
    if info["penalties"] is not None:
        views = [t[name] for name in PenaltyStep.ARRAY_NAMES]
        for name, value in batch.penalties.update_and_gather(info["penalties"], views).items():
            setattr(md, name, value)
    if md.all_greedy:
        return md
    rrows = t["random_rows"]
    md.random_idx = t["random_idx"] if info["mixed"] else None
    md.temperature = batch.temperature_dev[rrows]
    md.top_k = batch.top_k_dev[rrows] if info["top_k"] else None
    md.top_p = batch.top_p_dev[rrows] if info["top_p"] else None
    md.min_p = batch.min_p_dev[rrows] if info["min_p"] else None
    md.any_unseeded = info["any_unseeded"]
    if info["any_seeded"]:
        md.seeded_idx = t["seeded_idx"]
        md.seeds = batch.seeds_dev[rrows[md.seeded_idx]]
        md.output_index = t["output_index"]
    return md
