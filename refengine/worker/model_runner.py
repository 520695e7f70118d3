"""ModelRunner: execute_model(SchedulerOutput) -> ModelRunnerOutput, one forward over the paged KV cache + sampling.

It owns the device KV cache (one (k_cache, v_cache) pair per layer), the host cache that swap preemption copies
into, the persistent InputBatch and its own record of every request it has met (CachedRequestState, refengine.worker.runner_states); it never
sees the scheduler's Request objects or the KV manager, only the SchedulerOutput (refengine.scheduler.scheduler_output).

Per step, on the host (numpy, nothing waits on the device): forget finished requests, park preempted ones, enqueue
the swap copies (out before in: a block freed by a swap-out may be the target of a swap-in in the same step),
write the rows that changed, pad the step to its CUDA-graph bucket (refengine/worker/cuda_graphs.py: decode-only and
mixed steps alike), lay the step's inputs end to end in one staging buffer (pinned on CUDA) and copy it to the
device once (non_blocking). On the device: the forward (replayed from the bucket's CUDA graph, or eager past the
largest bucket), the logits of the rows that sample, the sampler. Then at most one device -> host wait per step:
the sampled token ids (`_to_host`); a swap-out's copy to the host lands in the host cache after it (no wait of
its own), or, in a step that samples nothing, is that step's one wait.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numpy as np
import torch

from refengine.layers.attention import AttentionMetadata
from refengine.limits import cdiv
from refengine.models.decoder import CausalLM
from refengine.models.model_config import ModelConfig
from refengine.sample.sampler import SamplingMetadata, sample
from refengine.scheduler.scheduler_output import ModelRunnerOutput, SchedulerOutput
from refengine.worker.cuda_graphs import CudaGraphRunner, GraphBuckets, pad_step_inputs
from refengine.worker.input_batch import InputBatch, StagingBuffer
from refengine.worker.runner_states import CachedRequestState, update_states
from refengine.worker.sampling_inputs import sampling_arrays, sampling_metadata
from refengine.worker.step_isolation import sample_rows_apart

# (logits [n, vocab], metadata, the engine's generator) -> sampled token ids [n] on the device
Sampler = Callable[[torch.Tensor, SamplingMetadata, "torch.Generator | None"], torch.Tensor]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | None, pin_memory: bool) -> torch.Tensor:
    """torch.zeros, but in ordinary host memory from calloc (numpy's zeros): the OS hands out zeroed pages on first
    touch, so a 1 GiB CPU cache costs nothing until blocks are written, where torch.zeros writes every byte up front
    (most of a small engine's start: docs/measurements.md). Device and pinned memory are torch's."""
    if pin_memory or (device is not None and device.type != "cpu"):
        return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin_memory)
    nbytes = math.prod(shape) * dtype.itemsize
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)


def _zero_caches(
    num_layers: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | None, pin_memory: bool = False
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (k_cache, v_cache) pair per layer. Zeros, not empty: attention reads whole blocks and masks the tail,
    and 0 * NaN garbage would be NaN."""
    return [
        (_zeros(shape, dtype, device, pin_memory), _zeros(shape, dtype, device, pin_memory)) for _ in range(num_layers)
    ]


def _sampled_lists(num_seqs: int, samples: np.ndarray, tokens: list[int]) -> list[list[int]]:
    """Each scheduled request's new tokens: its sampled id, or none (a partial prefill)."""
    if len(tokens) == num_seqs:  # every request samples (a decode step)
        return [[tok] for tok in tokens]
    sampled: list[list[int]] = [[] for _ in range(num_seqs)]
    for i, tok in zip(samples.tolist(), tokens):
        sampled[i] = [tok]
    return sampled


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        model_config: ModelConfig,
        *,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
        max_num_batched_tokens: int,
        enforce_eager: bool,
        sampler: Sampler = sample,
    ) -> None:
        self.model = model
        self.sampler = sampler
        self.block_size = block_size
        self.device = device
        self.vocab_size = model_config.vocab_size
        mc = model_config
        shape = (num_gpu_blocks, block_size, mc.num_key_value_heads, mc.head_dim)
        self.kv_caches = _zero_caches(mc.num_hidden_layers, shape, dtype, device)
        pin = device.type == "cuda"
        host_shape = (num_cpu_blocks, *shape[1:])
        self.host_caches = _zero_caches(mc.num_hidden_layers, host_shape, dtype, None, pin) if num_cpu_blocks else []
        max_blocks = cdiv(max_model_len, block_size)
        self.input_batch = InputBatch(max_num_seqs, max_model_len, max_blocks, mc.vocab_size, device)
        self.requests: dict[str, CachedRequestState] = {}
        self.staging = StagingBuffer(device)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        # CUDA graphs for decode-only and mixed steps: CUDA only, not with enforce_eager, and of refengine's own model
        # only (a stand-in without an attention backend, such as bench-step's stub, runs eagerly)
        backend = getattr(model, "attn_backend", None)
        use_graphs = device.type == "cuda" and not enforce_eager and backend is not None and not backend.takes_host_lens
        self.graph_buckets = GraphBuckets.of(max_num_seqs, max_num_batched_tokens)
        self.cuda_graphs = (
            CudaGraphRunner(model, self.kv_caches, self.graph_buckets, max_blocks, device) if use_graphs else None
        )
        if self.cuda_graphs is not None:
            self.cuda_graphs.capture()
        # eager runs padded to these buckets, as graphs would replay them (CPU tests of the padding; None: no padding)
        self.pad_buckets: GraphBuckets | None = None
        self.failed_rows: dict[str, BaseException] = {}  # this step's requests whose own values failed them
        self.num_host_syncs = 0  # device -> host waits made by execute_model (at most one per step)
        # a swap-out's copies to the host still in flight: (done, host block ids, per layer the (k, v) copies)
        self._swap_out_pending: tuple[torch.cuda.Event | None, torch.Tensor, list[tuple[torch.Tensor, ...]]] | None
        self._swap_out_pending = None
        # (refengine's own model takes an output buffer; a stand-in's compute_logits may not)
        self._logits_into_buffer = isinstance(model, CausalLM) and device.type == "cpu"
        self._logits_buf: torch.Tensor | None = None
        self._arange = np.arange(max_num_seqs + 1, dtype=np.int64)  # a decode step's query_start_loc (read-only)
        self._arange.flags.writeable = False

    # ---- state ----------------------------------------------------------------------------------------------
    def _index(self, ids: list[int]) -> torch.Tensor:
        """Block ids as an int64 tensor on the device, copied without waiting (pinned on CUDA)."""
        host = torch.tensor(ids, dtype=torch.long, pin_memory=self.device.type == "cuda")
        return host.to(self.device, non_blocking=True)

    def _swap_out(self, plan: list[tuple[int, int]]) -> None:
        """Enqueue the copies of device blocks to the host: gathered on the device, copied into pinned host memory
        without waiting; `_finish_swap_out` writes them into the host cache once they have landed."""
        if not plan:
            return
        src = self._index([s for s, _ in plan])
        dst = torch.tensor([d for _, d in plan], dtype=torch.long)
        pin = self.device.type == "cuda"
        copies = []
        for k, v in self.kv_caches:
            pair = []
            for cache in (k, v):
                host = torch.empty((len(plan), *cache.shape[1:]), dtype=cache.dtype, pin_memory=pin)
                pair.append(host.copy_(cache.index_select(0, src), non_blocking=True))
            copies.append(tuple(pair))
        done = torch.cuda.Event() if pin else None  # type: ignore[no-untyped-call]  # torch leaves Event() unannotated
        if done is not None:
            done.record()
        self._swap_out_pending = (done, dst, copies)

    def _finish_swap_out(self, after_wait: bool) -> None:
        """Write a swap-out's copies into the host cache once they have landed: `after_wait`, the step has waited
        for its sampled tokens, enqueued after the copies; otherwise waiting for them is the step's one wait."""
        if self._swap_out_pending is None:
            return
        done, dst, copies = self._swap_out_pending
        self._swap_out_pending = None
        if not after_wait:
            self.num_host_syncs += 1
            if done is not None:
                done.synchronize()
        for (hk, hv), (k, v) in zip(self.host_caches, copies):
            hk[dst] = k
            hv[dst] = v

    def _swap_in(self, plan: list[tuple[int, int]]) -> None:
        """Enqueue the copies of host blocks to the device (gathered into pinned memory on CUDA: no wait)."""
        if not plan:
            return
        src = torch.tensor([s for s, _ in plan], dtype=torch.long)
        dst = self._index([d for _, d in plan])
        pin = self.device.type == "cuda"
        for (k, v), (hk, hv) in zip(self.kv_caches, self.host_caches):
            for cache, host in ((k, hk), (v, hv)):
                staged = torch.empty((len(plan), *host.shape[1:]), dtype=host.dtype, pin_memory=pin)
                torch.index_select(host, 0, src, out=staged)
                cache.index_copy_(0, dst, staged.to(cache.device, non_blocking=True))

    # ---- one step -------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """One step's forward and sampling (refengine/worker/step_isolation.py: a request whose values fail its row or the
        batched sampler is reported in `failed`, without a token, and the others keep theirs)."""
        self._finish_swap_out(after_wait=False)  # (none pending, unless the last step failed before its tokens)
        self._swap_out(out.blocks_to_swap_out)
        self._swap_in(out.blocks_to_swap_in)
        self.failed_rows = {}
        update_states(self.input_batch, self.requests, self.failed_rows, out)
        req_ids = list(out.num_scheduled_tokens)
        if not req_ids:
            self._finish_swap_out(after_wait=False)
            return ModelRunnerOutput()
        batch, bs = self.input_batch, self.block_size
        num_seqs = len(req_ids)
        rows = batch.rows_of(req_ids)  # [S]
        num_tokens = out.total_num_scheduled_tokens
        positions, token_rows, ends, qsl, max_query_len = self._token_layout(out, rows)
        batch.num_computed_tokens[rows] = ends
        input_ids = batch.token_ids[token_rows, positions]  # [T]
        slot_mapping = batch.block_table[token_rows, positions // bs].astype(np.int64) * bs + positions % bs  # [T]
        max_seq_len = int(ends.max())
        # sample where the request's last known token is computed this step (a partial prefill samples nothing)
        samples = np.flatnonzero(ends >= batch.num_tokens[rows])  # [n] indices into the scheduled requests
        sample_rows = rows[samples]
        shape = self._padded_shape(num_tokens, num_seqs)  # (tokens, sequences) of the graph's bucket, or None
        width = batch.block_table.shape[1] if shape is not None else cdiv(max_seq_len, bs)  # (graphs: every block)
        table = batch.block_table[rows, :width]
        step: tuple[np.ndarray, ...] = (input_ids, positions, slot_mapping, qsl, ends, table)
        if shape is not None:  # padded as a captured graph's bucket; the real rows come first
            step = pad_step_inputs(input_ids, positions, slot_mapping, qsl, ends, table, *shape)
        sampling, extra = sampling_arrays(self.input_batch, sample_rows)
        # the attention metadata crosses as int32 (the kernels' dtype; the block table is int32 already)
        i32 = np.int32
        views = self.staging.pack(
            *step[:3], step[3].astype(i32), step[4].astype(i32), step[5].ravel(), qsl[1:][samples] - 1, *extra
        )
        ids_d, pos_d, slot_d, qsl_d, lens_d, table_d, logits_idx_d = views[:7]
        table_d = table_d.view(-1, width)
        graphs = self.cuda_graphs if shape is not None else None
        graphed = graphs is not None
        if graphs is not None:  # [padded tokens, hidden], replayed on the graph's static inputs
            hidden = graphs.run(ids_d, pos_d, slot_d, qsl_d, lens_d, table_d)
        else:
            # (int32 metadata, as the kernels were warmed up with; the host lists come from numpy: no sync)
            meta = AttentionMetadata(
                slot_d, qsl_d, lens_d, table_d, max_query_len, max_seq_len, step[3].tolist(), step[4].tolist()
            )
            hidden = self.model(ids_d, pos_d, self.kv_caches, meta)  # [T, hidden]
        index = dict(zip(req_ids, range(num_seqs)))
        if not len(samples):
            self._finish_swap_out(after_wait=False)
            return ModelRunnerOutput(req_ids, index, [[] for _ in req_ids], failed=self.failed_rows, cuda_graph=graphed)
        # the hidden rows that sample: all of them, in order, in a decode step (no gather needed)
        sample_hidden = hidden[:num_seqs] if len(samples) == num_tokens == num_seqs else hidden[logits_idx_d]
        tokens = self._sample(sample_hidden, sampling_metadata(batch, sampling, views[7:]), req_ids, samples)
        self._finish_swap_out(after_wait=True)
        batch.append_tokens(sample_rows, tokens)
        sampled = _sampled_lists(num_seqs, samples, tokens)
        for rid in self.failed_rows.keys() & index.keys():  # (no token for a request that failed)
            sampled[index[rid]] = []
        return ModelRunnerOutput(req_ids, index, sampled, failed=self.failed_rows, cuda_graph=graphed)

    def _token_layout(
        self, out: SchedulerOutput, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """The step's flat token layout from the rows' computed counts: (positions [T], the row of each token [T],
        seq_lens [S] including this step's tokens, query_start_loc [S + 1], the longest query)."""
        num_seqs, num_tokens = len(rows), out.total_num_scheduled_tokens
        starts = self.input_batch.num_computed_tokens[rows]  # [S] tokens already in the cache
        if num_tokens == num_seqs:  # decode-only: one token per sequence
            ends = starts + 1  # [S] seq_lens: context including this step's tokens
            return starts, rows, ends, self._arange[: num_seqs + 1], 1
        ns = np.fromiter(out.num_scheduled_tokens.values(), dtype=np.int64, count=num_seqs)  # [S]
        qsl = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(ns, out=qsl[1:])
        seq_idx = np.repeat(np.arange(num_seqs), ns)  # [T]
        positions = starts[seq_idx] + np.arange(num_tokens) - qsl[seq_idx]  # [T]
        return positions, rows[seq_idx], starts + ns, qsl, int(ns.max())

    def _sample(self, hidden: torch.Tensor, md: SamplingMetadata, req_ids: list[str], samples: np.ndarray) -> list[int]:
        """The sampled ids of the rows of `hidden`, with the step's one device -> host transfer; a request whose
        values fail the batched sampler lands in failed_rows (refengine/worker/step_isolation.py)."""
        logits = self._compute_logits(hidden)  # [n, vocab] float32
        try:
            return self._to_host(self.sampler(logits, md, self.generator))
        except Exception:  # noqa: BLE001 (one request's values: find it, keep the others' tokens)
            logits = self._compute_logits(hidden)
            tokens, bad = sample_rows_apart(self.sampler, logits, md, self.generator)
            self.failed_rows.update({req_ids[samples[i]]: exc for i, exc in bad.items()})
            return tokens

    def _padded_shape(self, num_tokens: int, num_seqs: int) -> tuple[int, int] | None:
        """The (num_tokens, num_seqs) bucket this step is padded to: its CUDA graph's, or pad_buckets' when eager
        runs padded; None: run as it is."""
        if self.cuda_graphs is not None:
            return self.cuda_graphs.lookup(num_tokens, num_seqs)
        if self.pad_buckets is not None:
            return self.pad_buckets.shape_of(num_tokens, num_seqs)
        return None

    def _compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of the rows that sample, on the CPU into one buffer reused by every step (grown to the most
        rows seen): the sampler works on them in place and nothing keeps them past the step."""
        # (looked up per call: bench-step shadows the method on the instance while it times a step)
        compute = cast("Callable[..., torch.Tensor]", self.model.compute_logits)
        if not self._logits_into_buffer:
            return compute(hidden)
        n = hidden.shape[0]
        if self._logits_buf is None or self._logits_buf.shape[0] < n:
            self._logits_buf = torch.empty(n, self.vocab_size, dtype=torch.float32, device=self.device)
        return compute(hidden, out=self._logits_buf[:n])

    def _to_host(self, token_ids: torch.Tensor) -> list[int]:
        self.num_host_syncs += 1
        return token_ids.tolist()
