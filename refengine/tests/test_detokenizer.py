"""The incremental detokenizer (refengine/engine/detokenizer.py): exact text, stop strings, O(new tokens) per step.

Both of its streams are checked: the byte stream (the Qwen BPE's id -> bytes table) and the window stream (vLLM's
prefix / read offsets over `decode` alone, reached here through a decode-only wrapper of the same tokenizer). The
reference is always one `tokenizer.decode(all output ids)`.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.hypothesis_profiles import scaled
from refengine.engine.detokenizer import IncrementalDetokenizer
from refengine.request import Request
from refengine.sampling_params import SamplingParams
from refengine.tokenizer import QwenTokenizer

QWEN = QwenTokenizer()
# Text whose tokens split multi-byte characters: CJK, accents, emoji (4 bytes, often several byte tokens each).
MULTIBYTE = "naïve café 世界你好 🎉🚀 Ωμέγα ∑∫ добрый день 👩‍👩‍👧 end."
# Window stream: a step decodes the window twice. Its length is the tokens since the last emitted text plus those
# of that text; with a character split over at most 4 byte tokens that stays under 2 * 4, whatever the length.
MAX_WINDOW_IDS_PER_STEP = 2 * 8


class DecodeOnly:
    """A tokenizer with only `decode` (no id -> bytes table), counting the ids it is given."""

    def __init__(self, inner) -> None:
        self.inner, self.ids_decoded, self.calls = inner, 0, 0

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        self.ids_decoded += len(ids)
        self.calls += 1
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


class CountingTable:
    """QwenTokenizer whose id -> bytes table counts lookups, and whose decode must never be called."""

    def __init__(self, inner) -> None:
        self.inner, self.lookups = inner, 0
        self._table = inner.token_bytes_table()

    def token_bytes_table(self):
        return self

    def __len__(self) -> int:
        return len(self._table)

    def __getitem__(self, i: int) -> bytes:
        self.lookups += 1
        return self._table[i]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        raise AssertionError("the byte stream must not call decode")


TOKENIZERS = {"bytes": lambda: QWEN, "window": lambda: DecodeOnly(QWEN)}


def run_stream(
    tokenizer, ids: list[int], chunks: list[int] | None = None, **sp
) -> tuple[str, list[str], IncrementalDetokenizer]:
    """Feed `ids` as the engine does (append, update, take_delta), `chunks[k]` ids at step k (default 1 each).
    Returns (all text returned, the deltas, the detokenizer)."""
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=max(1, len(ids)), **sp))
    detok = IncrementalDetokenizer(tokenizer, req)
    deltas, pos, k = [], 0, 0
    while pos < len(ids):
        n = chunks[k % len(chunks)] if chunks else 1
        req.append_output_token_ids(ids[pos : pos + n])
        pos, k = pos + n, k + 1
        stop = detok.update()
        deltas.append(detok.take_delta(finished=stop is not None or pos >= len(ids)))
        if stop is not None:
            break
    return "".join(deltas), deltas, detok


# ids drawn to stress UTF-8 splits: raw byte tokens (0..255 include every lead and continuation byte), the tokens
# of multi-byte text, any id of the vocabulary, special tokens and padding ids past the BPE (decode to nothing)
_TEXT_IDS = QWEN.encode(MULTIBYTE)
token_ids = st.lists(
    st.one_of(
        st.integers(0, 255), st.sampled_from(_TEXT_IDS), st.integers(0, 151935), st.sampled_from([151643, 151645])
    ),
    max_size=60,
)


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
@settings(max_examples=scaled(150))
@given(ids=token_ids, chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4))
def test_text_equals_full_decode(kind: str, ids: list[int], chunks: list[int]) -> None:
    tok = TOKENIZERS[kind]()
    text, deltas, _ = run_stream(tok, ids, chunks)
    full = QWEN.decode(ids)
    assert text == full
    # nothing returned is ever taken back: every prefix of the stream is a prefix of the final text
    assert all(full.startswith("".join(deltas[: i + 1])) for i in range(len(deltas)))


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_multibyte_text_one_token_at_a_time(kind: str) -> None:
    ids = QWEN.encode(MULTIBYTE * 3)
    text, deltas, _ = run_stream(TOKENIZERS[kind](), ids)
    assert text == MULTIBYTE * 3 and "\ufffd" not in "".join(deltas)  # a split character is never shown half


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_trailing_incomplete_character_is_flushed_at_the_end(kind: str) -> None:
    lead = QWEN.token_bytes_table().index(b"\xe4")  # the first byte of a 3-byte character (CJK), alone
    ids = QWEN.encode("ok ") + [lead]
    text, _, _ = run_stream(TOKENIZERS[kind](), ids)
    assert text == QWEN.decode(ids) == "ok \ufffd"


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_tokens(kind: str, include: bool) -> None:
    body = "The quick brown fox jumps over the lazy dog while 世界 watches."
    ids = QWEN.encode(body)
    stop = "fox jumps ov"  # spans several tokens, and starts and ends inside tokens
    assert not any(QWEN.decode([i]) == stop for i in ids)
    text, deltas, detok = run_stream(TOKENIZERS[kind](), ids, stop=[stop], include_stop_str_in_output=include)
    cut = body.find(stop) + (len(stop) if include else 0)
    assert text == body[:cut] and detok.stopped_by == stop
    # the stop was seen at the token that completed it, not later
    n_tokens = next(n for n in range(1, len(ids) + 1) if stop in QWEN.decode(ids[:n]))
    assert detok.request.num_output_tokens == n_tokens


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
@settings(max_examples=scaled(100))
@given(data=st.data(), ids=st.lists(st.sampled_from(QWEN.encode("abc abd xyz 世界 ab" * 2)), min_size=1, max_size=40))
def test_stop_string_hypothesis(kind: str, data, ids: list[int]) -> None:
    """A stop string taken from the text itself: the text ends right before (or after) its first occurrence."""
    full = QWEN.decode(ids)
    start = data.draw(st.integers(0, len(full) - 1)) if full else 0
    stop = full[start : start + data.draw(st.integers(1, 5))] or "zz"
    include = data.draw(st.booleans())
    text, deltas, detok = run_stream(TOKENIZERS[kind](), ids, stop=[stop], include_stop_str_in_output=include)
    idx = full.find(stop)
    if idx < 0:
        assert text == full and detok.stopped_by is None
    else:
        assert text == full[: idx + (len(stop) if include else 0)] and detok.stopped_by == stop
    # held back while running: no delta but the last may show a prefix of the stop that was then cut
    assert full.startswith(text)


def _long_stream(n: int) -> list[int]:
    ids = QWEN.encode(MULTIBYTE + " plain ascii words follow here and there. ")
    return (ids * (n // len(ids) + 1))[:n]


def test_window_work_per_step_does_not_grow_with_output_length() -> None:
    tok = DecodeOnly(QWEN)
    ids = _long_stream(3000)
    req = Request("r", [1], SamplingParams(max_tokens=len(ids), stop=["never-seen"]))
    detok = IncrementalDetokenizer(tok, req)
    work = []
    for t in ids:
        req.append_output_token_ids([t])
        before = tok.ids_decoded
        detok.update()
        detok.take_delta(False)
        work.append(tok.ids_decoded - before)
    assert max(work) <= MAX_WINDOW_IDS_PER_STEP
    assert max(work[-500:]) <= max(work[:500])  # the same text repeated costs no more late than early
    assert len(detok._unsent) <= len("never-seen")  # the held-back tail does not grow either


def test_byte_stream_does_at_most_one_lookup_per_new_token_and_never_decodes() -> None:
    """The per-id text table is built once per bytes table (one pass over it); after that a new token costs at
    most one bytes lookup (none for a token of whole characters, whose text is looked up instead)."""
    tok = CountingTable(QWEN)
    IncrementalDetokenizer(tok, Request("warm", [1], SamplingParams()))  # builds the text table of `tok`
    assert tok.lookups >= len(tok)  # (it did read the table, so the counter works)
    tok.lookups = 0
    ids = _long_stream(2000)
    text, _, _ = run_stream(tok, ids, chunks=[1, 2, 3])
    assert 0 < tok.lookups <= len(ids)  # (multi-byte characters split across tokens need the bytes)
    assert text == QWEN.decode(ids)


def test_engine_text_equals_decode_of_its_tokens() -> None:
    from refengine import LLM

    llm = LLM(model="tiny-qwen2", device="cpu")
    outs = llm.generate(["Hello 世界", "naïve"], SamplingParams(max_tokens=24, temperature=1.0, seed=3))
    for o in outs:
        c = o.outputs[0]
        assert len(c.token_ids) == 24 and c.text == llm.llm_engine.tokenizer.decode(c.token_ids)
