"""Invariants of the KV blocks at rest: accounting, blocks per request, prefix sharing and host (swap) blocks."""

from __future__ import annotations

from collections.abc import Iterable

from conformance.invariants._base import Snapshot, _fail, cdiv


def check_block_accounting(cfg: dict, snap: Snapshot, num_gpu_blocks: int) -> None:
    """free + used = total; ref counts never negative; each block's ref count == the number of running requests'
    tables holding it (waiting requests hold none)."""
    refs = snap.ref_counts
    if len(refs) != num_gpu_blocks:
        _fail("block_accounting", f"{len(refs)} blocks reported, {num_gpu_blocks} configured", cfg=cfg)
    neg = {b: r for b, r in refs.items() if r < 0}
    if neg:
        _fail("block_accounting", f"negative ref counts {neg}", cfg=cfg, snaps=[("state", snap)])
    num_free = sum(1 for r in refs.values() if r == 0)
    if snap.free_blocks != num_free:
        _fail(
            "block_accounting",
            f"num_free_blocks {snap.free_blocks} != {num_free} blocks with ref count 0 "
            f"(used {num_gpu_blocks - num_free}, total {num_gpu_blocks})",
            cfg=cfg,
            snaps=[("state", snap)],
        )
    holders: dict[int, int] = {}
    for v in snap.running + snap.waiting:
        for b in v.block_ids:
            holders[b] = holders.get(b, 0) + 1
    bad = {b: (r, holders.get(b, 0)) for b, r in refs.items() if r != holders.get(b, 0)}
    if bad:
        _fail(
            "block_accounting",
            f"block: (ref count, tables holding it) disagree: {bad}",
            cfg=cfg,
            snaps=[("state", snap)],
        )


def check_blocks_per_request(cfg: dict, snap: Snapshot) -> None:
    """A running request holds exactly ceil(num_computed / block_size) blocks in continuous mode (at least that
    many in the modes that reserve at admission); a waiting one holds no device blocks."""
    bs = cfg["block_size"]
    for v in snap.running:
        need, held = cdiv(v.num_computed_tokens, bs), len(v.block_ids)
        ok = held == need if cfg["batching"] == "continuous" else held >= need
        if not ok:
            _fail(
                "blocks_per_request",
                f"{v.request_id} holds {held} blocks, its {v.num_computed_tokens} computed tokens need {need}",
                cfg=cfg,
                snaps=[("state", snap)],
            )
    for v in snap.waiting:
        if v.block_ids:
            _fail(
                "blocks_per_request",
                f"waiting {v.request_id} holds device blocks {v.block_ids}",
                cfg=cfg,
                snaps=[("state", snap)],
            )


def check_block_sharing(cfg: dict, snap: Snapshot, tokens: dict[str, list[int]]) -> None:
    """No block is in two tables (or twice in one) unless prefix caching is on and it is, in every table, the same
    full block of an identical prefix: same index i, same token ids up to (i + 1) * block_size, all computed."""
    bs = cfg["block_size"]
    where: dict[int, list[tuple[str, int]]] = {}
    for v in snap.running:
        for i, b in enumerate(v.block_ids):
            where.setdefault(b, []).append((v.request_id, i))
    for b, holders in where.items():
        if len(holders) == 1:
            continue
        rids = [r for r, _ in holders]
        if not cfg["enable_prefix_caching"] or len(set(rids)) != len(rids):
            _fail(
                "block_sharing", f"block {b} held by {holders} without prefix caching", cfg=cfg, snaps=[("state", snap)]
            )
        idx = {i for _, i in holders}
        end = (holders[0][1] + 1) * bs
        prefixes = {tuple(tokens[r][:end]) for r in rids}
        short = [r for r in rids if snap.by_id[r].num_computed_tokens < end]
        if len(idx) != 1 or len(prefixes) != 1 or short:
            _fail(
                "block_sharing",
                f"block {b} shared by {holders}, but not one full block of an identical prefix "
                f"(distinct prefixes: {len(prefixes)}, not yet computed by: {short})",
                cfg=cfg,
                snaps=[("state", snap)],
            )


def check_host_blocks(cfg: dict, snap: Snapshot, in_flight: Iterable[int] = ()) -> None:
    """Host pool: ref counts 0/1; the used host blocks are exactly those held by swapped-out (waiting) requests,
    plus `in_flight` for an adapter that frees a swap-in's source blocks only after the copy (refengine frees them
    as schedule() returns, so its suites pass none); running requests hold none. So the pool is empty when idle."""
    if snap.host_ref_counts is None:
        return
    used = {b for b, r in snap.host_ref_counts.items() if r > 0}
    if any(r not in (0, 1) for r in snap.host_ref_counts.values()):
        _fail("host_blocks", f"host ref counts {snap.host_ref_counts}", cfg=cfg, snaps=[("state", snap)])
    held: list[int] = [b for v in snap.waiting for b in v.host_block_ids]
    if any(v.host_block_ids for v in snap.running):
        _fail("host_blocks", "a running request still holds host blocks", cfg=cfg, snaps=[("state", snap)])
    expected = set(held) | set(in_flight)
    if len(held) != len(set(held)) or used != expected:
        _fail(
            "host_blocks",
            f"used host blocks {sorted(used)} != held by swapped requests {sorted(held)} + "
            f"in-flight swap-in sources {sorted(set(in_flight))}",
            cfg=cfg,
            snaps=[("state", snap)],
        )
