"""The model runner alone, driven by hand-built SchedulerOutputs (no scheduler, no KV manager, no Request): new
requests, decode steps, chunked prefill, recompute preemption and resume, swap out and in, a finished request's
row reused, the ModelRunnerOutput shape, one device -> host transfer per step, and padded decode batches. Its
greedy tokens must equal the whole engine's on the same prompts."""

from __future__ import annotations

import pytest
import torch

from conformance.engine_helpers import greedy, make_prompts, run_llm
from refengine.engine import _load_model_cached
from refengine.model_runner import ModelRunner
from refengine.scheduler_output import NewRequestData, SchedulerOutput

BLOCK = 4
PROMPTS = make_prompts((9, 3, 14), seed=21)
MAX_TOKENS = (8, 8, 8)
# float32 K/V of 8 padded rows vs 3 unpadded may round differently in the projections' matmul (a few ulps); a
# padded token written to the cache would replace a real K/V vector, an O(1) change
PAD_KV_ATOL = 1e-4


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """The engine's greedy tokens for PROMPTS (each run alone would give the same: batching changes nothing)."""
    tokens, _ = run_llm(PROMPTS, MAX_TOKENS, block_size=BLOCK, num_gpu_blocks=256)
    return tokens


def make_runner(num_cpu_blocks: int = 16, max_num_seqs: int = 4) -> ModelRunner:
    model, cfg = _load_model_cached("tiny-qwen2", torch.device("cpu"), torch.float32, 0, "torch")
    return ModelRunner(
        model,
        cfg,
        num_gpu_blocks=64,
        num_cpu_blocks=num_cpu_blocks,
        block_size=BLOCK,
        max_num_seqs=max_num_seqs,
        max_model_len=128,
        device=torch.device("cpu"),
        dtype=torch.float32,
        seed=0,
    )


