"""Stop lists cannot stall the batch: `stop` and `stop_token_ids` have named caps (ValueError naming the field), and
the stop-string search costs O(new characters x longest stop) per request and step, whatever the number of stop
strings: counted here as dictionary probes, not timed. (benchmarks/stop_lists.py measures the step time a request
with the longest allowed lists adds to a batch.) The search still finds what vLLM's does: the first listed stop
string that ends in the new text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refengine.engine.detokenizer import IncrementalDetokenizer
from refengine.request import Request
from refengine.sampling_params import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, SamplingParams
from refengine.tokenizer import QwenTokenizer

QWEN = QwenTokenizer()
TEXT = "The quick brown fox jumps over the lazy dog, again and again, until the end of the line. " * 3
PUA = "\ue000"  # a private-use character: the text never holds it, so these stops never match


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(stop=["x"] * (MAX_STOP_STRINGS + 1)), "stop"),
        (dict(stop="y" * (MAX_STOP_STRING_CHARS + 1)), "stop"),
        (dict(stop=["ok", "z" * (MAX_STOP_STRING_CHARS + 1)]), "stop"),
        (dict(stop_token_ids=list(range(MAX_STOP_TOKEN_IDS + 1))), "stop_token_ids"),
        (dict(stop_token_ids=[1] * 1_000_000), "stop_token_ids"),
    ],
    ids=["too-many-stops", "too-long-stop", "one-too-long", "too-many-stop-ids", "a-million-stop-ids"],
)
def test_stop_lists_beyond_the_caps_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_stop_lists_at_the_caps_are_accepted():
    sp = SamplingParams(
        stop=["s" * MAX_STOP_STRING_CHARS] * MAX_STOP_STRINGS, stop_token_ids=list(range(MAX_STOP_TOKEN_IDS))
    )
    assert len(sp.stop) == MAX_STOP_STRINGS and len(sp.stop_token_ids) == MAX_STOP_TOKEN_IDS


class CountingDict(dict):
    """The stop-string index, counting the probes the search makes."""

    probes = 0

    def get(self, key, default=None):
        CountingDict.probes += 1
        return super().get(key, default)


def _stream(stops: list[str], text: str = TEXT) -> tuple[int, int, str | None]:
    """Feed `text`'s tokens one per step; (probes, characters decoded, the stop that ended it or None)."""
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=10_000, stop=stops))
    detok = IncrementalDetokenizer(QWEN, req)
    detok._stop_rank = CountingDict(detok._stop_rank)
    CountingDict.probes = 0
    stop = None
    for tok in QWEN.encode(text):
        req.append_output_token_ids((tok,))
        stop = detok.update()
        detok.take_delta(finished=stop is not None)
        if stop is not None:
            break
    return CountingDict.probes, detok.num_chars, stop


def test_the_search_does_not_grow_with_the_number_of_stops():
    many = [PUA * (i % 100 + 1) + str(i) for i in range(MAX_STOP_STRINGS)]  # distinct, all ending in digits
    probes, chars, stop = _stream(many)
    assert stop is None and probes == 0  # the text holds no digit: no stop ends in any of its characters


def test_the_worst_stop_list_costs_at_most_longest_stop_probes_per_character():
    """Every stop ends in a character the text is full of (a space), with every length up to the cap."""
    worst = [PUA * (n - 1) + " " for n in range(2, MAX_STOP_STRING_CHARS + 1)]
    probes, chars, stop = _stream(worst)
    assert stop is None and probes > 0
    assert probes <= chars * MAX_STOP_STRING_CHARS  # not O(the stop list) per step: O(new chars x longest stop)
    assert probes <= TEXT.count(" ") * len(worst)  # only at the characters some stop ends in


def _reference(text_steps: list[str], stops: list[str]) -> tuple[str | None, int]:
    """vLLM's StopChecker over the same steps: each stop in list order, searched in the new text plus len - 1
    characters before it; the first found ends the request. Returns (the stop, where the kept text ends)."""
    text = ""
    for new in text_steps:
        before = len(text)
        text += new
        for stop in stops:
            idx = text.find(stop, max(0, before - len(stop) + 1))
            if idx >= 0:
                return stop, idx
    return None, len(text)


@settings(max_examples=60)
@given(data=st.data())
def test_the_search_finds_what_vllms_does(data):
    ids = QWEN.encode(TEXT)[: data.draw(st.integers(5, 60))]
    pieces = [QWEN.decode(ids[:k]) for k in range(len(ids) + 1)]
    text = pieces[-1]
    substrings = st.builds(lambda a, n: text[a : a + n], st.integers(0, len(text) - 1), st.integers(1, 12))
    stops = data.draw(
        st.lists(st.one_of(substrings, st.sampled_from([PUA, "zz", " q"])), min_size=1, max_size=8).filter(
            lambda ss: all(ss)
        )
    )
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=10_000, stop=stops))
    detok = IncrementalDetokenizer(QWEN, req)
    got, steps = None, []
    for k, tok in enumerate(ids):
        req.append_output_token_ids((tok,))
        steps.append(pieces[k + 1][len(pieces[k]) :])
        got = detok.update()
        if got is not None:
            break
    want, cut = _reference(steps, stops)
    assert got == want
    if got is not None:
        assert detok.take_delta(finished=True) == "".join(steps)[:cut]
