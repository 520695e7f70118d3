"""Workloads users bring: vLLM's custom JSONL, local Hugging Face datasets, Azure / Mooncake / plain traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cbbench.workloads.catalog import MAX_NUM_PROMPTS, get_workload
from cbbench.workloads.trace import MOONCAKE_BLOCK_TOKENS


class WordTokenizer:
    """One token per whitespace-separated word, so lengths are word counts."""

    def encode(self, text: str) -> list[int]:
        return [1000 + len(w) for w in text.split()]


TOK = WordTokenizer()


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ---------------------------------------------------------------- custom


def test_custom_reads_prompts_and_each_lines_output_length(tmp_path):
    f = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "a bb ccc", "output_len": 7},
            {"prompt": "x y", "max_tokens": 3},
            {"prompt": "one two three four", "output_tokens": 9},
            {"prompt": "z"},
        ],
    )
    w = get_workload("custom", tokenizer=TOK, num_prompts=4, dataset_path=f, output_len=5)
    assert w.prompt_lens == [3, 2, 4, 1]
    assert w.output_lens == [7, 3, 9, 5]  # the last line has no length: the default
    assert w.requests[0].prompt_token_ids == TOK.encode("a bb ccc")
    assert w.requests[0].prompt_text == "a bb ccc"
    rebuilt = get_workload("custom", tokenizer=TOK, **w.params)
    assert rebuilt.requests == w.requests


def test_custom_shuffle_is_seeded(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [{"prompt": " ".join(["w"] * (i + 1))} for i in range(20)])
    a = get_workload("custom", tokenizer=TOK, num_prompts=5, dataset_path=f, shuffle=True, seed=1)
    b = get_workload("custom", tokenizer=TOK, num_prompts=5, dataset_path=f, shuffle=True, seed=1)
    c = get_workload("custom", tokenizer=TOK, num_prompts=5, dataset_path=f, shuffle=True, seed=2)
    assert a.prompt_lens == b.prompt_lens != c.prompt_lens
    assert get_workload("custom", tokenizer=TOK, num_prompts=5, dataset_path=f).prompt_lens == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"prompt": "a"}\nnot json\n', "d.jsonl:2: not a JSON object"),
        ('{"text": "a"}\n', "d.jsonl:1: each line must be a JSON object with a 'prompt' field"),
        ('{"prompt": ""}\n', "d.jsonl:1: prompt must be non-empty text"),
        ('{"prompt": "a", "output_len": 0}\n', "output length must be an integer >= 1"),
        ('{"prompt": "a", "max_tokens": "5"}\n', "output length must be an integer >= 1"),
        ('{"prompt": "a"}\n{"prompt": "b"}\n', "d.jsonl holds only 2 records, 3 asked"),
    ],
)
def test_custom_bad_file_names_the_line(tmp_path, content, message):
    (tmp_path / "d.jsonl").write_text(content)
    with pytest.raises(ValueError, match=message):
        get_workload(
            "custom", tokenizer=TOK, num_prompts=3 if "asked" in message else 1, dataset_path=str(tmp_path / "d.jsonl")
        )


def test_a_small_custom_file_just_works_without_num_prompts(tmp_path):
    """The README's custom-data example on a file shorter than the CPU default of 8 prompts: all of its prompts,
    and one line saying so; a count the user gave and the file cannot meet is still refused."""
    from typer.testing import CliRunner

    from cbbench.perf.cli import app

    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"hello number {i}", "output_len": 4} for i in range(5)])
    res = CliRunner().invoke(app, ["perf", "--workload", "custom", "--dataset-path", f, "--dry-run"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("workload custom: 5 requests;")
    assert res.stderr.count("\n") == 1 and "holds 5 records, fewer than the default 8: using all 5" in res.stderr
    res = CliRunner().invoke(
        app, ["perf", "--workload", "custom", "--dataset-path", f, "--num-prompts", "8", "--dry-run"]
    )
    assert res.exit_code == 2 and "holds only 5 records, 8 asked" in res.stderr


def test_missing_dataset_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="needs --dataset-path"):
        get_workload("custom", tokenizer=TOK, num_prompts=1)
    with pytest.raises(ValueError, match="hub ids are not fetched"):
        get_workload("hf", tokenizer=TOK, num_prompts=1, dataset_path="org/some-dataset")
    with pytest.raises(ValueError, match="does not exist"):
        get_workload("trace", num_prompts=1, dataset_path=str(tmp_path / "nope.csv"))


# ---------------------------------------------------------------- hf


def _table(n: int):
    pa = pytest.importorskip("pyarrow")
    return pa.table({"question": [" ".join(["q"] * (i + 2)) for i in range(n)], "n_out": [i + 1 for i in range(n)]})


def test_hf_parquet_file_with_column_detection_and_output_column(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(_table(4), tmp_path / "d.parquet")
    w = get_workload(
        "hf", tokenizer=TOK, num_prompts=3, dataset_path=str(tmp_path / "d.parquet"), output_column="n_out"
    )
    assert w.prompt_lens == [2, 3, 4] and w.output_lens == [1, 2, 3]
    assert w.params["column"] == "question"


def test_hf_save_to_disk_folder_with_splits(tmp_path):
    import pyarrow as pa

    for split, n in (("train", 3), ("test", 2)):
        (tmp_path / split).mkdir()
        with pa.ipc.new_stream(tmp_path / split / "data-00000-of-00001.arrow", _table(n).schema) as sink:
            sink.write_table(_table(n))
    (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert len(get_workload("hf", tokenizer=TOK, num_prompts=3, dataset_path=str(tmp_path))) == 3
    w = get_workload("hf", tokenizer=TOK, num_prompts=2, dataset_path=str(tmp_path), split="test", output_len=4)
    assert w.output_lens == [4, 4]
    with pytest.raises(ValueError, match="split: 'dev' is not in"):
        get_workload("hf", tokenizer=TOK, num_prompts=1, dataset_path=str(tmp_path), split="dev")


def test_hf_unknown_column_lists_the_columns(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(_table(2), tmp_path / "d.parquet")
    with pytest.raises(ValueError, match="column: 'body' not found; the dataset's columns: question, n_out"):
        get_workload("hf", tokenizer=TOK, num_prompts=1, dataset_path=str(tmp_path / "d.parquet"), column="body")


# ---------------------------------------------------------------- trace

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:47.5000000,30,4
2023-11-16 18:15:46.2500000,10,2
2023-11-16 18:15:48.0000000,20,3
"""


