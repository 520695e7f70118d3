"""CUDA graphs for decode-only steps, as vLLM captures them: one graph per batch size in a vLLM-like list
(1, 2, 4, 8, 16, 24, ... up to max_num_seqs); a step of S decodes is padded to the smallest captured size >= S.

Padding (`pad_decode_inputs`, plain numpy, tested on the CPU): padded sequences have query length 0 and context
length 0, padded tokens have slot -1 (never written to the cache) and block-table rows of zeros, so the attention
kernels skip them and the real rows compute exactly what they would unpadded. The graph's inputs are static
device buffers; a replay copies the step's (already padded) device inputs into them, device to device.

Only the forward up to the final norm is captured; logits and sampling run eagerly on the real rows. Graphs need
the triton attention backend: the torch oracle plans its gathers on the host, which a graph cannot replay.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch

from refengine.layers.attention import AttentionMetadata


def capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default shape: 1, 2, 4, then every 8 up to 256, every 16 beyond; max_num_seqs itself always."""
    sizes = [s for s in (1, 2, 4) if s <= max_num_seqs]
    sizes += list(range(8, min(max_num_seqs, 256) + 1, 8)) + list(range(272, max_num_seqs + 1, 16))
    if not sizes or sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def padded_size(sizes: list[int], num_seqs: int) -> int | None:
    """The smallest size >= num_seqs, or None when the batch is larger than every size."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


def pad_decode_inputs(
    input_ids: np.ndarray,
    positions: np.ndarray,
    slot_mapping: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    block_table: np.ndarray,
    size: int,
) -> tuple[np.ndarray, ...]:
    """A decode-only step of S sequences ([S] arrays, query_start_loc [S + 1], block_table [S, W]) padded to
    `size` sequences: padded tokens are id 0 at position 0 with slot -1, padded sequences have query length 0
    (query_start_loc repeats its last value) and seq_len 0, and their block-table rows are zeros."""
    s = len(seq_lens)
    if size < s:
        raise ValueError(f"cannot pad a batch of {s} sequences to {size}")
    pad = size - s

    def grow(a: np.ndarray, value: int) -> np.ndarray:
        return np.concatenate([a, np.full((pad, *a.shape[1:]), value, dtype=a.dtype)])

    return (
        grow(input_ids, 0),
        grow(positions, 0),
        grow(slot_mapping, -1),
        grow(query_start_loc, int(query_start_loc[-1])),
        grow(seq_lens, 0),
        grow(block_table, 0),
    )


class CudaGraphRunner:
    """The captured graphs and their static inputs; `lookup(S)` -> the graph a step of S decodes replays."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_num_seqs: int,
        max_blocks: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = capture_sizes(max_num_seqs)
        self.max_blocks = max_blocks
        self.device = device
        n = self.sizes[-1]
        i64, i32 = torch.int64, torch.int32
        self.input_ids = torch.zeros(n, dtype=i64, device=device)
        self.positions = torch.zeros(n, dtype=i64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=i64, device=device)
        # int32 metadata, as the eager path passes it (and the kernels were warmed up with)
        self.query_start_loc = torch.zeros(n + 1, dtype=i32, device=device)
        self.seq_lens = torch.zeros(n, dtype=i32, device=device)
        self.block_table = torch.zeros(n, max_blocks, dtype=i32, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_replays = 0

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_table=self.block_table[:size],
            max_query_len=1,
            max_seq_len=self.max_blocks * self.kv_caches[0][0].shape[1],
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, sharing one memory pool (as vLLM does). The dummy inputs are one
        token per sequence with slot -1 (nothing is written) reading block 0 (always a valid block)."""
        self.query_start_loc.copy_(torch.arange(len(self.query_start_loc), device=self.device))
        self.seq_lens.fill_(1)
        pool = None
        for size in reversed(self.sizes):
            args = (self.input_ids[:size], self.positions[:size], self.kv_caches, self._meta(size))
            # warm up outside the capture, on a side stream (compiles Triton variants, sets up cuBLAS handles)
            side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]  # torch leaves Stream() unannotated
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.model(*args)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                hidden = self.model(*args)  # [size, hidden]
            pool = graph.pool()
            self.graphs[size] = (graph, hidden)
        torch.cuda.synchronize(self.device)

    def release(self) -> None:
        """Drop the graphs (and with them their memory pool) and the static buffers: what a shut-down engine must
        not keep on the device. Idempotent; lookup() finds no size afterwards."""
        self.graphs.clear()
        self.kv_caches = []
        empty = torch.empty(0, dtype=torch.int64)
        self.input_ids = self.positions = self.slot_mapping = empty
        self.query_start_loc = self.seq_lens = self.block_table = empty.int()
        self.sizes = []

    def lookup(self, num_seqs: int) -> int | None:
        return padded_size(self.sizes, num_seqs)

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
    ) -> torch.Tensor:
        """Replay the graph of the (already padded) batch size on these inputs, copied (device to device, with the
        int32 casts) into the static buffers; returns its static hidden states [size, hidden], valid until the
        next replay."""
        size = input_ids.shape[0]
        graph, hidden = self.graphs[size]
        self.input_ids[:size].copy_(input_ids)
        self.positions[:size].copy_(positions)
        self.slot_mapping[:size].copy_(slot_mapping)
        self.query_start_loc[: size + 1].copy_(query_start_loc)
        self.seq_lens[:size].copy_(seq_lens)
        self.block_table[:size].copy_(block_table)
        graph.replay()
        self.num_replays += 1
        return hidden
