"""InputBatch: the persistent per-request rows the model runner builds each step's inputs from.

A request keeps its row from admission until it leaves; each step writes only what changed (new block ids, the
token sampled last step). A resumed (preempted) request rewrites its row; a finished one frees it for the next.

    row r:  token_ids[r, :num_tokens]        block_table[r, :num_blocks]
"""
from __future__ import annotations

import torch


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int) -> None:
        self.token_ids = torch.zeros(max_num_reqs, max_model_len, dtype=torch.long)
        self.block_table = torch.zeros(max_num_reqs, max_blocks_per_req, dtype=torch.int32)
        self.num_tokens = [0] * max_num_reqs
        self.num_blocks = [0] * max_num_reqs
        self.row_of: dict[str, int] = {}
        self.free_rows = list(range(max_num_reqs - 1, -1, -1))
        self.num_row_writes = 0  # rows written whole (admissions); the rest of the work is appends

    def add(self, request_id: str, token_ids: list[int], block_ids: list[int]) -> int:
        """(Re)write a whole row: a new request, or one resumed after preemption."""
        row = self.row_of.get(request_id)
        if row is None:
            row = self.free_rows.pop()
            self.row_of[request_id] = row
        n, b = len(token_ids), len(block_ids)
        self.token_ids[row, :n] = torch.tensor(token_ids, dtype=torch.long)
        self.block_table[row, :b] = torch.tensor(block_ids, dtype=torch.int32)
        self.num_tokens[row], self.num_blocks[row] = n, b
        self.num_row_writes += 1
        return row

    def blocks_held(self, request_id: str) -> int:
        return self.num_blocks[self.row_of[request_id]]

    def append_blocks(self, request_id: str, new_block_ids: list[int]) -> None:
        """Write block ids after those the row already has."""
        row = self.row_of[request_id]
        have = self.num_blocks[row]
        self.block_table[row, have : have + len(new_block_ids)] = torch.tensor(new_block_ids, dtype=torch.int32)
        self.num_blocks[row] = have + len(new_block_ids)

    def append_token(self, request_id: str, token_id: int) -> None:
        row = self.row_of[request_id]
        self.token_ids[row, self.num_tokens[row]] = token_id
        self.num_tokens[row] += 1

    def remove(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.num_tokens[row] = self.num_blocks[row] = 0
            self.free_rows.append(row)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.row_of