def test_azure_trace_is_replayed_in_time_order_at_its_own_timestamps(tmp_path):
    (tmp_path / "azure.csv").write_text(AZURE)
    w = get_workload("trace", num_prompts=3, dataset_path=str(tmp_path / "azure.csv"))
    assert w.params["format"] == "azure"
    assert w.prompt_lens == [10, 30, 20] and w.output_lens == [2, 4, 3]
    assert w.arrival_times == pytest.approx([0.0, 1.25, 1.75])
    slow = get_workload("trace", num_prompts=3, dataset_path=str(tmp_path / "azure.csv"), time_scale=2.0)
    assert slow.arrival_times == pytest.approx([0.0, 2.5, 3.5])
    with pytest.raises(ValueError, match="replays its own timestamps"):
        get_workload("trace", num_prompts=3, dataset_path=str(tmp_path / "azure.csv"), request_rate=4.0)


def test_mooncake_hash_ids_share_prefix_blocks(tmp_path):
    b = MOONCAKE_BLOCK_TOKENS
    f = write_jsonl(
        tmp_path / "mc.jsonl",
        [
            {"timestamp": 0, "input_length": 2 * b + 5, "output_length": 3, "hash_ids": [1, 2, 3]},
            {"timestamp": 500, "input_length": b + 7, "output_length": 2, "hash_ids": [1, 9]},
        ],
    )
    w = get_workload("trace", num_prompts=2, dataset_path=f, seed=3)
    a, c = (r.prompt_token_ids for r in w.requests)
    assert len(a) == 2 * b + 5 and len(c) == b + 7
    assert a[:b] == c[:b]  # hash id 1 in both: the same first block
    assert a[b : b + 7] != c[b : b + 7]  # then different blocks
    assert w.arrival_times == [0.0, 0.5]
    assert get_workload("trace", num_prompts=2, dataset_path=f, seed=3).requests == w.requests


