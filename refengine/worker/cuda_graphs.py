"""CUDA graphs for every step the triton backend runs: whole-model graphs over padded (num_tokens, num_seqs) buckets.

A step of T tokens over S sequences replays the graph of the smallest bucket that holds it (`GraphBuckets.shape_of`):
- decode-only (T == S): vLLM's decode sizes (1, 2, 4, 8, 16, 24, ... up to max_num_seqs), bucket (s, s);
- mixed (prefill chunks beside decodes, T > S): token sizes every 16 to 256, every 64 to 1024, every 256 to
  MAX_MIXED_CAPTURE_TOKENS (or max_num_batched_tokens, if smaller), each with S_pad = min(t - 1, max_num_seqs)
  sequence rows. A mixed step has S <= T - 1 (one of its queries is longer than a token), so every mixed step up to
  the largest size fits one bucket, and the bucket keeps T_pad > S_pad: the attention kernel plans a padded mixed
  step exactly as it plans the unpadded one (prefill tiles, no split-KV, which only decode-only shapes take).
Larger mixed steps run eagerly: at thousands of tokens the device time dwarfs the launches a graph would save.

This is the full-graph way, not vLLM's piecewise one (attention outside the graph): the unified attention kernel
serves prefill chunks and decodes in one launch whose grid depends on shapes only (never on values read back), so
the whole forward can be captured once per bucket.

Padding (`pad_step_inputs`, plain numpy, tested on the CPU): padded tokens have id 0, position 0 and slot -1
(never written to the cache: the cache-write kernel skips negative slots) and lie past query_start_loc[-1], so no
sequence's query reaches them; padded sequences have query length 0 (query_start_loc repeats its last value),
context 0 and block-table rows of zeros, so attention skips them. The real rows therefore compute what they would
unpadded. The graph's inputs are static device buffers; a replay copies the step's (already padded) device inputs
into them, device to device.

Bounds, at the defaults (max_num_seqs 256, max_num_batched_tokens 8192): 35 decode + 32 mixed = 67 graphs, one
shared memory pool. Capture runs 3 forwards per bucket (2 warm-ups, 1 captured): 3 x 67 forwards of host dispatch
plus the device time of 3 x (sum of the buckets' tokens = 4,231 decode + 16,896 mixed) tokens, a few seconds
for an 8B model on an H200 (docs/engine.md has the arithmetic and the measurement).

Only the forward up to the final norm is captured; logits and sampling run eagerly on the real rows. Graphs need
the triton attention backend: the torch oracle plans its gathers on the host, which a graph cannot replay.
"""

from __future__ import annotations

import bisect
import itertools
import time
from dataclasses import dataclass

import numpy as np
import torch

from refengine.layers.attention import AttentionMetadata

# Mixed steps larger than this run eagerly (see the module docstring); it bounds the mixed buckets at 32.
MAX_MIXED_CAPTURE_TOKENS = 2048
# Warm-up forwards before each capture, outside it: compile Triton variants, set up cuBLAS handles and workspaces.
NUM_WARMUP_FORWARDS = 2


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Decode-only sizes, vLLM's default shape: 1, 2, 4, then every 8 up to 256, every 16 beyond; max_num_seqs
    itself always."""
    sizes = [s for s in (1, 2, 4) if s <= max_num_seqs]
    sizes += list(range(8, min(max_num_seqs, 256) + 1, 8)) + list(range(272, max_num_seqs + 1, 16))
    if not sizes or sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def mixed_capture_sizes(max_num_batched_tokens: int, max_tokens: int = MAX_MIXED_CAPTURE_TOKENS) -> list[int]:
    """Token counts of the mixed buckets: every 16 to 256, every 64 to 1024, every 256 beyond, up to
    min(max_num_batched_tokens, max_tokens), which is always the last; [] when no mixed step exists (under 2 tokens)."""
    limit = min(max_num_batched_tokens, max_tokens)
    if limit < 2:
        return []
    steps = itertools.chain(range(16, 257, 16), range(320, 1025, 64), range(1280, max(limit, 1280) + 1, 256))
    return [t for t in steps if t < limit] + [limit]


def padded_size(sizes: list[int], n: int) -> int | None:
    """The smallest size >= n, or None when n is larger than every size."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


