"""Hugging Face transformers' continuous batching (`transformers.generation.continuous_batching`, the engine behind
`generate_batch` and `transformers serve`) through the SchedulerAdapter surface, model-free on the CPU.

What runs is transformers' own `ContinuousBatchProcessor`, built by its own `ContinuousBatchingManager` for a tiny
random Qwen2 model (one layer, hidden 32; its forward never runs): `prepare_next_batch()` (cancellations, its
`FIFOScheduler.schedule_batch`, the offloading of starved requests by its `OffloadingManager`, CPU restores, the batch
tensors) is our schedule(), and `update_batch()` is our update(). The one thing replaced is the forward pass: the
sampled tokens the caller feeds are written into the processor's `output_ids`, where the model's sampler writes them,
in the order `update_batch` reads them. The paged cache is sized so that a cache sector is one block (one KV head of
16 float32 values: a block of `page_size` tokens is 128 * page_size bytes, a multiple of the 128-byte sector grain).

Knob mapping (our name -> transformers' ContinuousBatchingConfig):
  max_num_batched_tokens -> max_batch_tokens     block_size -> page_size      num_gpu_blocks -> num_blocks
  max_num_seqs -> max_requests_per_batch (a cap on each batch, not on the running set: see `supports` and the
                  summary of a run for what that leaves unchecked)
  enable_prefix_caching -> allow_block_sharing (its prefix sharing: complete blocks are hashed after the forward
                  and a pending request's prompt is matched against them)
  preemption_mode="recompute" -> no CPU pool (a starved request is soft reset: its generated tokens join its prompt
                  and it is prefilled again); "swap" -> cpu_offload_space sized to num_cpu_blocks blocks (a starved
                  request's blocks are copied to the CPU pool, or it is soft reset when they do not fit)
  FIFOScheduler's safety_margin -> 0.0: its default (0.15) holds back new prefills while fewer than 15% of the blocks
                  are free, a knob our suite has no name for; 0 makes admission depend on the blocks alone, as ours.
Not supported (`supports(knobs)` says why): batching other than "continuous", policy="priority" (no request
priorities), chunked prefill off (a prompt larger than the budget left is always split), long_prefill_token_threshold,
priority_preemption, block_size < 4 (its config's bound), async batching (its double IO pairs need a CUDA device's
streams and events), and swap together with prefix caching (see unsupported_reason).

What a step did is read from transformers' own objects, and from three of its calls observed as they happen (each
calls through, changing nothing): the requeue of an offloaded request, and the GPU -> CPU and CPU -> GPU block pairs
it copies. A waiting request that a prefix hit makes active and the offloading puts back within the same step (it
could not get its other blocks) never ran: it is reported as still waiting, not as preempted. Its CPU swap pool is
allocated unpinned where torch has no accelerator to pin for. Where transformers is known to stall or crash (its
bugs), `stalled()` says so and the state machine ends the example there.

Views: running() is the scheduler's active requests, waiting() its waiting queue in its own order; a request soft
reset or offloaded is "preempted" until it runs again. A soft reset request is a new RequestState whose prompt holds
the tokens generated so far: the views count them as outputs again (the prompt length is the one we added), so
num_tokens and num_computed_tokens mean what they mean for every engine. Block ids are the allocator's, less the two
trash sectors in front; a block's ref count is the allocator ledger's (an implicit 1 for a block in one table, the
shared count for a shared one, 0 for a free one or one kept cached for de-duplication, which is reclaimable: counted
free, as vLLM's cached blocks are).
"""

from __future__ import annotations

import logging
import os
import traceback
import warnings
from contextlib import contextmanager

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

try:  # one message when transformers (or its continuous batching) is missing
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.continuous_api import (
        ContinuousBatchingManager,
        ContinuousBatchProcessor,
    )
    from transformers.generation.continuous_batching.requests import RequestState, RequestStatus
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "conformance.adapters.transformers_adapter needs transformers with continuous batching (tested with "
        f"transformers 5.25): {e}"
    ) from e

from conformance.adapters import ADAPTER_KNOB_DEFAULTS, ReqView, StepView

logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)  # its sizing notes are about serving

# the knobs every adapter takes (conformance/adapters/__init__.py), with a context length transformers' cache sizes for
KNOB_DEFAULTS = {**ADAPTER_KNOB_DEFAULTS, "max_model_len": 1 << 20}

