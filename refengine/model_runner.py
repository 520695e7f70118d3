"""ModelRunner: turns a SchedulerOutput into one forward over the paged KV cache and samples.

It owns the device KV cache (one (k_cache, v_cache) pair per layer), the host cache that swap preemption copies
into, and the persistent InputBatch. Per step: free rows of requests that left, do the swap copies (out before
in: a block freed by a swap-out may be the target of a swap-in in the same step), write only the rows that
changed, build the flat inputs + AttentionMetadata, run the model, sample where a request's last known token was
computed.
"""
from __future__ import annotations

import torch

from refengine.attention import AttentionMetadata
from refengine.input_batch import InputBatch
from refengine.kv_cache_manager import KVCacheManager, cdiv
from refengine.sampler import sample
from refengine.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        model_config,
        *,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device
        mc = model_config
        shape = (num_gpu_blocks, block_size, mc.num_key_value_heads, mc.head_dim)
        # zeros, not empty: attention reads whole blocks and masks the tail, and 0 * NaN garbage would be NaN
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(mc.num_hidden_layers)
        ]
        host_shape = (num_cpu_blocks, *shape[1:])
        pin = device.type == "cuda"
        self.host_caches = [
            (torch.zeros(host_shape, dtype=dtype, pin_memory=pin), torch.zeros(host_shape, dtype=dtype, pin_memory=pin))
            for _ in range(mc.num_hidden_layers)
        ] if num_cpu_blocks else []
        self.input_batch = InputBatch(max_num_seqs, max_model_len, cdiv(max_model_len, block_size))
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def _swap(self, plan: list[tuple[int, int]], to_host: bool) -> None:
        if not plan:
            return
        src = torch.tensor([s for s, _ in plan], dtype=torch.long)
        dst = torch.tensor([d for _, d in plan], dtype=torch.long)
        for (k, v), (hk, hv) in zip(self.kv_caches, self.host_caches):
            if to_host:
                hk[dst] = k[src.to(k.device)].cpu()
                hv[dst] = v[src.to(v.device)].cpu()
            else:
                k[dst.to(k.device)] = hk[src].to(k.device, non_blocking=True)
                v[dst.to(v.device)] = hv[src].to(v.device, non_blocking=True)

    def _sync_rows(self, out: SchedulerOutput, kv: KVCacheManager) -> None:
        batch = self.input_batch
        for rid in list(out.finished_req_ids) + out.preempted_req_ids:
            batch.remove(rid)
        admitted = {r.request_id for r in out.scheduled_new_reqs + out.scheduled_resumed_reqs}
        for req in out.scheduled_reqs:
            rid = req.request_id
            if rid in admitted or rid not in batch:  # (static batches admit members before their first chunk)
                batch.add(rid, req.all_token_ids, kv.get_block_ids(rid))
            else:  # a running request: only the blocks it gained this step
                blocks = kv.req_to_blocks[rid]
                have = batch.blocks_held(rid)
                if len(blocks) > have:
                    batch.append_blocks(rid, [b.block_id for b in blocks[have:]])

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput, kv: KVCacheManager) -> dict[str, list[int]]:
        self._swap(out.blocks_to_swap_out, to_host=True)
        self._swap(out.blocks_to_swap_in, to_host=False)
        self._sync_rows(out, kv)
        if not out.num_scheduled_tokens:
            return {}
        batch, bs = self.input_batch, self.block_size
        reqs = {r.request_id: r for r in out.scheduled_reqs}
        order = [reqs[rid] for rid in out.num_scheduled_tokens]
        ns = torch.tensor([out.num_scheduled_tokens[r.request_id] for r in order])  # [S]
        ends = torch.tensor([r.num_computed_tokens for r in order])  # [S] context incl. this step's tokens
        rows = torch.tensor([batch.row_of[r.request_id] for r in order])  # [S]
        qsl = torch.zeros(len(order) + 1, dtype=torch.int32)
        qsl[1:] = ns.cumsum(0)
        seq_idx = torch.repeat_interleave(torch.arange(len(order)), ns)  # [T]
        positions = (ends - ns)[seq_idx] + torch.arange(int(qsl[-1])) - qsl[:-1].long()[seq_idx]  # [T]
        token_rows = rows[seq_idx]
        input_ids = batch.token_ids[token_rows, positions]  # [T]
        slot_mapping = batch.block_table[token_rows, positions // bs].long() * bs + positions % bs  # [T]
        max_seq_len = int(ends.max())
        block_table = batch.block_table[rows, : cdiv(max_seq_len, bs)]  # [S, max_blocks]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            query_start_loc=qsl.to(dev),
            seq_lens=ends.to(torch.int32).to(dev),
            block_table=block_table.to(dev),
            max_query_len=int(ns.max()),
            max_seq_len=max_seq_len,
        )
        hidden = self.model(input_ids.to(dev), positions.to(dev), self.kv_caches, meta)  # [T, hidden]
        samplers = [i for i, r in enumerate(order) if r.num_computed_tokens == r.num_tokens]
        if not samplers:
            return {}
        last = (qsl[1:] - 1).long()[samplers]
        logits = self.model.compute_logits(hidden[last.to(dev)])  # [n, vocab] float32
        sampling_reqs = [order[i] for i in samplers]
        tokens = sample(logits, sampling_reqs, self.generator)
        result = {}
        for req, tok in zip(sampling_reqs, tokens):
            batch.append_token(req.request_id, tok)
            result[req.request_id] = [tok]
        return result