@dataclass(frozen=True)
class GraphBuckets:
    """The padded (num_tokens, num_seqs) shapes a step may run at (see the module docstring)."""

    decode_sizes: tuple[int, ...]
    mixed_sizes: tuple[int, ...]
    max_num_seqs: int

    @classmethod
    def of(
        cls, max_num_seqs: int, max_num_batched_tokens: int, max_mixed_tokens: int = MAX_MIXED_CAPTURE_TOKENS
    ) -> GraphBuckets:
        return cls(
            tuple(capture_sizes(max_num_seqs)),
            tuple(mixed_capture_sizes(max_num_batched_tokens, max_mixed_tokens)),
            max_num_seqs,
        )

    def mixed_shape(self, num_tokens: int) -> tuple[int, int]:
        """The bucket of `num_tokens` mixed tokens: (t, min(t - 1, max_num_seqs)) with t a mixed size."""
        return num_tokens, min(num_tokens - 1, self.max_num_seqs)

    def shape_of(self, num_tokens: int, num_seqs: int) -> tuple[int, int] | None:
        """(padded num_tokens, padded num_seqs) of a step, or None when it is larger than every bucket."""
        if num_tokens == num_seqs:
            size = padded_size(list(self.decode_sizes), num_seqs)
            return None if size is None else (size, size)
        t = padded_size(list(self.mixed_sizes), num_tokens)
        if t is None:
            return None
        shape = self.mixed_shape(t)
        return shape if shape[1] >= num_seqs else None  # (always holds for a mixed step: num_seqs <= num_tokens - 1)

    def shapes(self) -> list[tuple[int, int]]:
        """Every bucket, decode-only ones first."""
        return [(s, s) for s in self.decode_sizes] + [self.mixed_shape(t) for t in self.mixed_sizes]


def pad_step_inputs(
    input_ids: np.ndarray,
    positions: np.ndarray,
    slot_mapping: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    block_table: np.ndarray,
    num_tokens: int,
    num_seqs: int,
) -> tuple[np.ndarray, ...]:
    """A step of T tokens ([T] arrays) over S sequences (query_start_loc [S + 1], seq_lens [S], block_table [S, W])
    padded to `num_tokens` tokens and `num_seqs` sequences: padded tokens are id 0 at position 0 with slot -1,
    padded sequences have query length 0 (query_start_loc repeats its last value), seq_len 0 and block-table rows
    of zeros. The real entries come first, unchanged."""
    t, s = len(input_ids), len(seq_lens)
    if num_tokens < t or num_seqs < s:
        raise ValueError(f"cannot pad a step of {t} tokens over {s} sequences to ({num_tokens}, {num_seqs})")

    def grow(a: np.ndarray, size: int, value: int) -> np.ndarray:
        if len(a) == size:
            return a
        return np.concatenate([a, np.full((size - len(a), *a.shape[1:]), value, dtype=a.dtype)])

    return (
        grow(input_ids, num_tokens, 0),
        grow(positions, num_tokens, 0),
        grow(slot_mapping, num_tokens, -1),
        grow(query_start_loc, num_seqs + 1, int(query_start_loc[-1])),
        grow(seq_lens, num_seqs, 0),
        grow(block_table, num_seqs, 0),
    )


