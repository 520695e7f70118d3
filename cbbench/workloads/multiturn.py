"""Multi-turn conversations: `sharegpt-multiturn` (ShareGPT's own turns) and `multiturn` (synthetic).

`num_prompts` counts conversations. Each conversation is a run of turns (`WorkloadRequest`s with the same
`conversation_id` and turn 0, 1, ...). A turn holds only its new user message; the runner sends turn k after turn
k - 1's answer has returned, with the whole conversation so far (every earlier user message and the tokens actually
generated for it) as the prompt's prefix. This is where prefix caching and KV pressure show: every turn re-sends a
growing prefix that a prefix cache can hit, and conversations hold their context across turns.

Arrivals are per conversation (the registry's arrival process gives each conversation's first turn its time).

- `sharegpt-multiturn`: conversations with at least `min_turns` (human, gpt) exchanges, in seeded order; the human
  message is the user turn and the gpt reply's token count its output length. A conversation is cut at `max_turns`,
  and before the first turn that would take its context (all user + output tokens so far) over `max_context_len`.
- `multiturn`: `num_turns` turns of `user_len` synthetic token ids and `output_len` outputs each.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .sharegpt import JSONArrayReader, load_sharegpt
from .synthetic import DEFAULT_TOKEN_ID_RANGE
from .workload import Tokenizer, WorkloadRequest

Sample = tuple[list[WorkloadRequest], dict[str, Any]]
_MULTITURN_STREAM = 0x3717


@functools.lru_cache(maxsize=2)
def _exchanges(path: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Every conversation of a ShareGPT file as its (human, gpt) exchanges, in file order."""
    out = []
    with open(path, encoding="utf-8") as fp:
        for rec in JSONArrayReader(fp):
            conv = rec.get("conversations") if isinstance(rec, dict) else None
            if not isinstance(conv, list):
                continue
            pairs = []
            for human, gpt in zip(conv[::2], conv[1::2]):
                if (
                    not (isinstance(human, dict) and isinstance(gpt, dict))
                    or human.get("from") != "human"
                    or gpt.get("from") != "gpt"
                ):
                    break
                pairs.append((str(human.get("value", "")), str(gpt.get("value", ""))))
            out.append(tuple(pairs))
    return tuple(out)


def _sharegpt_file(dataset_path: str | None) -> tuple[str, str]:
    if dataset_path is not None:
        load_sharegpt(dataset_path)  # the same checks and errors as the sharegpt workload
        return str(dataset_path), str(dataset_path)
    from .sharegpt import _package_source

    path, source = _package_source()
    return str(path), source


def _conversation(
    tokenizer: Tokenizer, pairs: tuple[tuple[str, str], ...], cid: int, max_turns: int, max_context_len: int
) -> list[WorkloadRequest]:
    turns: list[WorkloadRequest] = []
    context = 0
    for k, (human, gpt) in enumerate(pairs[:max_turns]):
        ids, out_len = list(tokenizer.encode(human)), len(tokenizer.encode(gpt))
        if not ids or out_len < 1 or context + len(ids) + out_len > max_context_len:
            break
        context += len(ids) + out_len
        turns.append(WorkloadRequest(ids, out_len, 0.0, human, conversation_id=cid, turn=k))
    return turns


def sample_sharegpt_multiturn(
    *,
    tokenizer: Tokenizer | None,
    num_prompts: int,
    seed: int,
    dataset_path: str | None = None,
    min_turns: int = 2,
    max_turns: int = 8,
    max_context_len: int = 2048,
) -> Sample:
    """`num_prompts` ShareGPT conversations of at least `min_turns` turns (see the module docstring)."""
    if tokenizer is None:
        raise ValueError("tokenizer: the sharegpt-multiturn workload needs a tokenizer")
    if not 1 <= min_turns <= max_turns:
        raise ValueError(f"min_turns / max_turns: need 1 <= min_turns <= max_turns, got {min_turns} / {max_turns}")
    if max_context_len < 2:
        raise ValueError(f"max_context_len must be >= 2, got {max_context_len}")
    path, source = _sharegpt_file(dataset_path)
    convs = _exchanges(path)
    order = list(range(len(convs)))
    np.random.default_rng([seed, _MULTITURN_STREAM]).shuffle(order)
    requests: list[WorkloadRequest] = []
    found = 0
    for i in order:
        if found == num_prompts:
            break
        if len(convs[i]) < min_turns:
            continue
        turns = _conversation(tokenizer, convs[i], found, max_turns, max_context_len)
        if len(turns) >= min_turns:
            requests += turns
            found += 1
    if found < num_prompts:
        raise ValueError(
            f"num_prompts: only {found} conversations in {source} have {min_turns}+ turns within "
            f"max_context_len {max_context_len}, {num_prompts} asked"
        )
    return requests, {
        "dataset": source,
        "dataset_path": dataset_path,
        "min_turns": min_turns,
        "max_turns": max_turns,
        "max_context_len": max_context_len,
    }


def sample_multiturn(
    *, num_prompts: int, seed: int, num_turns: int = 4, user_len: int = 64, output_len: int = 64
) -> Sample:
    """`num_prompts` synthetic conversations of `num_turns` turns."""
    for name, v in (("num_turns", num_turns), ("user_len", user_len), ("output_len", output_len)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    rng = np.random.default_rng([seed, _MULTITURN_STREAM, 1])
    lo, hi = DEFAULT_TOKEN_ID_RANGE
    requests = [
        WorkloadRequest(rng.integers(lo, hi, user_len).tolist(), output_len, conversation_id=c, turn=k)
        for c in range(num_prompts)
        for k in range(num_turns)
    ]
    return requests, {"num_turns": num_turns, "user_len": user_len, "output_len": output_len}


sample_sharegpt_multiturn.conversations = True  # type: ignore[attr-defined]
sample_multiturn.conversations = True  # type: ignore[attr-defined]
