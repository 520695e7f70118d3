"""KVCacheManager: per-request block tables on top of the device BlockPool, prefix-cache lookups, and the host
pool that swap preemption copies blocks into.

A request's KV, block by block (block_size 4, 10 tokens computed, prefix hit on the first two blocks):

    tokens   [t0 t1 t2 t3][t4 t5 t6 t7][t8 t9 .  .]
    blocks   [  b12 hit  ][  b3 hit   ][ b40 new  ]      req_to_blocks[id] = [b12, b3, b40]
    hashes   [    h0     ][ h1(h0,..) ]                 only full blocks are hashed, chained to the one before
"""

from __future__ import annotations

from collections.abc import Mapping

from refengine.kv_cache.block_pool import BlockHash, BlockPool, KVCacheBlock, hash_block_tokens
from refengine.limits import cdiv
from refengine.request import Request


class KVCacheManager:
    def __init__(self, num_gpu_blocks: int, block_size: int, enable_prefix_caching: bool, num_cpu_blocks: int = 0):
        self.block_size = block_size
        self.enable_caching = enable_prefix_caching
        self.block_pool = BlockPool(num_gpu_blocks, enable_prefix_caching)
        self.host_pool = BlockPool(num_cpu_blocks, enable_caching=False)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_to_block_hashes: dict[str, list[BlockHash]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading blocks of the request already in the hash map
        self.swapped: dict[str, list[KVCacheBlock]] = {}  # request id -> host blocks holding its KV
        self._host_blocks_to_free: list[list[KVCacheBlock]] = []  # swap-in sources of this step (end_step frees them)

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.block_pool.num_used_blocks

    @property
    def usage(self) -> float:
        """The share of device blocks held by requests, in [0, 1] (vLLM's kv_cache_usage)."""
        return self.block_pool.num_used_blocks / self.block_pool.num_blocks

    # ---- prefix caching -------------------------------------------------------------------------------------
    def block_hashes(self, request: Request) -> list[BlockHash]:
        """Hashes of the request's full blocks, extended incrementally as tokens are appended."""
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        bs = self.block_size
        for i in range(len(hashes), request.num_tokens // bs):
            parent = hashes[-1] if hashes else None
            salt = request.cache_salt if i == 0 else None  # the first block's alone: the chain carries it on
            hashes.append(hash_block_tokens(parent, request.all_token_ids[i * bs : (i + 1) * bs], salt))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest chain of cached full blocks from the start; never covers the last token, which must be
        computed to produce logits."""
        if not self.enable_caching:
            return [], 0
        hits: list[KVCacheBlock] = []
        max_blocks = (request.num_tokens - 1) // self.block_size
        for h in self.block_hashes(request)[:max_blocks]:
            block = self.block_pool.get_cached_block(h)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Put the full blocks among the request's first `num_tokens` (known) tokens into the prefix cache."""
        if not self.enable_caching:
            return
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        start = self.num_cached_blocks.get(request.request_id, 0)
        if num_full <= start:
            return
        blocks = self.req_to_blocks[request.request_id]
        hashes = self.block_hashes(request)
        for i in range(start, num_full):
            self.block_pool.cache_block(blocks[i], hashes[i])
        self.num_cached_blocks[request.request_id] = num_full

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix while no request holds a block (BlockPool.reset_prefix_cache); False if any
        does. The requests' own block hashes stay: they are their tokens' hashes, valid whatever the map holds."""
        return self.block_pool.reset_prefix_cache()

    # ---- allocation -----------------------------------------------------------------------------------------
    def has_room(self, request: Request, num_new_tokens: int) -> bool:
        """True when allocate_slots(request, num_new_tokens) would change nothing: the blocks held already have room
        for the new tokens, and none of them becomes full and cacheable (the common decode step), so the
        scheduler need not call it."""
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid)
        total = request.num_computed_tokens + num_new_tokens
        if blocks is None or total > len(blocks) * self.block_size:
            return False
        return not self.enable_caching or (
            min(total, request.num_tokens) // self.block_size <= self.num_cached_blocks.get(rid, 0)
        )

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_tokens_to_fit: int = 0,
        reserve: bool = False,
    ) -> list[KVCacheBlock] | None:
        """Make the request hold ceil((computed + hits + new) / block_size) blocks, or, with `reserve`, enough for
        `num_tokens_to_fit`. Fails as a whole (returns None, nothing changed) unless blocks for
        max(computed + hits + new, num_tokens_to_fit) tokens can be had."""
        hits = new_computed_blocks or []
        rid = request.request_id
        held = self.req_to_blocks.get(rid, [])
        bs = self.block_size
        total = request.num_computed_tokens + len(hits) * bs + num_new_tokens
        need = cdiv(total, bs) - len(held) - len(hits)
        if need <= 0 and not hits and num_tokens_to_fit <= total:  # the common decode step: room in the tail block
            self.cache_blocks(request, total)
            return []
        need_fit = cdiv(max(total, num_tokens_to_fit), bs) - len(held) - len(hits)
        free_hits = sum(1 for b in hits if b.ref_cnt == 0)  # a hit on a free block takes it off the free queue
        if max(need, need_fit) > self.block_pool.num_free_blocks - free_hits:
            return None
        self.block_pool.touch(hits)
        blocks = self.req_to_blocks.setdefault(rid, [])
        if hits:
            blocks.extend(hits)
            self.num_cached_blocks[rid] = len(blocks)
        new = self.block_pool.get_new_blocks(max(0, need_fit if reserve else need))
        blocks.extend(new)
        self.cache_blocks(request, total)
        return new

    def free(self, request: Request) -> None:
        """Return every device block of the request, tail first, so that its prefix stays cached longest."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_blocks.pop(request.request_id, None)

    def free_host(self, request: Request) -> list[KVCacheBlock]:
        host = self.swapped.pop(request.request_id, [])
        self.host_pool.free_blocks(reversed(host))
        return host

    def remove(self, request: Request) -> None:
        """Forget a finished request entirely."""
        self.free(request)
        self.free_host(request)
        self.req_to_block_hashes.pop(request.request_id, None)

    # ---- block tables (what the scheduler tells the runner; vLLM's get_block_ids) ------------------------------
    def get_num_blocks(self, request_id: str) -> int:
        """How many device blocks the request holds: the length of its block table."""
        return len(self.req_to_blocks.get(request_id, ()))

    def get_block_ids(self, request_id: str, start: int = 0) -> list[int]:
        """The request's block table from block `start` on (0: all of it; else the blocks the runner lacks)."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])[start:]]

    # ---- swap -----------------------------------------------------------------------------------------------
    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Copy plan device -> host for all the request's blocks, then free them on the device; None (nothing
        changed) when the host pool cannot take them."""
        # only the blocks of computed tokens: a victim scheduled earlier in this step also holds the blocks
        # allocated for its (now withdrawn) new tokens, which hold no KV yet
        blocks = self.req_to_blocks.get(request.request_id, [])[: cdiv(request.num_computed_tokens, self.block_size)]
        if len(blocks) > self.host_pool.num_free_blocks:
            return None
        host = self.host_pool.get_new_blocks(len(blocks))
        self.swapped[request.request_id] = host
        self.free(request)
        return [(d.block_id, h.block_id) for d, h in zip(blocks, host)]

    def swap_in(
        self, request: Request, num_new_tokens: int, num_tokens_to_fit: int, reserve: bool
    ) -> list[tuple[int, int]] | None:
        """Device blocks for a swapped-out request's computed tokens plus this step's; returns the host -> device
        copy plan, or None (nothing changed). Its host blocks stay held until end_step()."""
        host = self.swapped[request.request_id]
        new = self.allocate_slots(request, num_new_tokens, None, num_tokens_to_fit, reserve)
        if new is None:
            return None
        device = self.req_to_blocks[request.request_id]
        del self.swapped[request.request_id]
        self._host_blocks_to_free.append(host)
        return [(h.block_id, d.block_id) for h, d in zip(host, device)]

    def end_step(self) -> None:
        """The host blocks this step swaps in from go back to the host pool as schedule() returns, not a step later:
        held until the next schedule(), they stayed held for good once the engine went idle. Not earlier: a victim
        preempted later in the same schedule() could be swapped out into them, and the runner issues a step's
        swap-out copies before its swap-in copies. A later step's swap-out is copied after this step's swap-in,
        because the runner executes steps in order (async scheduling too: one worker thread)."""
        for host in self._host_blocks_to_free:
            self.host_pool.free_blocks(reversed(host))
        self._host_blocks_to_free = []

    def check_invariants(self, requests: Mapping[str, Request] | None = None) -> None:
        """The pools' own invariants, ref counts equal to holders, host blocks held only by swapped-out requests;
        with `requests` (id -> Request, the scheduler's), also that each of those requests' block hashes is the
        chained hash of a full block of its tokens: a partial block is never hashed, for its hash would not be
        recomputed once the block fills."""
        self.block_pool.check_invariants()
        self.host_pool.check_invariants()
        held: dict[int, int] = {}
        for blocks in self.req_to_blocks.values():
            for b in blocks:
                held[b.block_id] = held.get(b.block_id, 0) + 1
        for b in self.block_pool.blocks:
            assert b.ref_cnt == held.get(b.block_id, 0), (
                f"ref count {b.ref_cnt} != holders {held.get(b.block_id, 0)}: {b}"
            )
        # the host pool holds the KV of swapped-out requests and nothing else (so it is empty when idle)
        host_held = sum(len(h) for h in self.swapped.values())
        assert host_held == self.host_pool.num_used_blocks, (
            f"{self.host_pool.num_used_blocks} host blocks used, {host_held} held by swapped-out requests"
        )
        for rid, req in (requests or {}).items():
            self._check_block_hashes(req, self.req_to_block_hashes.get(rid, []))

    def _check_block_hashes(self, request: Request, hashes: list[BlockHash]) -> None:
        bs = self.block_size
        assert len(hashes) <= request.num_tokens // bs, (
            f"{request} has {len(hashes)} block hashes for {request.num_tokens // bs} full blocks: a partial block "
            "was hashed"
        )
        parent: BlockHash | None = None
        for i, h in enumerate(hashes):
            salt = request.cache_salt if i == 0 else None
            parent = hash_block_tokens(parent, request.all_token_ids[i * bs : (i + 1) * bs], salt)
            assert h == parent, f"{request}: block {i}'s hash is not that of its tokens"