HEAD_DIM = 16  # with one float32 KV head: 128 bytes of K and V per token, so one block is one sector
MIN_PAGE_SIZE = 4  # transformers' check_cb_values_bounds
NUM_TRASH_SECTORS = 2  # the cache tensor's never-allocated padding sectors, in front of the data sectors


def unsupported_reason(knobs: dict) -> str | None:
    """Why transformers' continuous batching cannot run this configuration of our knobs, or None if it can."""
    k = {**KNOB_DEFAULTS, **knobs}
    if k["batching"] != "continuous":
        return (
            f"transformers' difference: its continuous batching is the only mode, so batching={k['batching']!r} "
            "has nothing to check there"
        )
    if k["policy"] != "fcfs":
        return (
            f"transformers' difference: requests carry no priority (FIFO or prefill-first), not policy={k['policy']!r}"
        )
    if k["priority_preemption"]:
        return "transformers' difference: requests carry no priority, so priority_preemption=True is unchecked there"
    if not k["enable_chunked_prefill"]:
        return (
            "transformers' difference: a prompt larger than the budget left is always split, so "
            "enable_chunked_prefill=False is unchecked there"
        )
    if k["block_size"] < MIN_PAGE_SIZE:
        return (
            f"transformers' difference: its config refuses page_size < {MIN_PAGE_SIZE}, so block_size="
            f"{k['block_size']} is unchecked there"
        )
    if k["long_prefill_token_threshold"]:
        return "transformers' difference: it has no long_prefill_token_threshold (a chunk takes the budget left)"
    if k["preemption_mode"] == "swap" and k["enable_prefix_caching"]:
        return (
            "the adapter's gap: with prefix sharing, transformers makes a waiting request active on a prefix hit and "
            "may offload it to the CPU in that same step, before it ever ran; the swap checks (the blocks a victim "
            "held = the blocks swapped out, the count it keeps) cannot see blocks taken and given back within one "
            "step, so swap is checked with prefix sharing off"
        )
    if k["async_scheduling"]:
        return (
            "the adapter's gap: transformers' async batching (two IO pairs overlapping the forward) needs a CUDA "
            "device's streams and events; async_scheduling=True is unchecked there on the CPU"
        )
    return None


