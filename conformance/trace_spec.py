"""What a scheduler trace is and how one is drawn: the requests, aborts and scheduler configuration of a trace
(`Trace`, `Req`, JSON both ways), the seeded fake sampler every engine shares (`sample`), and the Hypothesis strategy
the vLLM differential and the recorder draw traces from (`traces`).

A trace is a scheduler configuration (budget, max_num_seqs, block size and count, chunked prefill, long-prefill
threshold, prefix caching, fcfs/priority, sync or async scheduling) plus requests (prompt from a few shared prefixes
and a random tail, max_tokens, min_tokens, priority, arrival step and time) and a few aborts. The fake sampler gives
every engine the same token for the same (request, output position), EOS at random once min_tokens are out.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from hypothesis import strategies as st

EOS = 0
VOCAB = range(1, 50)
MAX_MODEL_LEN = 4096  # far above any trace's length: no engine may stop a request on it
PREFIXES = [[random.Random(p).randrange(1000, 2000) for _ in range(48)] for p in range(3)]
MAX_STEPS = 400


@dataclass
class Req:
    rid: str
    arrive: int  # step before whose schedule() it is added
    prompt: list[int]
    max_tokens: int
    min_tokens: int = 0
    priority: int = 0
    arrival_time: float = 0.0


@dataclass
class Trace:
    knobs: dict
    reqs: list[Req]
    aborts: list[tuple[int, str]] = field(default_factory=list)  # (step, request id)
    seed: int = 0
    eos_prob: float = 0.0

    def __repr__(self) -> str:  # short enough to read in a failure report
        lines = [f"knobs={self.knobs}", f"seed={self.seed} eos_prob={self.eos_prob} aborts={self.aborts}"]
        for r in self.reqs:
            lines.append(
                f"  {r.rid}: arrive@{r.arrive} t={r.arrival_time} prompt_len={len(r.prompt)} "
                f"max_tokens={r.max_tokens} min_tokens={r.min_tokens} prio={r.priority} "
                f"prompt={r.prompt}"
            )
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "knobs": self.knobs,
            "reqs": [asdict(r) for r in self.reqs],
            "aborts": self.aborts,
            "seed": self.seed,
            "eos_prob": self.eos_prob,
        }

    @classmethod
    def from_json(cls, d: dict) -> Trace:
        return cls(
            dict(d["knobs"]),
            [Req(**r) for r in d["reqs"]],
            [(int(s), rid) for s, rid in d["aborts"]],
            d["seed"],
            d["eos_prob"],
        )


def sample(trace: Trace, rid: str, n: int, min_tokens: int) -> int:
    """The token a request samples as its output #n+1: a pure function of (seed, request, position), so every engine
    gets the same one whatever order it schedules in. EOS is masked until min_tokens, as the sampler does."""
    rng = random.Random(f"{trace.seed}:{rid}:{n}")
    if n + 1 > min_tokens and rng.random() < trace.eos_prob:
        return EOS
    return rng.choice(VOCAB)


# ---- drawing traces ---------------------------------------------------------------------------------------------


@st.composite
def traces(draw, policy: str, prefix_caching: bool, chunked: bool, async_scheduling: bool = False) -> Trace:
    block_size = draw(st.sampled_from([2, 4, 8]), label="block_size")
    num_gpu_blocks = draw(st.integers(3, 24), label="num_gpu_blocks")
    max_num_seqs = draw(st.integers(1, 6), label="max_num_seqs")
    budget = draw(st.integers(max(max_num_seqs, 4), 48), label="max_num_batched_tokens")  # vLLM: budget >= seqs
    thr = draw(st.one_of(st.just(0), st.integers(1, 12)), label="long_prefill_token_threshold")
    knobs = dict(
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=thr,
        enable_prefix_caching=prefix_caching,
        policy=policy,
        max_model_len=MAX_MODEL_LEN,
        async_scheduling=async_scheduling,
    )
    seed = draw(st.integers(0, 2**16), label="seed")
    rng = random.Random(seed)
    kv_cap = num_gpu_blocks * block_size
    n = draw(st.integers(1, 8), label="num_requests")
    # Ids drawn from r0..r12, so that string order ("r10" < "r2") differs from arrival order: ties fall to the id.
    ids = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n, unique=True), label="ids")
    reqs = []
    for i in ids:
        pfx = draw(st.integers(0, len(PREFIXES) - 1))
        pfx_len = draw(st.integers(0, 24))
        tail = draw(st.integers(0, 10))
        prompt = PREFIXES[pfx][:pfx_len] + [rng.randrange(2000, 3000) for _ in range(tail)]
        prompt = prompt or [rng.randrange(2000, 3000)]
        max_tokens = draw(st.integers(1, 12))
        # Only requests that fit alone, as an engine's API would insist: prompt + max_tokens - 1 tokens of KV fit the
        # device; without chunked prefill the whole sequence (a recompute re-prefills prompt + outputs) fits a step.
        prompt = prompt[: kv_cap if chunked else min(kv_cap, budget - 1)]
        max_tokens = min(max_tokens, kv_cap - len(prompt) + 1)
        if not chunked:
            max_tokens = min(max_tokens, budget - len(prompt))
        max_tokens = max(1, max_tokens)
        min_tokens = min(draw(st.integers(0, 2)), max_tokens)
        priority = draw(st.integers(0, 2)) if policy == "priority" else 0
        arrive = draw(st.integers(0, 8))
        reqs.append(Req(f"r{i}", arrive, prompt, max_tokens, min_tokens, priority))
    # Arrival times non-decreasing in arrival-step order, often exactly equal to the previous one's: equal
    # (priority, arrival_time) keys are then ordered by request id in both engines.
    t = 0.0
    for r in sorted(reqs, key=lambda r: r.arrive):
        if not draw(st.booleans(), label="tie"):
            t += 1.0
        r.arrival_time = t
    aborts = []
    for _ in range(draw(st.integers(0, 2), label="num_aborts")):
        aborts.append((draw(st.integers(0, 20)), reqs[draw(st.integers(0, n - 1))].rid))
    eos_prob = draw(st.sampled_from([0.0, 0.1, 0.3]), label="eos_prob")
    return Trace(knobs, reqs, aborts, seed, eos_prob)