def test_plain_trace_and_bad_columns(tmp_path):
    f = write_jsonl(
        tmp_path / "p.jsonl",
        [{"timestamp": 2.0, "input_len": 5, "output_len": 1}, {"timestamp": 3.0, "input_len": 6, "output_len": 2}],
    )
    assert get_workload("trace", num_prompts=2, dataset_path=f).arrival_times == [0.0, 1.0]
    g = write_jsonl(tmp_path / "bad.jsonl", [{"t": 1, "in": 2}])
    with pytest.raises(ValueError, match="match no known trace"):
        get_workload("trace", num_prompts=1, dataset_path=g)


def test_num_prompts_beyond_the_cap_is_refused_at_once():
    with pytest.raises(ValueError, match=f"num_prompts must be <= {MAX_NUM_PROMPTS}"):
        get_workload("fixed", num_prompts=10**12)


# ---------------------------------------------------------------- multi-turn


def test_synthetic_multiturn_shares_one_arrival_per_conversation():
    w = get_workload("multiturn", num_prompts=3, num_turns=2, user_len=5, output_len=4, request_rate=10.0)
    assert [(r.conversation_id, r.turn) for r in w.requests] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert w.is_multi_turn and w.prompt_lens == [5] * 6 and w.output_lens == [4] * 6
    starts = [w.requests[i].arrival_time for i in (0, 2, 4)]
    assert starts[0] == 0.0 < starts[1] < starts[2]
    assert all(w.requests[i].arrival_time == w.requests[i + 1].arrival_time for i in (0, 2, 4))


def _sharegpt_file(tmp_path: Path, convs: list[list[tuple[int, int]]]) -> str:
    """A ShareGPT file whose conversations have the given (human words, gpt words) exchanges."""
    recs = [
        {
            "id": str(i),
            "conversations": [
                t
                for h, g in c
                for t in (
                    {"from": "human", "value": " ".join(["h"] * h)},
                    {"from": "gpt", "value": " ".join(["g"] * g)},
                )
            ],
        }
        for i, c in enumerate(convs)
    ]
    (tmp_path / "sg.json").write_text(json.dumps(recs))
    return str(tmp_path / "sg.json")


def test_sharegpt_multiturn_keeps_the_turns_and_cuts_at_the_context_limit(tmp_path):
    f = _sharegpt_file(
        tmp_path,
        [
            [(3, 4), (5, 6), (7, 8)],  # 3 turns: 7 + 11 + 15 = 33 tokens
            [(2, 2)],  # one turn only: dropped (min_turns 2)
            [(10, 10), (10, 10)],
        ],
    )  # 2 turns: 40 tokens

    def shapes(w) -> list[list[tuple[int, int]]]:
        by_conv: dict[int, list[tuple[int, int]]] = {}
        for r in w.requests:
            by_conv.setdefault(r.conversation_id, []).append((r.prompt_len, r.output_len))
            assert r.turn == len(by_conv[r.conversation_id]) - 1
        return sorted(by_conv.values())

    w = get_workload("sharegpt-multiturn", tokenizer=TOK, num_prompts=2, dataset_path=f, max_context_len=40)
    assert shapes(w) == [[(3, 4), (5, 6), (7, 8)], [(10, 10), (10, 10)]]
    # at 30 the 3-turn conversation is cut before its third turn (18 + 15 > 30), the 40-token one keeps only 1 turn
    w = get_workload("sharegpt-multiturn", tokenizer=TOK, num_prompts=1, dataset_path=f, max_context_len=30)
    assert shapes(w) == [[(3, 4), (5, 6)]]
    with pytest.raises(ValueError, match="only 1 conversations"):
        get_workload("sharegpt-multiturn", tokenizer=TOK, num_prompts=2, dataset_path=f, max_context_len=30)