class TransformersAdapter:
    name = "transformers"
    scheduler_type = "fifo"  # the key of transformers' SCHEDULER_MAPPING (a test may register a broken one)
    # Invariants this scheduler departs from by design (the state machine counts their violations instead of failing;
    # each is shown on a named case in conformance/test_transformers_adapter.py)
    # The knob values it can run at all (supports() gives the reason for the rest): the state machine draws only these
    knob_domain = {
        "block_size": (4, 8, 16),
        "enable_chunked_prefill": (True,),
        "long_prefill_token_threshold": (0,),
        "policy": ("fcfs",),
        "async_scheduling": (False,),
    }
    # behaviours whose named example must fail here (conformance.adapters.expect_known_difference); each is also
    # pinned on its own case in conformance/test_transformers_adapter.py
    known_differences = {
        "eos_before_min_tokens": (
            "transformers' difference: update_and_check_completion ends a request on any of its eos ids, and it has no "
            "min_tokens of its own (min_new_tokens is a logits processor's, which masks EOS in its sampler)"
        ),
        "blocks_of_a_finishing_step_cached": (
            "transformers' bug: the blocks a request completes in the step that finishes it are never hashed for "
            "prefix sharing (update_batch marks it FINISHED before mark_complete_blocks, which skips a finished "
            "request, against its own comment 'before the request may finish'): a request that ends at its prefill "
            "(max_tokens=1) leaves no prefix to hit"
        ),
        "lru_eviction": (
            "transformers' difference: the blocks kept cached for prefix sharing are reclaimed all at once "
            "(evict_cached_blocks) when a step cannot schedule, not least recently freed first"
        ),
    }
    departures = {
        "admission_order": (
            "transformers' difference: a waiting request that cannot get its blocks is skipped and later ones that "
            "fit are admitted (FIFO without head-of-line blocking); and a prefix hit makes a waiting request active "
            "(its hit blocks taken) as soon as the scheduler looks at it, even when it then gets no budget or block"
        ),
        "decode_first": (
            "transformers' difference: a running request that cannot get its blocks in a step is skipped (starved) "
            "and the scheduler goes on down its candidates, waiting requests included; the blocks kept cached for "
            "prefix sharing are reclaimed only after such a step (all at once), so a short waiting request may be "
            "admitted while a running one waits for blocks"
        ),
        "max_num_seqs": (
            "transformers' difference: max_requests_per_batch caps the requests of one batch, not the running set: "
            "a running request left out of a step (starved, or made active by a prefix hit) does not count, so more "
            "than max_num_seqs requests can hold blocks at once"
        ),
        "no_admission_after_preemption": (
            "transformers' difference: it preempts (offloads) after the step is scheduled, so one step may admit "
            "waiting requests and preempt a running one; vLLM admits nothing in a step that preempted"
        ),
        "preemption_victim": (
            "transformers' difference: it preempts (offloads) the running requests that could not get their blocks "
            "this step, the last of them in its candidate order first, after scheduling the others; vLLM's FCFS "
            "preempts the most recently admitted running request so that an older one gets its block"
        ),
    }

    # invariants the adapter cannot check here, with why (the state machine does not count them as checked)
    unchecked = {
        "cached_tokens": "the adapter's gap: transformers keeps no per-request prefix-cache hit count; none is reported"
    }
    # the case that shows each departure (conformance/test_transformers_adapter.py, in the default run too)
    departure_cases = {
        "admission_order": "conformance/test_transformers_adapter.py::test_a_waiting_request_that_does_not_fit_is_skipped",
        "decode_first": "conformance/test_transformers_adapter.py::test_a_running_request_short_of_blocks_lets_a_waiting_one_in",
        "max_num_seqs": "conformance/test_transformers_adapter.py::test_a_running_request_short_of_blocks_lets_a_waiting_one_in",
        "no_admission_after_preemption": "conformance/test_transformers_adapter.py::test_one_step_admits_and_preempts",
        "preemption_victim": "conformance/test_transformers_adapter.py::test_victim_is_the_starved_request",
    }

    @classmethod
    def supports(cls, knobs: dict) -> str | None:
        return unsupported_reason(knobs)

    def __init__(self, eos_token_id: int | None = None, **knobs) -> None:
        unknown = set(knobs) - set(KNOB_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown scheduler option(s): {sorted(unknown)}")
        k = {**KNOB_DEFAULTS, **knobs}
        reason = unsupported_reason(k)
        if reason is not None:
            raise NotImplementedError(reason)
        self.knobs = k
        self.block_size = int(k["block_size"])
        self.num_gpu_blocks = int(k["num_gpu_blocks"])
        swap = k["preemption_mode"] == "swap"
        self.num_cpu_blocks = int(k["num_cpu_blocks"]) if swap else 0
        self.eos_token_id = eos_token_id
        self.bp = _build_processor(k, self.num_cpu_blocks, self.scheduler_type)
        self.sched = self.bp.scheduler
        self.cache = self.bp.cache
        (self.allocator,) = self.cache.cache_allocators.values()
        self._bps = self.allocator.blocks_per_sector
        assert self._bps == 1, f"a cache sector holds {self._bps} blocks, the adapter sizes it to one"
        self._offset = NUM_TRASH_SECTORS * self._bps
        self._prompt_len: dict[str, int] = {}
        self._max_tokens: dict[str, int] = {}
        self._arrival: dict[str, float] = {}
        self._last: dict[str, RequestState] = {}  # the latest state object of every request (soft resets replace it)
        self._preempted: set[str] = set()  # offloaded or soft reset and not running since
        self._num_preemptions: dict[str, int] = {}
        self._finished: dict[str, str] = {}  # request id -> finish_reason
        self._in_flight: list | None = None  # the batch of the last schedule(), until its update()
        self._crashed: str | None = None  # why the last prepare_next_batch() raised, for a known transformers bug
        self._requeued: list[str] = []  # what the observers saw during the last prepare_next_batch()
        self._swap_out: list[tuple[int, int]] = []
        self._swap_in: list[tuple[int, int]] = []
        self._observe()

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(
        self,
        request_id,
        prompt_token_ids,
        *,
        max_tokens,
        priority=0,
        arrival_time=0.0,
        min_tokens=0,
        ignore_eos=False,
        stop_token_ids=None,
    ) -> None:
        if request_id in self._prompt_len:
            raise ValueError(f"request_id {request_id!r} is already in use")
        # transformers ends a request on any of its eos ids: the stop token ids are that for it. min_tokens is its
        # sampler's (a logits processor masks EOS until then), as the caller's fake sampler does.
        eos = [] if ignore_eos or self.eos_token_id is None else [self.eos_token_id]
        eos = eos + [t for t in stop_token_ids or [] if t not in eos]
        state = RequestState(
            request_id=request_id,
            initial_tokens=list(prompt_token_ids),
            max_new_tokens=max_tokens,
            eos_token_id=eos or None,
        )
        self._prompt_len[request_id] = len(prompt_token_ids)
        self._max_tokens[request_id] = max_tokens
        self._arrival[request_id] = arrival_time
        self._num_preemptions[request_id] = 0
        self._last[request_id] = state
        self._add_waiting(state)

    def abort(self, request_ids):
        # what prepare_next_batch() does first with a cancellation: free its device and CPU blocks
        for rid in request_ids:
            self.sched.set_request_cancellation(rid)
        for state in self.sched.clear_cancelled_requests():
            self.bp.offloading_manager.free_request_cpu_cache(state)
        for rid in request_ids:
            if rid not in self._finished:
                self._finished[rid] = "abort"
                self._preempted.discard(rid)

    # ---- steps ----------------------------------------------------------------------------------------------
    def schedule(self) -> StepView:
        if self._in_flight is not None:
            raise RuntimeError("schedule() called before the previous step's update() (no async batching here)")
        if self._crashed is not None:
            raise RuntimeError(f"the engine crashed in an earlier step: {self._crashed}")
        waiting_before = set(self.sched.waiting_requests)
        active_before = set(self.sched.active_requests)
        self._requeued, self._swap_out, self._swap_in = [], [], []
        try:
            has_batch = self.bp.prepare_next_batch()
        except ValueError as e:
            if not any(frame.name == "_reserve_cpu_blocks" for frame in traceback.extract_tb(e.__traceback__)):
                raise
            # transformers' generation loop would fail every request here (a critical error); the state is half
            # offloaded, so the caller must not read it as a step: stalled() says so
            self._crashed = (
                "transformers' bug: the CPU swap pool counts its free blocks, then turns them back into free sectors "
                "(try_to_free_sectors) and allocates as many sectors as it found missing, so a victim with more "
                "blocks than the pool holds, offloaded while some pool blocks are free, raises ValueError ('Cannot "
                f"pop N leaves') in the generation loop instead of falling back to a soft reset: {e}"
            )
            return StepView(num_scheduled_tokens={}, preempted_req_ids=[], new_req_ids=[])
        batch = list(self.bp.inputs_and_outputs.requests_in_batch) if has_batch else []
        self._in_flight = batch
        for f in batch:
            self._last[f.state.request_id] = f.state
            self._preempted.discard(f.state.request_id)
        # preempted in this step: running before it and put back into the waiting queue by the offloading (oldest
        # first, the reverse of the order it offloaded them in). A waiting request made active by a prefix hit and
        # put back within this same step never ran: it stays a waiting request (its hit blocks freed, uncached)
        preempted = [rid for rid in dict.fromkeys(reversed(self._requeued)) if rid in active_before]
        for rid in preempted:
            self._preempted.add(rid)
            self._num_preemptions[rid] += 1
            self._last[rid] = self.sched.waiting_requests[rid]
        scheduled = {f.state.request_id: f.query_length for f in batch}
        return StepView(
            num_scheduled_tokens=scheduled,
            preempted_req_ids=preempted,
            new_req_ids=[rid for rid in scheduled if rid in waiting_before],
            blocks_to_swap_out=[(d - self._offset, h) for d, h in self._swap_out],
            blocks_to_swap_in=[(h, d - self._offset) for h, d in self._swap_in],
        )

    # Observers of three calls inside prepare_next_batch (each calls through, changing nothing): the requeue of an
    # offloaded request, and the GPU -> CPU and CPU -> GPU block pairs transformers copies.
    def _observe(self) -> None:
        sched, om = self.sched, self.bp.offloading_manager
        add_waiting, offload_to_cpu, restore = (
            sched.add_waiting_request,
            om._offload_to_cpu,
            om.restore_scheduled_requests,
        )
        self._add_waiting = add_waiting  # our own add_request goes straight through

        def add_waiting_request(state: RequestState) -> None:
            self._requeued.append(state.request_id)
            add_waiting(state)

        def _offload_to_cpu(victims, victim_block_tables):
            done = offload_to_cpu(victims, victim_block_tables)
            for state in victims:
                if state.request_id in done:
                    (gpu,) = victim_block_tables[state.request_id].values()
                    (cpu,) = om._request_id_to_cpu_blocks[state.request_id].values()
                    self._swap_out += zip(gpu, cpu)
            return done

        def restore_scheduled_requests(requests_in_batch) -> None:
            for f in requests_in_batch:
                if f.state.is_cpu_offloaded:
                    (cpu,) = om._request_id_to_cpu_blocks[f.state.request_id].values()
                    gpu = self.allocator.block_table.get(f.state.request_id, [])
                    self._swap_in += zip(cpu, gpu)  # positional, as transformers pairs them (the shorter list)
            restore(requests_in_batch)

        sched.add_waiting_request = add_waiting_request
        om._offload_to_cpu = _offload_to_cpu
        om.restore_scheduled_requests = restore_scheduled_requests

    def update(self, sampled):
        """Write the sampled tokens where the model's sampler writes them (one per request that samples, in batch
        order) and run transformers' update_batch()."""
        batch, self._in_flight = self._in_flight, None
        if not batch:
            return []
        rows = []
        for f in batch:
            rid = f.state.request_id
            tokens = sampled.get(rid, [])
            if f.has_new_token != bool(tokens):
                raise AssertionError(
                    f"{rid}: the caller sampled {tokens} but transformers' batch "
                    f"{'samples' if f.has_new_token else 'does not sample'} a token for it"
                )
            rows += [int(t) for t in tokens]
        if rows:
            self.bp.inputs_and_outputs.output_ids[0, : len(rows)] = torch.tensor(rows)
        self.bp.update_batch()
        finished = []
        for f in batch:
            rid, state = f.state.request_id, f.state
            if state.status == RequestStatus.FINISHED and rid not in self._finished:
                last = state.generated_tokens[-1] if state.generated_tokens else None
                self._finished[rid] = "stop" if last in state._eos_token_ids else "length"
                finished.append(rid)
        return finished

    def stalled(self) -> str | None:
        """After an offload, transformers' scheduler admits no waiting request until a request finishes in
        update_batch (block_new_requests); with no request left running (the others aborted), none ever does. And a
        step that crashed in the CPU swap pool leaves nothing to go on with."""
        if self._crashed is not None:
            return self._crashed
        s = self.sched
        if s.block_new_requests and not s.active_requests and s.waiting_requests:
            return (
                "transformers' bug: after an offload the scheduler admits nothing (block_new_requests) until a request "
                "finishes in update_batch; when the running requests are cancelled instead, nothing ever finishes, "
                "and the offloaded and every later request wait for ever"
            )
        return None

    # ---- views ----------------------------------------------------------------------------------------------
    def _view(self, state: RequestState) -> ReqView:
        rid = state.request_id
        n_prompt = self._prompt_len[rid]
        finished = rid in self._finished
        if rid in self.sched.active_requests:
            status = "running"
        elif rid in self.sched.waiting_requests:
            status = "preempted" if rid in self._preempted else "waiting"
        else:
            status = "finished"
        return ReqView(
            request_id=rid,
            status=status,
            num_prompt_tokens=n_prompt,
            # a soft reset request's prompt holds the tokens generated before it (create_equivalent_initial_request)
            num_output_tokens=len(state.initial_tokens) - n_prompt + len(state.generated_tokens),
            num_computed_tokens=0 if finished else state.position_offset,
            priority=0,
            arrival_time=self._arrival[rid],
            block_ids=[] if finished else [b - self._offset for b in self.allocator.block_table.get(rid, [])],
            num_preemptions=self._num_preemptions[rid],
            finish_reason=self._finished.get(rid),
            host_block_ids=self._host_blocks(rid),
            max_tokens=self._max_tokens[rid],
        )

    def _host_blocks(self, rid: str) -> list[int]:
        held = self.bp.offloading_manager._request_id_to_cpu_blocks.get(rid)
        return list(next(iter(held.values()))) if held else []

    def running(self):
        return [self._view(s) for s in self.sched.active_requests.values()]

    def waiting(self):
        return [self._view(self.sched.waiting_requests[rid]) for rid in self.sched.waiting_requests_order]

    def request(self, request_id):
        state = (
            self.sched.active_requests.get(request_id)
            or self.sched.waiting_requests.get(request_id)
            or self._last[request_id]
        )
        return self._view(state)

    def _ref_counts(self) -> dict[int, int]:
        """Ref counts by the allocator's ids (trash sectors included in the id space, never counted)."""
        ledger = self.allocator.ledger
        refs = dict.fromkeys(range(self._offset, self._offset + self.num_gpu_blocks), 0)
        for table in self.allocator.block_table.values():
            for b in table:
                refs[b] = ledger.shared_ref_counts.get(b, 1)
        return refs

    def num_free_blocks(self):
        pool, index = self.cache.pool, self.allocator.index
        free = pool.num_free_sectors * self._bps + pool.count_free_blocks(index)
        return free + len(self.allocator.ledger.cached_blocks)  # reclaimable on demand (evict_cached_blocks)

    def block_ref_counts(self):
        return {b - self._offset: r for b, r in self._ref_counts().items()}

    def host_block_ref_counts(self):
        held = {
            b
            for blocks in self.bp.offloading_manager._request_id_to_cpu_blocks.values()
            for t in blocks.values()
            for b in t
        }
        return {b: int(b in held) for b in range(self.num_cpu_blocks)}

    def check_invariants(self):
        """transformers has no self-check; assert what its ledger and pool rely on."""
        ledger = self.allocator.ledger
        holders: dict[int, int] = {}
        for table in self.allocator.block_table.values():
            for b in table:
                holders[b] = holders.get(b, 0) + 1
        for b, n in holders.items():
            assert ledger.shared_ref_counts.get(b, 1) == n, (
                f"block {b}: ledger says {ledger.shared_ref_counts.get(b, 1)}, {n} tables"
            )
        assert not set(holders) & set(ledger.cached_blocks), "a block both held and kept cached"
        used = len(holders)
        assert used + self.num_free_blocks() == self.num_gpu_blocks, (
            f"{used} blocks held + {self.num_free_blocks()} free != {self.num_gpu_blocks}"
        )


@contextmanager
def _unpinned_host_memory():
    """The OffloadingManager allocates its CPU swap pool with pin_memory=True, which torch refuses where there is no
    accelerator. Pinning only speeds host <-> device copies, and here both sides are host memory: while the processor
    is built, torch.empty ignores pin_memory on such a machine. Nothing else changes."""
    if torch.cuda.is_available():
        yield
        return
    empty = torch.empty

    def empty_unpinned(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return empty(*args, **kwargs)

    torch.empty = empty_unpinned
    try:
        yield
    finally:
        torch.empty = empty


def _build_processor(k: dict, num_cpu_blocks: int, scheduler_type: str) -> ContinuousBatchProcessor:
    """transformers' own manager and batch processor for a tiny random Qwen2 model on the CPU (never run)."""
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        max_position_embeddings=int(k["max_model_len"]),
    )
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(config).eval()
    block_bytes = 2 * HEAD_DIM * 4 * int(k["block_size"])  # K and V, one head, float32, per token, times the tokens
    cb = ContinuousBatchingConfig(
        page_size=int(k["block_size"]),
        num_blocks=int(k["num_gpu_blocks"]),
        max_batch_tokens=int(k["max_num_batched_tokens"]),
        max_requests_per_batch=int(k["max_num_seqs"]),
        allow_block_sharing=bool(k["enable_prefix_caching"]),
        use_async_batching=False,
        use_cuda_graph=False,
        scheduler_type=scheduler_type,
        safety_margin=0.0,
        cpu_offload_space=num_cpu_blocks * block_bytes / 1024**3,
    )
    generation_config = GenerationConfig(do_sample=False, max_new_tokens=k["max_model_len"])
    with warnings.catch_warnings(), _unpinned_host_memory():
        warnings.simplefilter("ignore")
        manager = ContinuousBatchingManager(model, generation_config, cb)
        processor = manager._create_batch_processor()
    if processor.cache.num_blocks != int(k["num_gpu_blocks"]) or processor.max_batch_tokens != cb.max_batch_tokens:
        raise AssertionError(
            f"transformers sized the cache to {processor.cache.num_blocks} blocks / {processor.max_batch_tokens} "
            f"tokens per batch, asked for {k['num_gpu_blocks']} / {cb.max_batch_tokens}"
        )
    return processor
