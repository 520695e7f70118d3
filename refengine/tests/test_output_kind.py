"""SamplingParams.output_kind (vLLM's RequestOutputKind) decides what LLMEngine.step() returns for a request:
DELTA (the default: the tokens and text new since the last output), CUMULATIVE (everything so far, each step) or
FINAL_ONLY (one output, when it finishes, with the whole completion). Requests of all three kinds share one batch
and must get the same tokens and text; only what each step hands back differs."""

from __future__ import annotations

import pytest

from conformance.engine_helpers import TEST_MODEL, make_prompts
from refengine import LLM, LLMEngine, SamplingParams
from refengine.engine.detokenizer import IncrementalDetokenizer
from refengine.sampling_params import RequestOutputKind

KINDS = (None, RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY)
MAX_TOKENS = 12


def _params(kind, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, output_kind=kind, **kw)


def _run(engine: LLMEngine, prompts, kinds, **kw) -> dict[str, list]:
    """Every prompt once per kind, all in one batch; request id -> the outputs step() returned for it."""
    for i, p in enumerate(prompts):
        for k, kind in enumerate(kinds):
            engine.add_request(f"p{i}-k{k}", p, _params(kind, **kw))
    got: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.setdefault(out.request_id, []).append(out)
    return got


@pytest.fixture(scope="module")
def prompts():
    return make_prompts((5, 11, 23), seed=7)


@pytest.mark.parametrize("stop", [None, ["e"]])
def test_every_kind_gets_the_same_completion_and_returns_what_it_names(prompts, stop):
    """`stop` (a stop string that cuts the text, held back while it may still be forming) included."""
    got = _run(LLMEngine(TEST_MODEL), prompts, KINDS, stop=stop)
    for i in range(len(prompts)):
        delta = got[f"p{i}-k0"]
        tokens = [t for o in delta for t in o.outputs[0].token_ids]
        text = "".join(o.outputs[0].text for o in delta)
        assert delta[-1].finished and not any(o.finished for o in delta[:-1])
        explicit = got[f"p{i}-k1"]  # DELTA spelled out: the default
        assert [(o.outputs[0].token_ids, o.outputs[0].text) for o in explicit] == [
            (o.outputs[0].token_ids, o.outputs[0].text) for o in delta
        ]
        cumulative = got[f"p{i}-k2"]
        assert len(cumulative) == len(delta)
        for n, o in enumerate(cumulative):  # each output repeats everything before it
            assert o.outputs[0].token_ids == [t for d in delta[: n + 1] for t in d.outputs[0].token_ids]
            assert o.outputs[0].text == "".join(d.outputs[0].text for d in delta[: n + 1])
        final = got[f"p{i}-k3"]
        assert len(final) == 1 and final[0].finished
        assert (final[0].outputs[0].token_ids, final[0].outputs[0].text) == (tokens, text)
        assert final[0].outputs[0].finish_reason == delta[-1].outputs[0].finish_reason
        assert final[0].metrics["output_len"] == len(tokens)


def test_final_only_abort_returns_everything_so_far(prompts):
    engine = LLMEngine(TEST_MODEL)
    engine.add_request("f", prompts[0], _params(RequestOutputKind.FINAL_ONLY))
    engine.add_request("d", prompts[0], _params(None))
    seen = []
    for _ in range(4):
        seen += engine.step()
    assert {o.request_id for o in seen} == {"d"}  # nothing for "f" while it runs
    engine.abort_request("f")
    (out,) = [o for o in engine.step() if o.request_id == "f"]
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert (
        out.outputs[0].token_ids == [t for o in seen for t in o.outputs[0].token_ids][: len(out.outputs[0].token_ids)]
    )
    assert len(out.outputs[0].token_ids) >= 4
    assert out.outputs[0].text == engine.tokenizer.decode(out.outputs[0].token_ids)  # decoded once, at the abort


def test_final_only_without_stop_strings_is_detokenized_once(prompts):
    """A FINAL_ONLY request without stop strings needs no text until it ends: its detokenizer is fed once, all its
    tokens at its final output; with stop strings, or DELTA outputs, it is fed every step. The text is the same."""
    feeds: dict[str, list[int]] = {}  # request id -> its number of output tokens at each feed

    class CountingDetokenizer(IncrementalDetokenizer):
        def update(self):
            n = len(self.request.output_token_ids)
            if not feeds.setdefault(self.request.request_id, []) or feeds[self.request.request_id][-1] != n:
                feeds[self.request.request_id].append(n)
            return super().update()

    engine = LLMEngine(TEST_MODEL, detokenizer_factory=CountingDetokenizer)
    never = ["\x00never"]  # a stop string the text does not hold: it only makes the request look for one
    cases = {"final": (RequestOutputKind.FINAL_ONLY, None), "final-stop": (RequestOutputKind.FINAL_ONLY, never)}
    cases["delta"] = (RequestOutputKind.DELTA, None)
    got = {}
    for rid, (kind, stop) in cases.items():
        engine.add_request(rid, prompts[1], _params(kind, stop=stop))
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.setdefault(out.request_id, []).append(out.outputs[0])
    every_step = list(range(1, MAX_TOKENS + 1))
    assert feeds == {"final": [MAX_TOKENS], "final-stop": every_step, "delta": every_step}
    texts = {rid: "".join(o.text for o in outs) for rid, outs in got.items()}
    assert texts["final"] == texts["final-stop"] == texts["delta"] == engine.tokenizer.decode(got["final"][0].token_ids)


def test_llm_generate_returns_whole_completions_whatever_the_kind(prompts):
    llm = LLM(model=TEST_MODEL)
    outs = [llm.generate(prompts, _params(kind)) for kind in KINDS]
    whole = [[(o.outputs[0].token_ids, o.outputs[0].text) for o in out] for out in outs]
    assert all(w == whole[0] for w in whole)
    assert all(len(t) == MAX_TOKENS for t, _ in whole[0])


@pytest.mark.parametrize("bad", ["delta", 1, True])
def test_output_kind_must_be_the_enum(bad):
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind=bad)