class CudaGraphRunner:
    """The captured graphs and their static inputs; `lookup(T, S)` -> the bucket a step of T tokens over S
    sequences replays, `run(...)` replays it."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        buckets: GraphBuckets,
        max_blocks: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.buckets = buckets
        self.max_blocks = max_blocks
        self.device = device
        shapes = buckets.shapes()
        n_tok, n_seq = max(t for t, _ in shapes), max(s for _, s in shapes)
        i64, i32 = torch.int64, torch.int32
        self.input_ids = torch.zeros(n_tok, dtype=i64, device=device)
        self.positions = torch.zeros(n_tok, dtype=i64, device=device)
        self.slot_mapping = torch.full((n_tok,), -1, dtype=i64, device=device)
        # int32 metadata, as the eager path passes it (and the kernels were warmed up with)
        self.query_start_loc = torch.zeros(n_seq + 1, dtype=i32, device=device)
        self.seq_lens = torch.zeros(n_seq, dtype=i32, device=device)
        self.block_table = torch.zeros(n_seq, max_blocks, dtype=i32, device=device)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_replays = 0
        self.capture_seconds = 0.0

    def meta(self, num_tokens: int, num_seqs: int) -> AttentionMetadata:
        """The metadata of a bucket, on views of the static buffers. Its max_query_len bounds every step the bucket
        holds: one token in a decode bucket; in a mixed one a single sequence may hold all the real tokens (the
        padded sequences have none)."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:num_tokens],
            query_start_loc=self.query_start_loc[: num_seqs + 1],
            seq_lens=self.seq_lens[:num_seqs],
            block_table=self.block_table[:num_seqs],
            max_query_len=1 if num_tokens == num_seqs else num_tokens,
            max_seq_len=self.max_blocks * self.kv_caches[0][0].shape[1],
        )

    def _dummy_step(self, num_tokens: int, num_seqs: int) -> None:
        """Capture-time inputs of a bucket: the first sequence takes the tokens beyond one per sequence (a prefill
        chunk, for a mixed bucket), every context is its own query, every slot -1 (nothing is written) and every
        block id 0 (always a valid block). Values only: the kernels' launches depend on the shapes alone."""
        lens = np.ones(num_seqs, dtype=np.int32)
        lens[0] += num_tokens - num_seqs
        qsl = np.zeros(num_seqs + 1, dtype=np.int32)
        np.cumsum(lens, out=qsl[1:])
        self.query_start_loc[: num_seqs + 1].copy_(torch.from_numpy(qsl))
        self.seq_lens[:num_seqs].copy_(torch.from_numpy(lens))
        self.slot_mapping.fill_(-1)
        self.block_table.zero_()

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first, sharing one memory pool (as vLLM does)."""
        start = time.perf_counter()
        pool = None
        # one side stream for every warm-up: the allocator reuses a freed block only on the stream it was freed on,
        # so a stream per bucket would leave each bucket's warm-up activations cached where nothing reuses them
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]  # torch leaves Stream() unannotated
        for num_tokens, num_seqs in sorted(self.buckets.shapes(), reverse=True):
            self._dummy_step(num_tokens, num_seqs)
            args = (self.input_ids[:num_tokens], self.positions[:num_tokens], self.kv_caches)
            meta = self.meta(num_tokens, num_seqs)
            # warm up outside the capture, on the side stream (compiles Triton variants, sets up cuBLAS handles)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(NUM_WARMUP_FORWARDS):
                    self.model(*args, meta)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                hidden = self.model(*args, meta)  # [num_tokens, hidden]
            pool = graph.pool()
            self.graphs[(num_tokens, num_seqs)] = (graph, hidden)
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - start

    def release(self) -> None:
        """Drop the graphs (and with them their memory pool) and the static buffers: what a shut-down engine must
        not keep on the device. Idempotent; lookup() finds no bucket afterwards."""
        self.graphs.clear()
        self.kv_caches = []
        empty = torch.empty(0, dtype=torch.int64)
        self.input_ids = self.positions = self.slot_mapping = empty
        self.query_start_loc = self.seq_lens = self.block_table = empty.int()
        self.buckets = GraphBuckets(decode_sizes=(), mixed_sizes=(), max_num_seqs=0)

    def lookup(self, num_tokens: int, num_seqs: int) -> tuple[int, int] | None:
        return self.buckets.shape_of(num_tokens, num_seqs)

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
    ) -> torch.Tensor:
        """Replay the graph of the (already padded) bucket on these inputs, copied (device to device) into the
        static buffers; returns its static hidden states [num_tokens, hidden], valid until the next replay."""
        num_tokens, num_seqs = input_ids.shape[0], seq_lens.shape[0]
        graph, hidden = self.graphs[(num_tokens, num_seqs)]
        self.input_ids[:num_tokens].copy_(input_ids)
        self.positions[:num_tokens].copy_(positions)
        self.slot_mapping[:num_tokens].copy_(slot_mapping)
        self.query_start_loc[: num_seqs + 1].copy_(query_start_loc)
        self.seq_lens[:num_seqs].copy_(seq_lens)
        self.block_table[:num_seqs].copy_(block_table)
        graph.replay()
        self.num_replays += 1
        return hidden
