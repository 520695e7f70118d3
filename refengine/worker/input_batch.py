"""InputBatch: the persistent per-request rows the model runner builds each step's inputs from.

A request keeps its row from the step the runner first meets it until it leaves (finished, or preempted); each
step writes only what changed (new block ids, the token sampled last step). A resumed request rewrites its row; a
finished one frees it for the next. Everything here is host memory (numpy), so building a step's inputs never
waits on the device; the sampling parameters also live on the device, written once per row admission.

    row r:  token_ids[r, :num_tokens[r]]      block_table[r, :num_blocks[r]]
            num_prompt_tokens[r]  num_computed_tokens[r]  temperature/top_k/top_p/min_p/seed[r]  banned[r]
            penalties: a slot in PenaltyTables (refengine.sample.penalties) while the request has a penalty

StagingBuffer is the persistent host buffer (pinned on CUDA) in which a step's inputs cross to the device.
"""

from __future__ import annotations

import numpy as np
import torch

from refengine.limits import cdiv
from refengine.sample.penalties import PenaltyTables
from refengine.sampling_params import SamplingParams

NO_SEED = -1  # seed column of an unseeded row (seeds are reduced to 63 bits, so never negative)


class InputBatch:
    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        max_blocks_per_req: int,
        vocab_size: int,
        device: torch.device = torch.device("cpu"),
    ) -> None:
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        # int32: token ids and block ids fit, and the (max_num_reqs x max_model_len) table is the largest buffer
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)  # tokens the runner knows: prompt + sampled
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int64)  # as of this step's schedule
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        # sampling: host copies decide which paths a step needs; device copies are gathered by the sampler
        self.greedy = np.ones(max_num_reqs, dtype=bool)
        self.min_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.seeds = np.full(max_num_reqs, NO_SEED, dtype=np.int64)
        self.top_k_on = np.zeros(max_num_reqs, dtype=bool)
        self.top_p_on = np.zeros(max_num_reqs, dtype=bool)
        self.min_p_on = np.zeros(max_num_reqs, dtype=bool)
        self.banned: list[list[int]] = [[] for _ in range(max_num_reqs)]  # EOS + stop ids, masked until min_tokens
        self.temperature_dev = torch.ones(max_num_reqs, dtype=torch.float32, device=device)
        self.top_k_dev = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        self.top_p_dev = torch.ones(max_num_reqs, dtype=torch.float32, device=device)
        self.min_p_dev = torch.zeros(max_num_reqs, dtype=torch.float32, device=device)
        self.seeds_dev = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        self.penalties = PenaltyTables(max_num_reqs, vocab_size, device)
        self.req_ids: list[str | None] = [None] * max_num_reqs
        self.row_of: dict[str, int] = {}
        self.free_rows = list(range(max_num_reqs - 1, -1, -1))
        self.num_row_writes = 0  # rows written whole (admissions and resumptions); the rest of the work is appends
        self._rows_cache: tuple[int, list[str], np.ndarray] | None = None  # (layout version, ids, their rows)
        self._layout_version = 0  # changes whenever a request gains or loses its row

    def add_request(
        self,
        request_id: str,
        token_ids: list[int],
        num_prompt_tokens: int,
        block_ids: list[int],
        num_computed_tokens: int,
        params: SamplingParams,
        eos_token_ids: frozenset[int],
    ) -> int:
        """(Re)write a whole row: a request the runner meets for the first time, or one resumed after preemption."""
        row = self.row_of.get(request_id)
        if row is None:
            row = self.free_rows.pop()
            self.row_of[request_id] = row
            self.req_ids[row] = request_id
            self._layout_version += 1
        n, b = len(token_ids), len(block_ids)
        self.token_ids[row, :n] = token_ids
        self.block_table[row, :b] = block_ids
        self.num_tokens[row], self.num_blocks[row] = n, b
        self.num_prompt_tokens[row] = num_prompt_tokens
        self.num_computed_tokens[row] = num_computed_tokens
        self._set_sampling(row, params, eos_token_ids)
        self.num_row_writes += 1
        return row

    def _set_sampling(self, row: int, sp: SamplingParams, eos_token_ids: frozenset[int]) -> None:
        self.greedy[row] = sp.greedy
        self.min_tokens[row] = sp.min_tokens
        banned = list(sp.stop_token_ids or ()) + ([] if sp.ignore_eos else sorted(eos_token_ids))
        self.banned[row] = [t for t in banned if 0 <= t < self.vocab_size]
        self.top_k_on[row] = not sp.greedy and 0 < sp.top_k < self.vocab_size
        self.top_p_on[row] = not sp.greedy and sp.top_p < 1.0
        self.min_p_on[row] = not sp.greedy and sp.min_p > 0.0
        self.seeds[row] = NO_SEED if sp.seed is None else sp.seed & (2**63 - 1)
        # (one small host-to-device write per admission, none per step)
        self.temperature_dev[row] = 1.0 if sp.greedy else float(sp.temperature)
        self.top_k_dev[row] = sp.top_k if self.top_k_on[row] else 0
        self.top_p_dev[row] = float(sp.top_p) if self.top_p_on[row] else 1.0
        self.min_p_dev[row] = float(sp.min_p) if self.min_p_on[row] else 0.0
        self.seeds_dev[row] = max(int(self.seeds[row]), 0)
        self.penalties.set_row(row, sp)  # (the row's tokens are (re)counted at its next sample)

    def rows_of(self, request_ids: list[str]) -> np.ndarray:
        """[len(request_ids)] int64 rows, read-only. A decode step asks for the same ids as the step before, so
        the last answer is kept while no row has changed hands (comparing the lists costs far less than 256
        dict lookups)."""
        cache = self._rows_cache
        if cache is not None and cache[0] == self._layout_version and cache[1] == request_ids:
            return cache[2]
        row_of = self.row_of
        rows = np.fromiter((row_of[r] for r in request_ids), dtype=np.int64, count=len(request_ids))
        rows.flags.writeable = False
        self._rows_cache = (self._layout_version, list(request_ids), rows)
        return rows

    def token_ids_of(self, request_id: str) -> list[int]:
        row = self.row_of[request_id]
        tokens: list[int] = self.token_ids[row, : self.num_tokens[row]].tolist()
        return tokens

    def set_token_ids(self, request_id: str, token_ids: list[int]) -> None:
        """Resynchronise a row's tokens with the scheduler's (CachedRequestData.all_token_ids)."""
        row = self.row_of[request_id]
        self.token_ids[row, : len(token_ids)] = token_ids
        self.num_tokens[row] = len(token_ids)
        self.penalties.recount(row)

    def append_blocks(self, request_id: str, new_block_ids: list[int]) -> None:
        """Write block ids after those the row already has."""
        row = self.row_of[request_id]
        have = self.num_blocks[row]
        self.block_table[row, have : have + len(new_block_ids)] = new_block_ids
        self.num_blocks[row] = have + len(new_block_ids)

    def append_tokens(self, rows: np.ndarray, token_ids: list[int]) -> None:
        """One sampled token for each of `rows` (vectorised: this runs every step)."""
        self.token_ids[rows, self.num_tokens[rows]] = token_ids
        self.num_tokens[rows] += 1

    def remove(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self._layout_version += 1
            self.num_tokens[row] = self.num_blocks[row] = 0
            self.req_ids[row] = None
            self.penalties.release(row)
            self.free_rows.append(row)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.row_of


class StagingBuffer:
    """One host buffer (pinned on CUDA) and its device twin: a step's int64 arrays are packed end to end on the
    host and cross to the device in one non_blocking copy. On the CPU the host buffer is used as it is."""

    def __init__(self, device: torch.device, size: int = 1 << 14) -> None:
        self.device = device
        self._alloc(size)

    def _alloc(self, size: int) -> None:
        pin = self.device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.int64, pin_memory=pin)
        self.host_np = self.host.numpy()  # a view: writes through numpy land in the (pinned) tensor
        self.dev = self.host if self.device.type == "cpu" else torch.zeros(size, dtype=torch.int64, device=self.device)
        self._copied: torch.cuda.Event | None = None  # the last copy in; the host buffer is not rewritten before it

    def pack(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """Copy `arrays` (1-D; int32 arrays stay int32, anything else is stored as int64) in; return device views
        of them, in order, of the same dtypes. (The attention metadata is int32 on the device: packing it as int32
        saves a cast per tensor per step.)"""
        # every array starts 16-byte aligned (an even int64 offset), as Triton specializes pointers on alignment;
        # an int32 array of n entries takes ceil(n / 2) int64 slots
        slots = [cdiv(a.size, 2) if a.dtype == np.int32 else a.size for a in arrays]
        offsets = np.cumsum([0] + [n + (n & 1) for n in slots]).tolist()
        total = offsets[-1]
        if total > self.host.numel():  # (rare: the buffer grows to the largest step seen)
            self._alloc(max(total, 2 * self.host.numel()))
        if self._copied is not None:  # (a step that samples has synced already; one that does not may not have)
            self._copied.synchronize()
        host, views = self.host_np, []
        for a, o, n in zip(arrays, offsets, slots):
            if a.dtype == np.int32:
                host[o : o + n].view(np.int32)[: a.size] = a
                views.append(self.dev[o : o + n].view(torch.int32)[: a.size])
            else:
                host[o : o + a.size] = a
                views.append(self.dev[o : o + a.size])
        if self.dev is not self.host:
            self.dev[:total].copy_(self.host[:total], non_blocking=True)
            self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._copied.record()
        return views
