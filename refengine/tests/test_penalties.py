"""Presence / frequency / repetition penalties and min_p: the sampler against a per-row reference, and end to end.

* the sampler's penalised logits, greedy tokens and seeded draws equal a plain per-row torch reference of vLLM's
  apply_penalties (Hypothesis: small vocabularies, token histories grown over several steps, rows re-admitted),
  through the same incremental device tables the runner keeps (refengine/sample/penalties.py);
* min_p keeps exactly the tokens whose probability reaches min_p times the top one's;
* end to end on tiny-qwen2: penalised greedy (and seeded) requests give the same tokens alone and in a crowd,
  sync and async, across recompute and swap preemption, chunked prefill and prefix-cache hits; and a strong
  frequency penalty stops the repetition that the penalty-free run shows.
The fields' own checks (bad values, vLLM-only fields, unknown keywords) are test_sampling_params_fields.py's.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.engine_helpers import TEST_MODEL, _hf_for, greedy, make_prompts
from conformance.hypothesis_profiles import scaled
from refengine import LLM, SamplingParams
from refengine.sample.penalties import PenaltyTables
from refengine.sample.sampler import SamplingMetadata, sample

# ---- the oracle ---------------------------------------------------------------------------------------------


def reference_penalties(
    logits: torch.Tensor, prompt: list[int], output: list[int], presence: float, frequency: float, repetition: float
) -> torch.Tensor:
    """vLLM's formulas for one row, token by token, in float32 (the engine's dtype for logits and parameters).
    A token in neither prompt nor output keeps its logit (x - 0 * penalty = x), so only the seen ones are visited."""
    out = logits.clone()
    counts = collections.Counter(output)
    pp, fp, rp = (torch.tensor(x, dtype=torch.float32) for x in (presence, frequency, repetition))
    for t in sorted(set(prompt) | set(output)):
        x = out[t]
        if t in prompt or counts[t]:
            x = x / rp if x > 0 else x * rp
        x = x - fp * counts[t]
        x = x - pp * (1.0 if counts[t] else 0.0)
        out[t] = x
    return out


_penalty = st.one_of(st.just(0.0), st.floats(-2.0, 2.0, width=32))
_repetition = st.one_of(st.just(1.0), st.floats(0.0625, 4.0, width=32))


@settings(max_examples=scaled(60), deadline=None)
@given(data=st.data())
def test_penalised_logits_and_tokens_equal_the_per_row_reference(data):
    vocab = data.draw(st.integers(2, 20), label="vocab")
    n = data.draw(st.integers(1, 4), label="rows")
    tok = st.integers(0, vocab - 1)
    params = [
        SamplingParams(
            presence_penalty=data.draw(_penalty),
            frequency_penalty=data.draw(_penalty),
            repetition_penalty=data.draw(_repetition),
        )
        for _ in range(n)
    ]
    tables = PenaltyTables(n, vocab, torch.device("cpu"))
    token_ids = np.zeros((n, 64), dtype=np.int32)
    history = [data.draw(st.lists(tok, min_size=1, max_size=8), label=f"prompt {r}") for r in range(n)]
    num_prompt = np.array([len(h) for h in history], dtype=np.int64)
    for r in range(n):
        token_ids[r, : len(history[r])] = history[r]
        tables.set_row(r, params[r])
    for step in range(data.draw(st.integers(1, 4), label="steps")):
        for r in range(n):
            new = data.draw(st.lists(tok, max_size=3), label=f"step {step} row {r} new tokens")
            token_ids[r, len(history[r]) : len(history[r]) + len(new)] = new
            history[r] += new
            if data.draw(st.booleans(), label="re-admitted (resumed after preemption)"):
                tables.set_row(r, params[r])
        rows = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1), label="sampling rows")))
        num_tokens = np.array([len(h) for h in history], dtype=np.int64)
        logits = torch.tensor(
            data.draw(
                st.lists(st.floats(-20.0, 20.0, width=32), min_size=len(rows) * vocab, max_size=len(rows) * vocab)
            ),
            dtype=torch.float32,
        )
        logits = logits.view(len(rows), vocab)
        expect = torch.stack(
            [
                reference_penalties(
                    logits[i], history[r][: num_prompt[r]], history[r][num_prompt[r] :], *_pfr(params[r])
                )
                for i, r in enumerate(rows.tolist())
            ]
        )
        md = SamplingMetadata(all_greedy=True)
        step_state = tables.step_arrays(rows, token_ids, num_tokens, num_prompt)
        if step_state is not None:
            views = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)) for a in step_state.arrays]
            for name, value in tables.update_and_gather(step_state, views).items():
                setattr(md, name, value)
        got = logits.clone()
        tokens = sample(got, md, None)  # penalises `got` in place, then the argmax
        assert torch.equal(got, expect)
        assert torch.equal(tokens, expect.argmax(dim=-1))
        # random rows with seeds: the penalties come before temperature, as for the reference logits
        seeded = dataclasses.replace(
            md,
            all_greedy=False,
            temperature=torch.full((len(rows),), 0.7),
            seeded_idx=torch.arange(len(rows)),
            seeds=torch.tensor(rows * 31 + step),
            output_index=torch.zeros(len(rows), dtype=torch.int64),
            any_unseeded=False,
        )
        unpenalised = dataclasses.replace(seeded, penalty_idx=None)
        assert torch.equal(sample(logits.clone(), seeded, None), sample(expect.clone(), unpenalised, None))


def _pfr(sp: SamplingParams) -> tuple[float, float, float]:
    return sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty


def test_min_p_keeps_exactly_the_tokens_above_its_share_of_the_top():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08], [0.4, 0.35, 0.2, 0.05]]))
    md = SamplingMetadata(all_greedy=False, temperature=torch.ones(2), min_p=torch.tensor([0.5, 0.3]))
    gen = torch.Generator().manual_seed(0)
    seen = [set(), set()]
    for _ in range(300):
        for row, t in enumerate(sample(logits.clone(), md, gen).tolist()):
            seen[row].add(t)
    # row 0 keeps p >= 0.25 (tokens 0, 1), row 1 keeps p >= 0.12 (tokens 0, 1, 2): 300 draws see each of them
    assert seen == [{0, 1}, {0, 1, 2}]


# ---- end to end on the tiny model -----------------------------------------------------------------------------

BLOCK = 4
LENS = (5, 17, 40, 9, 30)
SHARED = make_prompts((24,), seed=5)[0]  # a prefix two prompts share: prefix-cache hits
TIGHT_BLOCKS = 20  # fits the longest request alone (13 blocks), not the seven together (~65): preemption
PENALTIES = [
    dict(repetition_penalty=1.3),
    dict(frequency_penalty=0.7),
    dict(presence_penalty=0.5, repetition_penalty=0.8),
    {},
    dict(frequency_penalty=-0.4, presence_penalty=1.1),
    dict(repetition_penalty=1.6),
    {},
]


@pytest.fixture(scope="module")
def crowd() -> tuple[list[list[int]], list[SamplingParams]]:
    ps = make_prompts(LENS, seed=11)
    prompts = ps + [SHARED + p[:6] for p in ps[:2]]
    params = [greedy(12, **kw) for kw in PENALTIES]
    params[3] = SamplingParams(max_tokens=12, temperature=0.8, seed=5, repetition_penalty=1.2)  # seeded: comparable
    return prompts, params


@pytest.fixture(scope="module")
def alone(crowd) -> list[list[int]]:
    llm = LLM(TEST_MODEL, block_size=BLOCK, num_gpu_blocks=256)
    return [llm.generate([p], sp)[0].outputs[0].token_ids for p, sp in zip(*crowd)]


def test_penalised_greedy_tokens_equal_a_plain_reference_loop(crowd, alone):
    """Independent of the engine: Hugging Face's generate on the same weights with the per-row reference penalties
    as its logits processor. (Sync vs async vs alone agreeing could hide a penalty that is consistently wrong,
    e.g. one token behind; this cannot.)"""
    hf_model, cfg = _hf_for(TEST_MODEL)
    eos = list(cfg.eos_token_ids)
    for prompt, sp, got in zip(*crowd, alone):
        if not sp.greedy or not sp.has_penalties:
            continue

        def penalise(input_ids: torch.Tensor, scores: torch.Tensor, sp=sp, n=len(prompt)) -> torch.Tensor:  # noqa: B008 -- binds this loop's prompt length
            ids = input_ids[0].tolist()
            return reference_penalties(scores[0].float(), ids[:n], ids[n:], *_pfr(sp))[None]

        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=sp.max_tokens,
                do_sample=False,
                logits_processor=[penalise],
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
        assert got == out[0, len(prompt) :].tolist(), sp


@pytest.mark.parametrize(
    "knobs",
    [
        dict(num_gpu_blocks=TIGHT_BLOCKS, max_num_batched_tokens=32),
        dict(num_gpu_blocks=TIGHT_BLOCKS, max_num_batched_tokens=32, async_scheduling=True),
        dict(
            num_gpu_blocks=TIGHT_BLOCKS,
            num_cpu_blocks=64,
            preemption_mode="swap",
            max_num_batched_tokens=32,
            async_scheduling=True,
        ),
    ],
    ids=["recompute-sync", "recompute-async", "swap-async"],
)
def test_penalised_requests_give_the_same_tokens_alone_and_in_a_crowd(crowd, alone, knobs):
    llm = LLM(TEST_MODEL, block_size=BLOCK, **knobs)
    outs = llm.generate(*crowd)
    assert [o.outputs[0].token_ids for o in outs] == alone
    sched = llm.llm_engine.scheduler
    assert sched.num_preemptions > 0, "the KV pool was meant to force preemptions"
    assert any(r.num_cached_tokens > 0 for r in llm.llm_engine.finished_requests), "meant to hit the prefix cache"


def test_a_strong_frequency_penalty_stops_the_repetition(crowd):
    prompts = crowd[0][:3]
    llm = LLM(TEST_MODEL, block_size=BLOCK, num_gpu_blocks=256)
    free = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(16))]
    # (the random-weight model loops on one token: the premise that gives the check its teeth)
    assert all(len(set(ids)) < len(ids) for ids in free), free
    penalised = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(16, frequency_penalty=2.0))]
    assert all(len(set(ids)) == len(ids) for ids in penalised), penalised
    repetition = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(16, repetition_penalty=1.3))]
    assert repetition != free


def test_penalised_steps_still_make_one_device_to_host_transfer(monkeypatch):
    """The runner with penalised rows (greedy and random, a mixed step with a partial prefill, then decodes): every
    host read of a tensor is counted while execute_model runs, and only the sampled ids may cross."""
    from refengine.tests._hand_runner import PROMPTS, HandScheduler, blank_output, count_host_reads, make_runner

    runner, hs = make_runner(), HandScheduler()
    calls = count_host_reads(monkeypatch)
    out = blank_output()
    hs.new(out, "a", PROMPTS[0], len(PROMPTS[0]))
    hs.new(out, "b", PROMPTS[2], 6)  # a partial prefill beside a full one
    out.scheduled_new_reqs[0].sampling_params = greedy(8, repetition_penalty=1.3, frequency_penalty=0.5)
    out.scheduled_new_reqs[1].sampling_params = SamplingParams(max_tokens=8, seed=3, presence_penalty=0.7)
    hs.step(runner, out)
    for chunk in (len(PROMPTS[2]) - 6, 1, 1):
        out = blank_output()
        hs.cached(out, "a", 1)
        hs.cached(out, "b", chunk)
        hs.step(runner, out)
    assert calls == ["tolist"] * 4, calls
    assert runner.input_batch.penalties.capacity > 0  # the penalty path did run
