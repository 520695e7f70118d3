"""Differential properties on the real tiny model: for drawn prompts and engine knobs, greedy tokens are the same
whatever the batching mode, preemption mode, prefix caching, block size or budget, and equal Hugging Face generate's."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.engine_helpers import TEST_MODEL, TOKEN_ID_RANGE, greedy, hf_greedy
from conformance.progress import guarded_generate
from refengine import LLM

# Each example runs the engine and HF on a few short prompts (~1-3 s); the ci profile's example count would make
# this file alone take minutes, so it sets its own, larger under the thorough profile.
_EXAMPLES = 40 if os.environ.get("CBBENCH_HYPOTHESIS_PROFILE") == "thorough" else 6


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 4))
    shared = draw(st.lists(st.integers(*TOKEN_ID_RANGE), min_size=0, max_size=20))  # a shared prefix, maybe empty
    prompts = [shared + draw(st.lists(st.integers(*TOKEN_ID_RANGE), min_size=1, max_size=40)) for _ in range(n)]
    max_tokens = [draw(st.integers(1, 12)) for _ in range(n)]
    return prompts, max_tokens


@st.composite
def knobs(draw, prompts, max_tokens):
    block_size = draw(st.sampled_from([1, 4, 16, 5]))
    longest = max(len(p) + m - 1 for p, m in zip(prompts, max_tokens))
    need = -(-longest // block_size)
    return dict(
        batching=draw(st.sampled_from(["continuous", "sequence", "static", "none"])),
        block_size=block_size,
        # from "just the longest request" (forces preemption in continuous mode) to plenty
        num_gpu_blocks=draw(st.integers(need, need * len(prompts) + 4)),
        num_cpu_blocks=draw(st.integers(0, 64)),
        max_num_batched_tokens=draw(st.integers(8, 96)),
        max_num_seqs=draw(st.integers(1, 4)),
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
        enable_prefix_caching=draw(st.booleans()),
    )


@settings(
    max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_greedy_tokens_equal_hf_under_any_knobs(data):
    prompts, max_tokens = data.draw(workloads())
    kn = data.draw(knobs(prompts, max_tokens))
    llm = LLM(TEST_MODEL, **kn)
    outs = guarded_generate(llm, prompts, [greedy(m) for m in max_tokens])
    ours = [o.outputs[0].token_ids for o in outs]
    assert ours == hf_greedy(prompts, max_tokens), f"knobs={kn}"
    sched = llm.llm_engine.scheduler
    sched.check_invariants()
    assert sched.num_free_blocks == kn["num_gpu_blocks"]
