"""Test helper: a toy block allocator that turns "these tokens of these sequences" into one forward's inputs.

It plays the model runner's part without the scheduler: each sequence owns blocks drawn from a shuffled pool
(so block tables are non-contiguous), and `prepare` lays a mixed batch of prefill chunks and decodes out flat,
with vLLM's `slot_mapping`, `query_start_loc`, `seq_lens` and a zero-padded `block_table`.
"""

from __future__ import annotations

import torch

from refengine.layers.attention import AttentionMetadata
from refengine.models.decoder import CausalLM
from refengine.models.model_config import ModelConfig


def make_kv_caches(
    config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32, device="cpu"
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(config.num_hidden_layers)
    ]


class PagedSequences:
    """Block tables and computed-token counts of a few sequences sharing one paged KV cache."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device="cpu",
    ) -> None:
        self.block_size = block_size
        self.device = device
        self.kv_caches = make_kv_caches(config, num_blocks, block_size, dtype, device)
        gen = torch.Generator().manual_seed(seed)
        self.free_blocks = torch.randperm(num_blocks, generator=gen).tolist()
        self.block_ids: dict[int, list[int]] = {}
        self.num_computed: dict[int, int] = {}

    def prepare(self, batch: list[tuple[int, list[int]]]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """batch: (seq_id, new token ids) in order -> input_ids [T], positions [T], metadata. Advances the seqs."""
        input_ids, positions, slots, seq_lens, qsl = [], [], [], [], [0]
        for seq_id, tokens in batch:
            blocks = self.block_ids.setdefault(seq_id, [])
            start = self.num_computed.get(seq_id, 0)
            end = start + len(tokens)
            while len(blocks) * self.block_size < end:
                blocks.append(self.free_blocks.pop())
            for pos in range(start, end):
                slots.append(blocks[pos // self.block_size] * self.block_size + pos % self.block_size)
            input_ids += tokens
            positions += range(start, end)
            seq_lens.append(end)
            qsl.append(qsl[-1] + len(tokens))
            self.num_computed[seq_id] = end
        width = max(len(self.block_ids[s]) for s, _ in batch)
        table = [self.block_ids[s] + [0] * (width - len(self.block_ids[s])) for s, _ in batch]
        q_lens = [b - a for a, b in zip(qsl, qsl[1:])]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=self.device),
            block_table=torch.tensor(table, dtype=torch.int32, device=self.device),
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        return ids, torch.tensor(positions, dtype=torch.int64, device=self.device), meta

    @torch.no_grad()
    def forward(self, model: CausalLM, batch: list[tuple[int, list[int]]]) -> torch.Tensor:
        """Run one step; returns the float32 logits of every token in the batch, [T, vocab]."""
        input_ids, positions, meta = self.prepare(batch)
        return model.compute_logits(model(input_ids, positions, self.kv_caches, meta))
