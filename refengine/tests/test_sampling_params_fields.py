"""SamplingParams' fields and their checks: every new field's bad values, vLLM-only fields at other than their
defaults, values vLLM treats as the default, and unknown keywords: ValueError naming the field; positional use,
`dataclasses.replace` and `clone` keep working. (What the penalties and min_p do is test_penalties.py's.)
"""

from __future__ import annotations

import dataclasses

import pytest

from refengine import SamplingParams
from refengine.sampling_params import RequestOutputKind

BAD_VALUES = [
    ("presence_penalty", 2.5),
    ("presence_penalty", -2.01),
    ("presence_penalty", True),
    ("presence_penalty", "0.5"),
    ("frequency_penalty", 3.0),
    ("frequency_penalty", float("nan")),
    ("frequency_penalty", False),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", float("inf")),
    ("repetition_penalty", True),
    ("min_p", -0.1),
    ("min_p", 1.5),
    ("min_p", True),
    ("extra_args", [1]),
    ("skip_clone", 1),
]


@pytest.mark.parametrize("field, value", BAD_VALUES)
def test_bad_values_raise_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


# one non-default value per vLLM-only field (the set must match the class's, so a new field needs a case here)
NOT_DEFAULT = {
    "best_of": 2,
    "logprobs": 1,
    "prompt_logprobs": 0,
    "prompt_logprob_token_ids": [3],
    "prompt_logprob_start": 1,
    "logprob_token_ids": [3],
    "flat_logprobs": True,
    "detokenize": False,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "stream_interval": 2,
    "structured_outputs": {"regex": "a+"},
    "guided_decoding": {"regex": "a+"},
    "logit_bias": {3: 1.0},
    "allowed_token_ids": [3],
    "bad_words": ["x"],
    "logits_processors": [lambda ids, x: x],
    "truncate_prompt_tokens": 8,
    "thinking_token_budget": 16,
    "repetition_detection": {"min_count": 3},
    "skip_reading_prefix_cache": True,
    "routed_experts_prompt_start": 1,
    "trace_decode_token_ids": [1, 2],
}


@pytest.mark.vllm
def test_every_vllm_sampling_field_is_a_keyword_here():
    """Against the installed vLLM (its own environment, ci/setup_vllm_env.sh): every public SamplingParams field
    it has is one of ours, so no vLLM call meets a 'not a SamplingParams field'."""
    vllm_sp = pytest.importorskip("vllm.sampling_params", reason="vLLM is not installed (see ci/setup_vllm_env.sh)")
    internal = {"output_text_buffer_length"}  # set by vLLM's __post_init__, not an input
    cls = vllm_sp.SamplingParams  # a msgspec Struct in recent vLLM; a dataclass would list its fields the same way
    names = getattr(cls, "__struct_fields__", None) or [f.name for f in dataclasses.fields(cls)]
    theirs = {n for n in names if not n.startswith("_")} - internal
    ours = {f.name for f in dataclasses.fields(SamplingParams)}
    assert theirs <= ours, sorted(theirs - ours)


def test_every_vllm_only_field_has_a_case():
    unsupported = {f.name for f in dataclasses.fields(SamplingParams) if f.metadata.get("unsupported")}
    assert unsupported == set(NOT_DEFAULT)


@pytest.mark.parametrize("field", sorted(NOT_DEFAULT))
def test_vllm_only_fields_pass_at_their_default_and_refuse_any_other_value(field):
    default = next(f.default for f in dataclasses.fields(SamplingParams) if f.name == field)
    assert getattr(SamplingParams(**{field: default}), field) == default
    with pytest.raises(ValueError, match=f"{field} is not supported by refengine"):
        SamplingParams(**{field: NOT_DEFAULT[field]})


def test_values_vllm_treats_as_the_default_are_accepted():
    SamplingParams(
        best_of=1,
        bad_words=[],
        logit_bias={},
        thinking_token_budget=-1,
        extra_args={"plugin": 1},
        skip_clone=True,
        output_kind=RequestOutputKind.CUMULATIVE,
    )


@pytest.mark.parametrize("kw", [{"no_such_field": 1}, {"presence_penalties": 0.5}, {"use_beam_search": True}])
def test_unknown_keyword_is_a_value_error_naming_it(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        SamplingParams(**kw)


def test_positional_use_replace_and_penalty_defaults_are_unchanged():
    sp = SamplingParams(8, 2, 0.5, 0.9, 5, 7, "x", [3], True, True)
    assert (
        sp.max_tokens,
        sp.min_tokens,
        sp.temperature,
        sp.top_p,
        sp.top_k,
        sp.seed,
        sp.stop,
        sp.stop_token_ids,
        sp.ignore_eos,
        sp.include_stop_str_in_output,
    ) == (8, 2, 0.5, 0.9, 5, 7, ["x"], [3], True, True)
    assert (sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty, sp.min_p) == (0.0, 0.0, 1.0, 0.0)
    assert not sp.has_penalties
    copy = dataclasses.replace(sp, repetition_penalty=1.5)
    assert copy.has_penalties and copy.max_tokens == 8 and copy.stop == ["x"]
    with pytest.raises(ValueError, match="repetition_penalty"):
        dataclasses.replace(sp, repetition_penalty=0)
    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=-2).seed == -2  # vLLM: -1 is "no seed"
    clone = copy.clone()  # vLLM's deep copy
    assert clone == copy and clone.stop is not copy.stop