class HandScheduler:
    """Plays the scheduler's part by hand: block ids from a free list (handed out from the top, so that block
    tables are not the identity; block 0 first, the block a padding row would wrongly write), and the
    per-request counts the contract carries."""

    def __init__(self) -> None:
        self.free = list(range(1, 64)) + [0]
        self.blocks: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.tokens: dict[str, list[int]] = {}

    def _grow(self, rid: str, total: int) -> list[int]:
        have = self.blocks.setdefault(rid, [])
        new = [self.free.pop() for _ in range(-(-total // BLOCK) - len(have))]
        have += new
        return new

    def new(self, out: SchedulerOutput, rid: str, prompt: list[int], n: int, max_tokens: int = 8) -> None:
        self.tokens[rid], self.computed[rid] = list(prompt), 0
        self._grow(rid, n)
        out.scheduled_new_reqs.append(NewRequestData(rid, list(prompt), greedy(max_tokens), list(self.blocks[rid]), 0))
        self._schedule(out, rid, n)

    def cached(self, out: SchedulerOutput, rid: str, n: int, resumed: bool = False) -> None:
        c = out.scheduled_cached_reqs
        new = self._grow(rid, self.computed[rid] + n)
        c.req_ids.append(rid)
        if resumed:
            c.resumed_req_ids.add(rid)
            c.all_token_ids[rid] = list(self.tokens[rid])
            new = list(self.blocks[rid])
        c.new_block_ids.append(new or None)
        c.num_computed_tokens.append(self.computed[rid])
        self._schedule(out, rid, n)

    def _schedule(self, out: SchedulerOutput, rid: str, n: int) -> None:
        out.num_scheduled_tokens[rid] = n
        out.total_num_scheduled_tokens += n
        self.computed[rid] += n

    def drop(self, rid: str) -> list[int]:
        """Free a request's device blocks (preempted or finished); returns them."""
        blocks = self.blocks.pop(rid)
        self.free += reversed(blocks)
        self.computed[rid] = 0
        return blocks

    def step(self, runner: ModelRunner, out: SchedulerOutput) -> dict[str, list[int]]:
        res = runner.execute_model(out)
        assert res.req_ids == list(out.num_scheduled_tokens)
        assert res.req_id_to_index == {r: i for i, r in enumerate(res.req_ids)}
        for rid, toks in zip(res.req_ids, res.sampled_token_ids):
            self.tokens[rid] += toks
        return dict(zip(res.req_ids, res.sampled_token_ids))


def decode_until(hs: HandScheduler, runner: ModelRunner, rids: list[str], n_out: int) -> None:
    while any(len(hs.tokens[r]) - len(p) < n_out for r, p in rids):
        out = SchedulerOutput()
        for r, p in rids:
            if len(hs.tokens[r]) - len(p) < n_out:
                hs.cached(out, r, 1)
        hs.step(runner, out)


def test_new_request_and_decode_steps(reference):
    runner, hs = make_runner(), HandScheduler()
    out = SchedulerOutput()
    hs.new(out, "a", PROMPTS[0], len(PROMPTS[0]))
    hs.new(out, "b", PROMPTS[1], len(PROMPTS[1]))
    assert {k: len(v) for k, v in hs.step(runner, out).items()} == {"a": 1, "b": 1}
    decode_until(hs, runner, [("a", PROMPTS[0]), ("b", PROMPTS[1])], 8)
    assert hs.tokens["a"][len(PROMPTS[0]) :] == reference[0]
    assert hs.tokens["b"][len(PROMPTS[1]) :] == reference[1]


def test_chunked_prefill_samples_only_at_the_last_chunk(reference):
    runner, hs = make_runner(), HandScheduler()
    prompt = PROMPTS[2]  # 14 tokens: chunks of 5, 5, 4
    out = SchedulerOutput()
    hs.new(out, "c", prompt, 5)
    assert hs.step(runner, out) == {"c": []}  # a partial prefill samples nothing
    out = SchedulerOutput()
    hs.cached(out, "c", 5)
    assert hs.step(runner, out) == {"c": []}
    out = SchedulerOutput()
    hs.cached(out, "c", 4)
    assert len(hs.step(runner, out)["c"]) == 1
    decode_until(hs, runner, [("c", prompt)], 8)
    assert hs.tokens["c"][len(prompt) :] == reference[2]


def test_recompute_preemption_and_resume(reference):
    runner, hs = make_runner(), HandScheduler()
    out = SchedulerOutput()
    hs.new(out, "a", PROMPTS[0], len(PROMPTS[0]))
    hs.step(runner, out)
    decode_until(hs, runner, [("a", PROMPTS[0])], 3)
    hs.drop("a")
    hs.free.reverse()  # so that the resumed request gets other block ids than before
    hs.step(runner, SchedulerOutput(preempted_req_ids=["a"]))
    assert "a" not in runner.input_batch  # a preempted request gives up its row ...
    out = SchedulerOutput()
    hs.cached(out, "a", len(hs.tokens["a"]), resumed=True)  # ... and is re-prefilled whole, prompt + 3 outputs
    assert len(hs.step(runner, out)["a"]) == 1
    decode_until(hs, runner, [("a", PROMPTS[0])], 8)
    assert hs.tokens["a"][len(PROMPTS[0]) :] == reference[0]


def test_swap_out_and_in(reference):
    runner, hs = make_runner(), HandScheduler()
    out = SchedulerOutput()
    hs.new(out, "a", PROMPTS[2], len(PROMPTS[2]))
    hs.step(runner, out)
    decode_until(hs, runner, [("a", PROMPTS[2])], 4)
    computed = hs.computed["a"]
    device = hs.drop("a")
    host = list(range(len(device)))
    hs.step(runner, SchedulerOutput(preempted_req_ids=["a"], blocks_to_swap_out=list(zip(device, host))))
    # someone else overwrites the freed device blocks meanwhile
    for k, v in runner.kv_caches:
        k[device] = 7.0
        v[device] = -7.0
    hs.free.reverse()
    hs.computed["a"] = computed
    out = SchedulerOutput()
    hs.cached(out, "a", 1, resumed=True)  # decodes on from the swapped-in KV: no re-prefill
    out.blocks_to_swap_in = list(zip(host, hs.blocks["a"]))
    assert set(hs.blocks["a"]).isdisjoint(device)
    assert len(hs.step(runner, out)["a"]) == 1
    decode_until(hs, runner, [("a", PROMPTS[2])], 8)
    assert hs.tokens["a"][len(PROMPTS[2]) :] == reference[2]


def test_finished_request_frees_its_row_for_the_next(reference):
    runner, hs = make_runner(max_num_seqs=1), HandScheduler()
    out = SchedulerOutput()
    hs.new(out, "a", PROMPTS[1], len(PROMPTS[1]))
    hs.step(runner, out)
    decode_until(hs, runner, [("a", PROMPTS[1])], 8)
    hs.drop("a")
    out = SchedulerOutput(finished_req_ids={"a"})
    hs.new(out, "b", PROMPTS[0], len(PROMPTS[0]))  # the only row, freed by "a"
    hs.step(runner, out)
    decode_until(hs, runner, [("b", PROMPTS[0])], 8)
    assert hs.tokens["b"][len(PROMPTS[0]) :] == reference[0]
    assert "a" not in runner.requests and runner.input_batch.row_of == {"b": 0}


def count_host_reads(monkeypatch) -> list[str]:
    """From now on, every read of a tensor's value on the host (tolist, item, cpu, numpy, bool/int/float/index) is
    appended to the returned list: on a GPU each would be a sync."""
    calls: list[str] = []
    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **kw):
            calls.append(_name)
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


def test_one_device_to_host_transfer_per_step(monkeypatch):
    """Every host read of a tensor is counted while execute_model runs. Only the sampled ids may cross."""
    runner, hs = make_runner(), HandScheduler()
    calls = count_host_reads(monkeypatch)
    out = SchedulerOutput()
    hs.new(out, "a", PROMPTS[0], len(PROMPTS[0]))
    hs.new(out, "b", PROMPTS[2], 6)  # a partial prefill beside a full one: a mixed step
    hs.step(runner, out)
    assert calls == ["tolist"], calls
    calls.clear()
    out = SchedulerOutput()
    hs.cached(out, "a", 1)
    hs.cached(out, "b", len(PROMPTS[2]) - 6)
    hs.step(runner, out)
    assert calls == ["tolist"], calls
    calls.clear()
    out = SchedulerOutput()
    hs.cached(out, "a", 1)
    hs.cached(out, "b", 1)
    hs.step(runner, out)  # decode-only
    assert calls == ["tolist"], calls
    assert runner.num_host_syncs == 3


def test_decode_batches_padded_as_for_cuda_graphs_give_the_same_tokens(reference):
    """The padding a CUDA graph replay needs (refengine.cuda_graphs.pad_decode_inputs), run eagerly on the CPU:
    3 decodes padded to 8 sequences must not change the real rows' tokens, nor write anything to the KV cache
    that an unpadded runner does not (a padded token that wrote would hit block 0, which "a" holds)."""
    padded, plain = make_runner(), make_runner()
    padded.decode_pad_sizes = [8]
    hs_padded, hs_plain = HandScheduler(), HandScheduler()
    for runner, hs in ((padded, hs_padded), (plain, hs_plain)):
        out = SchedulerOutput()
        for rid, p in zip("abc", PROMPTS):
            hs.new(out, rid, p, len(p))
        hs.step(runner, out)
        decode_until(hs, runner, [("a", PROMPTS[0]), ("b", PROMPTS[1]), ("c", PROMPTS[2])], 8)
    for rid, p, ref in zip("abc", PROMPTS, reference):
        assert hs_padded.tokens[rid][len(p) :] == ref
    for (k1, v1), (k2, v2) in zip(padded.kv_caches, plain.kv_caches):
        torch.testing.assert_close(k1, k2, rtol=0, atol=PAD_KV_ATOL)
        torch.testing.assert_close(v1, v2, rtol=0, atol=PAD_KV_ATOL)


class _EagerReplay:
    """Stands in for a captured torch.cuda.CUDAGraph on the CPU: replay() runs the model on the graph runner's
    static buffers into a fixed output, as a real replay would."""

    def __init__(self, graphs, size: int, hidden_size: int) -> None:
        self.graphs, self.size = graphs, size
        self.hidden = torch.zeros(size, hidden_size)

    def replay(self) -> None:
        g, n = self.graphs, self.size
        self.hidden.copy_(g.model(g.input_ids[:n], g.positions[:n], g.kv_caches, g._meta(n)))


def test_graph_runner_static_buffers_on_the_cpu(reference):
    """The replay path of CudaGraphRunner (padding, the copies into its static buffers, the returned static
    output) with each captured graph replaced by an eager replay on those buffers: the same tokens."""
    from refengine.cuda_graphs import CudaGraphRunner

    runner, hs = make_runner(), HandScheduler()
    graphs = CudaGraphRunner(
        runner.model, runner.kv_caches, 4, runner.input_batch.block_table.shape[1], torch.device("cpu")
    )
    hidden_size = runner.model.config.hidden_size
    for size in graphs.sizes:
        replay = _EagerReplay(graphs, size, hidden_size)
        graphs.graphs[size] = (replay, replay.hidden)
    runner.cuda_graphs = graphs
    out = SchedulerOutput()
    for rid, p in zip("abc", PROMPTS):
        hs.new(out, rid, p, len(p))
    hs.step(runner, out)  # a prefill step: eager
    assert graphs.num_replays == 0
    decode_until(hs, runner, [("a", PROMPTS[0]), ("b", PROMPTS[1]), ("c", PROMPTS[2])], 8)
    assert graphs.num_replays == 7  # every decode step, 3 sequences padded to 4
    for rid, p, ref in zip("abc", PROMPTS, reference):
        assert hs.tokens[rid][len(p) :] == ref


def test_staging_buffer_packs_aligned_views_and_grows():
    import numpy as np

    from refengine.input_batch import StagingBuffer

    buf = StagingBuffer(torch.device("cpu"), size=8)
    arrays = [np.arange(3), np.array([7]), np.arange(10, 15), np.array([], dtype=np.int64), np.array([-1, -2])]
    views = buf.pack(*arrays)  # 3 + 1 + 5 + 0 + 2 elements, more than 8: the buffer grows
    assert [v.tolist() for v in views] == [a.tolist() for a in arrays]
    assert all(v.data_ptr() % 16 == 0 for v in views)  # Triton specializes pointers on 16-byte alignment
    again = buf.pack(np.array([4, 5]))
    assert again[0].tolist() == [4, 5]
    # int32 arrays (the attention metadata) cross as int32, odd lengths included, and stay aligned
    mixed = [
        np.array([1, 2, 3], dtype=np.int32),
        np.arange(4),
        np.array([2**31 - 1], dtype=np.int32),
        np.arange(6, dtype=np.int32).reshape(2, 3).ravel(),
    ]
    views = buf.pack(*mixed)
    assert [v.dtype for v in views] == [torch.int32, torch.int64, torch.int32, torch.int32]
    assert [v.tolist() for v in views] == [a.tolist() for a in mixed]
    assert all(v.data_ptr() % 16 == 0 for v in views)
