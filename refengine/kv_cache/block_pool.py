"""BlockPool: fixed-size KV blocks with reference counts, an LRU free queue and the prefix-cache hash map.

    free queue (least recently freed first)          cached map: block_hash -> {block_id: block}
    [b7 | b3 | b12 | ...]  <- free_blocks() appends     a freed block keeps its hash until it is handed out again

A block is `used` while ref_cnt > 0 and `free` otherwise; a free block that still holds a hash is reusable by a
prefix hit (`touch` takes it back out of the free queue) until `get_new_blocks` evicts it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

BlockHash = int


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


def hash_block_tokens(
    parent_hash: BlockHash | None, token_ids: Sequence[int], cache_salt: str | None = None
) -> BlockHash:
    """Hash of a full block chained to the hash of the block before it, so equal hashes mean equal prefixes. A
    request's `cache_salt` (vLLM's request field) goes into its first block's hash only: the chain carries it to
    every later block, so a salted prefix never matches an unsalted one or one under another salt."""
    if cache_salt is None:
        return hash((parent_hash, tuple(token_ids)))
    return hash((parent_hash, tuple(token_ids), cache_salt))


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        # several blocks may hold the same prefix (computed twice before either was cached); keeping every copy
        # means evicting one does not lose the hit
        self.cached: dict[BlockHash, dict[int, KVCacheBlock]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take n blocks from the head of the free queue (least recently freed), evicting their cached hashes."""
        if n > len(self.free_queue):
            raise RuntimeError(f"asked for {n} blocks with {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            _, block = self.free_queue.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            copies = self.cached.get(block.block_hash)
            if copies is not None:
                copies.pop(block.block_id, None)
                if not copies:
                    del self.cached[block.block_hash]
            block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits; a hit on a free block takes it out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each. Blocks reaching zero that hold a cached prefix join the tail of the free queue
        in the given order (callers pass a request's blocks tail first, so that its prefix is evicted last); blocks
        that can never be hit go to the head, to be reused before any cached block is evicted (vLLM's order)."""
        reuse_first = []
        for block in ordered_blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of {block}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block
                if block.block_hash is None:
                    reuse_first.append(block)
        for block in reversed(reuse_first):
            self.free_queue.move_to_end(block.block_id, last=False)

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        copies = self.cached.get(block_hash) if self.enable_caching else None
        return next(iter(copies.values())) if copies else None

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Record a full block under its hash (beside any other copy of the same prefix)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        self.cached.setdefault(block_hash, {})[block.block_id] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as vLLM's BlockPool.reset_prefix_cache: only while no block is held (a
        running request's blocks are its KV, and vLLM refuses rather than touch them); False, nothing changed,
        otherwise. Benchmarks call it between runs so that no run is served from an earlier one's prefixes."""
        if self.num_used_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        return True

    def check_invariants(self) -> None:
        """free + used == total; ref counts never negative; free queue holds exactly the zero-ref blocks;
        the hash map points only at blocks that carry that hash."""
        free_ids = set(self.free_queue)
        assert len(free_ids) == len(self.free_queue)
        for b in self.blocks:
            assert b.ref_cnt >= 0, f"negative ref count: {b}"
            assert (b.ref_cnt == 0) == (b.block_id in free_ids), f"free queue out of step with ref count: {b}"
        for h, copies in self.cached.items():
            assert copies, f"empty entry for hash {h}"
            for b in copies.values():
                assert b.block_hash == h, f"cached map entry {h} points at {b}"
        assert self.num_free_blocks + self.num_used_blocks == self.num_blocks
