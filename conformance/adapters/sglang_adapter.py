"""SGLang's own scheduler (`sglang.srt.managers.scheduler.Scheduler`, pinned to SGLang 0.5.23) through the
SchedulerAdapter surface, model-free on the CPU.

`Scheduler.__init__` loads a model, starts process groups and ZMQ sockets, so the adapter builds the scheduler
object itself (`Scheduler.__new__` and the attributes its per-step code reads) around SGLang's real parts: its
`ReqToTokenPool`, its KV allocator (`TokenToKVPoolAllocator`, or `PagedTokenToKVPoolAllocator` for pages above one
token) over a tiny CPU `MHATokenToKVPool`, its radix prefix cache (`UnifiedRadixCache`, LRU; disabled without prefix
caching), its `SchedulePolicy` and `NewTokenRatioTracker`, and its result processor. Then one of our steps is one
turn of SGLang's `--disable-overlap-schedule` loop (event_loop_normal): schedule() is `get_next_batch_to_run` (which
runs `get_new_batch_prefill` -> `PrefillAdder`, and `update_running_batch` -> `check_decode_mem` / `retract_decode`
when no prefill batch forms), and update() is `process_batch_result` with one token per request where the model's
sampler would put it (`GenerationBatchResult.next_token_ids`). The forward pass is the one thing replaced.

SGLang is not a cbbench dependency: ci/setup_sglang_env.sh builds .venv-sglang (CPU torch, `sglang==0.5.23
--no-deps` and its pure-Python imports). `sgl_kernel` (CUDA kernels) is stubbed as SGLang's own CPU-only unit tests
stub it (`sglang.test.test_utils.maybe_stub_sgl_kernel`): nothing the scheduler runs calls it.

Knob mapping (our name -> SGLang's ServerArgs):
  block_size -> page_size; num_gpu_blocks -> a KV pool of num_gpu_blocks pages (SGLang's slot 0 / page 0 is its
      padding slot, outside the pool: our block b is SGLang's page b + 1)
  max_num_batched_tokens -> chunked_prefill_size and max_prefill_tokens (chunked prefill off: chunked_prefill_size
      -1, max_prefill_tokens alone)
  max_num_seqs -> max_running_requests (and the ReqToTokenPool's rows)
  enable_prefix_caching -> not disable_radix_cache
  batching "continuous" -> enable_mixed_chunk (a prefill step takes the running decodes along); "sequence" -> SGLang's
      default (a step is prefill or decode)
  policy "fcfs" -> schedule_policy "fcfs"; "priority" -> enable_priority_scheduling with
      schedule_low_priority_values_first (lower value more urgent, as ours); priority_preemption -> its priority
      preemption (priority_scheduling_preemption_threshold: PRIORITY_GAP below), off -> disable_priority_preemption
  max_model_len -> context_length
Not supported (`supports(knobs)` says why, sglang_rules.py): static / none batching, swap, long_prefill_token_threshold
and async scheduling (SGLang's overlap loop needs a CUDA stream; the adapter runs lockstep).

Views: running() is what holds KV and runs (the running batch, the last prefill batch before it merges, the chunked
request), waiting() SGLang's waiting queue in its own order. A request's computed tokens are its
`kv.kv_allocated_len` (SGLang allocates a step's KV when it schedules it, as vLLM advances num_computed_tokens); its
blocks are the pages its req_to_token row points to. A page the radix cache holds and no request locks is free
(evictable on demand, as vLLM's cached free blocks). Aborting a running request: SGLang marks it (`abort_request`)
and releases it after its next forward; the adapter runs that release (`release_kv_cache`, `filter_batch`) at once,
so that the abort is done when abort() returns, as the suite requires of every engine.
"""

from __future__ import annotations

import logging
import os
from array import array

from conformance.adapters import ReqView, StepView
from conformance.adapters.sglang_rules import KNOB_DEFAULTS, SGLangRules, unsupported_reason

os.environ.setdefault("SGLANG_LOG_LEVEL", "error")


