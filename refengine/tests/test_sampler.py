"""The vectorised sampler (refengine/sample/sampler.py) on hand-made logits: greedy and random rows in one batch, top-k,
top-p, min_tokens masking, the counter-based seeded noise (a pure function of (seed, k, token id)), and that the
draws follow the softmax of the tempered logits."""

from __future__ import annotations

import torch

from refengine.sample.sampler import (
    SamplingMetadata,
    argmax_rows,
    sample,
    seeded_exponential,
    seeded_exponential_reference,
)

VOCAB = 64
# draws of one categorical over 4 tokens: the frequencies' standard error at 20k draws is below 0.004, so 0.02
# is five of them (a fixed generator seed keeps the test deterministic)
NUM_DRAWS = 20_000
FREQ_ATOL = 0.02
# Exp(1) has mean 1 and standard deviation 1: over 64 x 2000 values the mean's standard error is 0.0028
EXP_MEAN_ATOL = 0.015


def _logits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed))


def _random_md(n: int, temperature: float = 1.0, **kw) -> SamplingMetadata:
    return SamplingMetadata(all_greedy=False, temperature=torch.full((n,), temperature), **kw)


def test_seeded_noise_depends_on_seed_and_index_only():
    seeds = torch.tensor([7, 7, 8, 2**40 + 7])
    k = torch.tensor([0, 1, 0, 0])
    noise = seeded_exponential(seeds, k, VOCAB)
    assert noise.shape == (4, VOCAB) and bool((noise > 0).all())
    alone = seeded_exponential(seeds[1:2], k[1:2], VOCAB)
    assert torch.equal(alone[0], noise[1])  # the same whatever else is in the batch
    for a, b in ((0, 1), (0, 2), (0, 3)):  # another output index, another seed, another high word of the seed
        assert not torch.equal(noise[a], noise[b])


def test_seeded_noise_fast_path_equals_the_int64_definition():
    """The int32 path (wrapping products, masked shifts, the per-token part cached per vocabulary size) draws
    exactly the values of the overflow-free int64 definition, over a whole Qwen vocabulary and at the edges of
    the 32-bit halves of seeds and output indices."""
    seeds = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62 + 5, 2**63 - 1, 123456789012345])
    k = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 7, 2**33 + 3, 100_000, 5])
    for vocab in (151936, VOCAB, 1):
        assert torch.equal(seeded_exponential(seeds, k, vocab), seeded_exponential_reference(seeds, k, vocab))


def test_seeded_noise_is_exponential():
    noise = seeded_exponential(torch.arange(2000), torch.zeros(2000, dtype=torch.int64), VOCAB)
    assert abs(noise.mean().item() - 1.0) < EXP_MEAN_ATOL
    assert abs((noise > 1.0).float().mean().item() - torch.exp(torch.tensor(-1.0)).item()) < FREQ_ATOL


def test_all_greedy_and_mixed_batches_take_the_argmax_of_greedy_rows():
    logits = _logits(5)
    assert torch.equal(sample(logits.clone(), SamplingMetadata(all_greedy=True), None), logits.argmax(-1))
    md = _random_md(2, temperature=1.5)
    md.random_idx = torch.tensor([1, 3])
    got = sample(logits.clone(), md, torch.Generator().manual_seed(0))
    for i in (0, 2, 4):
        assert got[i] == logits[i].argmax()


def test_top_k_and_top_p_keep_only_their_tokens():
    logits = _logits(3, seed=1)
    gen = torch.Generator().manual_seed(1)
    top3 = logits.topk(3, dim=-1).indices
    for _ in range(50):
        md = _random_md(3, top_k=torch.tensor([3, 3, 1]), top_p=None)
        got = sample(logits.clone(), md, gen)
        assert got[0] in top3[0] and got[1] in top3[1] and got[2] == logits[2].argmax()
    # a nucleus smaller than the most likely token's own mass keeps that token alone
    md = _random_md(3, top_k=None, top_p=torch.full((3,), 1e-6))
    assert torch.equal(sample(logits.clone(), md, gen), logits.argmax(-1))


def test_min_tokens_masks_the_banned_ids():
    logits = _logits(2, seed=2)
    best = logits.argmax(-1)
    md = SamplingMetadata(all_greedy=True, banned_rows=torch.tensor([0]), banned_tokens=best[:1])
    got = sample(logits.clone(), md, None)
    assert got[0] != best[0] and got[0] == logits[0].topk(2).indices[1]
    assert got[1] == best[1]  # the other row is not masked


def test_draws_follow_the_tempered_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(NUM_DRAWS, 1)
    temperature = 0.7
    md = _random_md(NUM_DRAWS, temperature=temperature)
    got = sample(logits.clone(), md, torch.Generator().manual_seed(3))
    freq = torch.bincount(got, minlength=4).float() / NUM_DRAWS
    torch.testing.assert_close(freq, (logits[0] / temperature).softmax(-1), rtol=0, atol=FREQ_ATOL)
    # seeded rows: one seed per row, so the draws are independent, and follow the same law
    md.seeded_idx = torch.arange(NUM_DRAWS)
    md.seeds, md.output_index = torch.arange(NUM_DRAWS), torch.zeros(NUM_DRAWS, dtype=torch.int64)
    md.any_unseeded = False
    got = sample(logits.clone(), md, None)
    freq = torch.bincount(got, minlength=4).float() / NUM_DRAWS
    torch.testing.assert_close(freq, (logits[0] / temperature).softmax(-1), rtol=0, atol=FREQ_ATOL)


def test_argmax_rows_is_torch_argmax():
    """The two-pass argmax returns torch's index: the first maximum when it repeats within a block and across
    blocks, NaN as the maximum (the first NaN), all -inf rows, one block, and a vocab no block divides."""
    for vocab in (512, 64 * 3, 1000, 131):  # several 256-blocks; 64-blocks; 8 x 125; prime: torch's argmax
        x = torch.randn(8, vocab, generator=torch.Generator().manual_seed(vocab))
        x[1, [5, vocab // 2, vocab - 1]] = 10.0  # ties across blocks: the first wins
        x[2, [vocab - 2, vocab - 1]] = 10.0  # a tie inside the last block
        x[3, [7, vocab - 3]] = float("nan")
        x[4] = float("-inf")
        x[5, vocab - 1] = float("inf")
        assert torch.equal(argmax_rows(x), x.argmax(dim=-1)), vocab
    assert argmax_rows(torch.zeros(0, 512)).shape == (0,)
