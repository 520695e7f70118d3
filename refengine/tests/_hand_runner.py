"""The model runner's tests' hand-driven setup: a runner on the tests' model (TEST_MODEL) with small blocks, the
prompts, the whole engine's greedy tokens for them, HandScheduler, which plays the scheduler's part by hand, and
count_host_reads; install_eager_graphs, a CPU stand-in for captured CUDA graphs."""

from __future__ import annotations

import torch

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts, run_llm
from refengine.config import EngineConfig, SchedulerConfig
from refengine.scheduler.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from refengine.worker.cuda_graphs import CudaGraphRunner, GraphBuckets
from refengine.worker.model_runner import ModelRunner
from refengine.worker.worker import _load_model_cached

BLOCK = 4
PROMPTS = make_prompts((9, 3, 14), seed=21)
MAX_TOKENS = (8, 8, 8)


def engine_reference() -> list[list[int]]:
    """The engine's greedy tokens for PROMPTS (each run alone would give the same: batching changes nothing)."""
    tokens, _ = run_llm(PROMPTS, MAX_TOKENS, block_size=BLOCK, num_gpu_blocks=256)
    return tokens


def make_runner(num_cpu_blocks: int = 16, max_num_seqs: int = 4) -> ModelRunner:
    model, cfg = _load_model_cached(TEST_MODEL, torch.device("cpu"), torch.float32, 0, "torch")
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
        max_num_batched_tokens=SchedulerConfig.max_num_batched_tokens,  # (the scheduler's default: sizes no CPU buffer)
        enforce_eager=EngineConfig.enforce_eager,
    )


def blank_output(**fields: object) -> SchedulerOutput:
    """A step with nothing in it yet, for HandScheduler to fill in; `fields` sets some from the start. (A
    SchedulerOutput names every field: the scheduler's one builder says each, a hand-built one starts empty.)"""
    empty: dict[str, object] = {
        "scheduled_new_reqs": [],
        "scheduled_cached_reqs": CachedRequestData(),
        "num_scheduled_tokens": {},
        "total_num_scheduled_tokens": 0,
        "is_prefill": {},
        "preempted_req_ids": [],
        "finished_req_ids": set(),
        "blocks_to_swap_out": [],
        "blocks_to_swap_in": [],
        "num_prefill_tokens": 0,
        "num_decode_tokens": 0,
    }
    return SchedulerOutput(**{**empty, **fields})  # type: ignore[arg-type]  # (each value has its field's type)


class HandScheduler:
    """Plays the scheduler's part by hand: block ids from a free list (handed out from the top, so that block
    tables are not the identity; block 0 first, the block a padding row would wrongly write), and the
    per-request counts the contract carries."""

    def __init__(self) -> None:
        self.free = list(range(1, 64)) + [0]
        self.blocks: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.tokens: dict[str, list[int]] = {}
        self.num_steps = 0

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
        self.num_steps += 1
        assert res.req_ids == list(out.num_scheduled_tokens)
        assert res.req_id_to_index == {r: i for i, r in enumerate(res.req_ids)}
        for rid, toks in zip(res.req_ids, res.sampled_token_ids):
            self.tokens[rid] += toks
        return dict(zip(res.req_ids, res.sampled_token_ids))


def decode_until(hs: HandScheduler, runner: ModelRunner, rids: list[str], n_out: int) -> None:
    while any(len(hs.tokens[r]) - len(p) < n_out for r, p in rids):
        out = blank_output()
        for r, p in rids:
            if len(hs.tokens[r]) - len(p) < n_out:
                hs.cached(out, r, 1)
        hs.step(runner, out)


def mixed_steps(hs: HandScheduler, runner: ModelRunner, n_out: int = 8) -> list[int]:
    """PROMPTS[0] prefilled alone, then PROMPTS[1] and PROMPTS[2] prefilled in chunks beside the others' decodes
    (mixed steps: prefill chunks and decodes together, partial prefills among them), then decodes to `n_out`
    tokens each. Returns each step's scheduled token count."""
    a, b, c = PROMPTS
    plan: list[list[tuple[str, int, bool]]] = [  # per step: (request, tokens, new?)
        [("a", len(a), True)],
        [("a", 1, False), ("b", 2, True)],
        [("a", 1, False), ("b", len(b) - 2, False), ("c", 5, True)],
        [("a", 1, False), ("b", 1, False), ("c", 5, False)],
        [("a", 1, False), ("b", 1, False), ("c", len(c) - 10, False)],
    ]
    sizes = []
    for step in plan:
        out = blank_output()
        for rid, n, new in step:
            if new:
                hs.new(out, rid, dict(zip("abc", PROMPTS))[rid], n)
            else:
                hs.cached(out, rid, n)
        sizes.append(out.total_num_scheduled_tokens)
        hs.step(runner, out)
    decode_until(hs, runner, [("a", a), ("b", b), ("c", c)], n_out)
    return sizes


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


class _EagerReplay:
    """Stands in for a captured torch.cuda.CUDAGraph on the CPU: replay() runs the model on the graph runner's
    static buffers into a fixed output, as a real replay would."""

    def __init__(self, graphs: CudaGraphRunner, num_tokens: int, num_seqs: int, hidden_size: int) -> None:
        self.graphs, self.shape = graphs, (num_tokens, num_seqs)
        self.hidden = torch.zeros(num_tokens, hidden_size)

    def replay(self) -> None:
        g, (t, s) = self.graphs, self.shape
        meta = g.meta(t, s)
        # (the torch backend plans on host lists; a real replay's triton kernels read the same buffers)
        meta.query_start_loc_cpu, meta.seq_lens_cpu = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
        self.hidden.copy_(g.model(g.input_ids[:t], g.positions[:t], g.kv_caches, meta))


def install_eager_graphs(runner: ModelRunner, buckets: GraphBuckets) -> CudaGraphRunner:
    """Give a CPU runner a CudaGraphRunner over `buckets` whose every graph is an eager replay (_EagerReplay): the
    runner pads, copies into the static buffers and replays as on CUDA."""
    graphs = CudaGraphRunner(
        runner.model, runner.kv_caches, buckets, runner.input_batch.block_table.shape[1], torch.device("cpu")
    )
    for t, s in buckets.shapes():
        replay = _EagerReplay(graphs, t, s, runner.model.config.hidden_size)
        graphs.graphs[(t, s)] = (replay, replay.hidden)  # type: ignore[assignment]  # (a stand-in for the graph)
    runner.cuda_graphs = graphs
    return graphs