def _stub_if_missing(*packages: str) -> None:
    """Make `import PACKAGE` (and its submodules) give a module whose every attribute is a MagicMock, for the packages
    that cannot be installed here: what SGLang's CPU-only unit tests do for sgl_kernel (its
    `sglang.test.test_utils.maybe_stub_sgl_kernel`, which imports half of SGLang to get there). A package that imports
    is left alone. Nothing the scheduler runs calls them; they are imported at module level by SGLang's model and
    multimodal code."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import sys

    missing = tuple(p for p in packages if importlib.util.find_spec(p) is None)
    if not missing:
        return

    class _Loader(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            from unittest.mock import MagicMock

            module.__getattr__ = lambda name: MagicMock(name=f"{module.__name__}.{name}")

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname.split(".")[0] in missing:
                return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
            return None

    sys.meta_path.insert(0, _Finder())


try:  # one message when SGLang (or something it imports) is missing
    import sglang  # noqa: F401  (before the stubs: without SGLang, nothing is stubbed and the ImportError says so)

    _stub_if_missing("sgl_kernel", "torchvision")  # the CUDA kernels; torchvision's build needs CUDA
    import torch
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, FINISH_MATCHED_TOKEN, Req
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.sampling.sampling_params import SamplingParams

    from conformance.adapters.sglang_build import build_scheduler
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"conformance.adapters.sglang_adapter needs sglang==0.5.23 (bash ci/setup_sglang_env.sh builds .venv-sglang): {e}"
    ) from e

logging.getLogger("sglang").setLevel(logging.ERROR)


class _Tokenizer:
    """What SamplingParams.normalize asks of a tokenizer for token-id stops and min_new_tokens: its EOS id."""

    def __init__(self, eos_token_id: int | None) -> None:
        self.eos_token_id = eos_token_id
        self.additional_stop_token_ids = None


class SGLangAdapter(SGLangRules):
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
        self.num_cpu_blocks = 0
        self.eos_token_id = eos_token_id
        self.sched = build_scheduler(k)
        self._all: dict[str, Req] = {}
        self._arrival: dict[str, float] = {}
        self._max_tokens: dict[str, int] = {}
        self._num_preemptions: dict[str, int] = {}
        self._aborted: set[str] = set()
        self._batch = None  # the batch of the last schedule(), until its update()
        self._requeued: list[str] = []
        self._idle = False  # the last schedule() ran nothing
        self._broken: str | None = None  # a step SGLang got wrong (its bug): nothing after it is checked
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
        if request_id in self._all:
            raise ValueError(f"request_id {request_id!r} is already in use")
        sp = SamplingParams(
            max_new_tokens=max_tokens,
            min_new_tokens=min_tokens,
            temperature=0.0,
            ignore_eos=ignore_eos,
            stop_token_ids=list(stop_token_ids or []) or None,
        )
        # min_new_tokens is its sampler's (a penalizer masks EOS, which needs the tokenizer's EOS id); stop strings,
        # the tokenizer's other use, are not ours
        sp.normalize(_Tokenizer(self.eos_token_id))
        req = Req(
            request_id,
            "",
            array("q", prompt_token_ids),
            sp,
            eos_token_ids=None if self.eos_token_id is None else {self.eos_token_id},
            vocab_size=1 << 20,
            priority=priority if self.knobs["policy"] == "priority" else None,
        )
        req.tokenizer = _Tokenizer(self.eos_token_id)  # its EOS id, for the min-new-tokens penalizer
        self._all[request_id] = req
        self._arrival[request_id] = arrival_time
        self._max_tokens[request_id] = max_tokens
        self._num_preemptions[request_id] = 0
        self.sched.init_req_max_new_tokens(req)
        self.sched._add_request_to_queue(req)

    def abort(self, request_ids):
        for rid in request_ids:
            req = self._all[rid]
            if req.finished():
                continue
            self.sched.abort_request(AbortReq(rid=rid))
            self._aborted.add(rid)
            if any(r is req for r in self._running_reqs()):
                self._release_running(req)

    def _release_running(self, req: Req) -> None:
        """What SGLang's next step does for a running request abort_request marked: finish it and free its KV."""
        from sglang.srt.mem_cache.common import release_kv_cache

        s = self.sched
        if req.finished_reason is None:
            req.finished_reason = req.to_finish or FINISH_ABORT()
            req.to_finish = None
        if s.chunked_req is req:
            s.chunked_req = None
        if s._pending_chunked_abort_req is req:  # released here, not again by the next step
            s._pending_chunked_abort_req = None
        release_kv_cache(req, s.tree_cache, checkpoint=False)
        for batch in (s.running_batch, s.last_batch):
            if batch is not None and any(r is req for r in batch.reqs):
                batch.filter_batch(reqs_to_exclude=[req])

    # ---- steps ----------------------------------------------------------------------------------------------
    def _observe(self) -> None:
        """Record the requests SGLang puts back into its waiting queue during a step (retracted, or preempted for a
        more urgent one): calls through, changing nothing."""
        add = self.sched._add_request_to_queue

        def add_request_to_queue(req, is_retracted: bool = False):
            self._requeued.append(req.rid)
            return add(req, is_retracted=is_retracted)

        self.sched._add_request_to_queue = add_request_to_queue

    def schedule(self) -> StepView:
        if self._batch is not None:
            raise RuntimeError("schedule() called before the previous step's update() (lockstep only)")
        s = self.sched
        waiting_before = {r.rid for r in s.waiting_queue}
        running_before = {r.rid for r in self._running_reqs()}
        self._requeued = []
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        self._batch = batch
        self._idle = batch is None
        preempted = [rid for rid in dict.fromkeys(self._requeued) if rid in running_before]
        for rid in preempted:
            self._num_preemptions[rid] += 1
        scheduled: dict[str, int] = {}
        if batch is not None:
            decoding = {id(r) for r in batch.reqs} if batch.forward_mode.is_decode() else set()
            decoding |= {id(r) for r in batch.decoding_reqs or []}  # the decodes a mixed step took along
            for r in batch.reqs:
                # a prefill computes its extend (the prefix-cache hit is not computed); a decode its one input token
                scheduled[r.rid] = 1 if id(r) in decoding else int(r.extend_len)
        self._broken = self._broken or self._sampled_short(batch)
        return StepView(
            num_scheduled_tokens=scheduled,
            preempted_req_ids=preempted,
            new_req_ids=[rid for rid in scheduled if rid in waiting_before],
        )

    def update(self, sampled):
        """One token per request of the batch where SGLang's sampler puts it (a partial prefill's row is ignored by
        SGLang; the caller leaves it out of `sampled`), then SGLang's own process_batch_result."""
        s = self.sched
        if self._broken is not None:
            raise RuntimeError(f"update() after a step SGLang got wrong: {self._broken}")
        batch, self._batch = self._batch, None
        if batch is None:
            s.last_batch = None
            return []
        rows = []
        for r in batch.reqs:
            tokens = sampled.get(r.rid, [])
            samples = r.inflight_middle_chunks <= 0  # a chunk before the last samples nothing
            if samples != bool(tokens) and not r.finished():
                raise AssertionError(
                    f"{r.rid}: the caller sampled {tokens} but SGLang's batch {'samples' if samples else 'does not sample'}"
                    f" a token for it (allocated {r.kv.kv_allocated_len}, prompt {len(r.origin_input_ids)}, outputs "
                    f"{len(r.output_ids)}, extend {r.extend_len})"
                )
            rows.append(int(tokens[0]) if tokens else 0)
        result = GenerationBatchResult(next_token_ids=torch.tensor(rows, dtype=torch.int64))
        before = {r.rid for r in batch.reqs if not r.finished()}
        # Scheduler.process_batch_result less its metrics, load publishing and trace plumbing
        if batch.forward_mode.is_decode():
            s.batch_result_processor.process_batch_result_decode(batch, result)
        else:
            s.batch_result_processor.process_batch_result_prefill(batch, result)
        s.tree_cache.flush_pending_backups()
        s.last_batch = batch
        s.forward_ct += 1
        return [r.rid for r in batch.reqs if r.rid in before and r.finished()]

    def _sampled_short(self, batch) -> str | None:
        """SGLang's result processor samples a token for every request of a prefill batch but its one chunked
        request. When two requests are cut in one prefill pass (the KV budget cuts a chunk below the token budget
        left, so the pass goes on and cuts the next one), only the last stays SGLang's chunked request: the first
        would get a token sampled after part of its prompt."""
        if batch is None or batch.forward_mode.is_decode():
            return None
        for r in batch.reqs:
            known = len(r.origin_input_ids) + len(r.output_ids)
            if r.inflight_middle_chunks <= 0 and self._computed(r) < known:
                return (
                    "SGLang's bug: two requests cut in one prefill pass (the page-rounded KV budget cut a chunk below "
                    "the token budget left, and PrefillAdder went on to cut the next request), and only the last "
                    "stays the chunked request (PrefillAdder.new_chunked_req is overwritten): the first would get a "
                    "token sampled after part of its prompt"
                )
        return None

    def stalled(self) -> str | None:
        """A step SGLang got wrong (its bug, found by schedule()), or, with nothing running and the whole pool free, a step that admitted nothing is a state SGLang never leaves:
        the request at the head of its queue cannot be admitted into the empty pool."""
        if self._broken is not None:
            return self._broken
        s = self.sched
        if not (self._idle and s.waiting_queue and not self._running_reqs() and s.chunked_req is None):
            return None
        if self.num_free_blocks() < self.num_gpu_blocks:
            return None
        return (
            "SGLang's difference: admission reserves the paged prompt plus one page more than the prompt and output "
            "need (PrefillAdder), so a request that fits the pool by vLLM's rule (prompt + max_tokens - 1 tokens) "
            "but not by SGLang's waits for ever; SGLang's API refuses prompts this long (max_req_input_len = pool - 6 "
            "tokens), which the adapter, adding requests to the scheduler's queue, does not check"
        )

    # ---- views ----------------------------------------------------------------------------------------------
    def _running_reqs(self) -> list[Req]:
        s = self.sched
        out: list[Req] = []
        seen: set[int] = set()
        batches = [s.running_batch]
        if self._batch is not None:  # scheduled, not fed yet: its requests hold the KV allocated for it
            batches.append(self._batch)
        if s.last_batch is not None and s.last_batch is not s.running_batch and s.last_batch.forward_mode.is_extend():
            batches.append(s.last_batch)
        for batch in batches:
            for r in batch.reqs:
                if id(r) not in seen and not r.finished() and r.kv.holds_kv:
                    seen.add(id(r))
                    out.append(r)
        if s.chunked_req is not None and id(s.chunked_req) not in seen and s.chunked_req.kv.holds_kv:
            out.append(s.chunked_req)
        return out

    @staticmethod
    def _computed(r: Req) -> int:
        return int(r.kv.kv_allocated_len) if r.kv.holds_kv else 0

    def _pages(self, r: Req) -> list[int]:
        if not r.kv.holds_kv or r.finished():
            return []
        n = int(r.kv.kv_allocated_len)
        slots = self.sched.req_to_token_pool.req_to_token[r.kv.req_pool_idx, :n].tolist()
        return [p - 1 for p in dict.fromkeys(int(x) // self.block_size for x in slots)]

    def _view(self, r: Req, status: str) -> ReqView:
        reason = r.finished_reason
        if r.rid in self._aborted or isinstance(reason, FINISH_ABORT):
            finish = "abort"
        elif isinstance(reason, FINISH_LENGTH):
            finish = "length"
        elif isinstance(reason, FINISH_MATCHED_TOKEN):
            finish = "stop"
        else:
            finish = None if reason is None else type(reason).__name__
        finished = r.finished() or r.rid in self._aborted
        return ReqView(
            request_id=r.rid,
            status="finished" if finished else status,
            num_prompt_tokens=len(r.origin_input_ids),
            num_output_tokens=len(r.output_ids),
            num_computed_tokens=0 if finished else self._computed(r),
            priority=int(r.priority or 0),
            arrival_time=self._arrival[r.rid],
            block_ids=[] if finished else self._pages(r),
            num_preemptions=self._num_preemptions[r.rid],
            finish_reason=finish if finished else None,
            max_tokens=self._max_tokens[r.rid],
        )

    def running(self):
        return [self._view(r, "running") for r in self._running_reqs()]

    def _queue(self) -> list[Req]:
        """The waiting queue in the order SGLang's next prefill pass takes it: its policy sorts it first
        (SchedulePolicy.calc_priority: by priority, then queue entry, under priority scheduling; fcfs keeps it)."""
        s = self.sched
        queue = list(s.waiting_queue)
        if s.enable_priority_scheduling:
            SchedulePolicy._sort_by_priority_and_fcfs(queue, s.policy.priority_sign)
        return queue

    def waiting(self):
        return [self._view(r, "preempted" if self._num_preemptions[r.rid] else "waiting") for r in self._queue()]

    def request(self, request_id):
        r = self._all[request_id]
        if any(x is r for x in self._running_reqs()):
            return self._view(r, "running")
        return self._view(r, "preempted" if self._num_preemptions[request_id] else "waiting")

    def num_free_blocks(self):
        s = self.sched
        free_slots = s.token_to_kv_pool_allocator.available_size() + s.tree_cache.evictable_size()
        return free_slots // self.block_size

    def block_ref_counts(self):
        refs = dict.fromkeys(range(self.num_gpu_blocks), 0)
        for r in self._running_reqs():
            for b in self._pages(r):
                refs[b] += 1
        return refs

    def check_invariants(self):
        """SGLang has no self-check a step can call without its model worker; assert what its allocator and radix
        cache rely on: no page is both free and in a request's row, no page is free twice, and every page is free,
        evictable in the radix cache, or in a running request's row."""
        s = self.sched
        free = [int(p) for p in s.token_to_kv_pool_allocator.get_all_free_pages().tolist()]
        held = {b + 1 for r in self._running_reqs() for b in self._pages(r)}  # SGLang's page ids
        assert len(free) == len(set(free)), f"a page is free twice: {sorted(free)}"
        assert not set(free) & held, f"pages both free and held by a request: {sorted(set(free) & held)}"
        evictable = s.tree_cache.evictable_size() // self.block_size
        assert len(free) + evictable + len(held) == self.num_gpu_blocks, (
            f"{len(free)} free + {evictable} evictable + {len(held)} held pages != {self.num_gpu_blocks}"
        )
