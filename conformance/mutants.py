"""The planted bugs `python -m conformance.mutate` runs the fast suite against, one at a time.

Each mutant is a small source patch (an exact snippet -> its replacement) in one refengine file, a bug of a kind a
real change could introduce. Snippets carry enough context to be unique in their file; a snippet that is no longer
found (the code was refactored) makes the mutant "stale", reported as such and never counted as killed: update its
snippet then. `tests` names the fast suite subset that should kill it (the area's tests).
"""

from __future__ import annotations

from dataclasses import dataclass

SCHED = "refengine/scheduler.py"
SCHED_PREEMPT = "refengine/scheduler_preemption.py"
SCHED_UPDATE = "refengine/scheduler_update.py"
BATCHING = "refengine/batching.py"
POOL = "refengine/block_pool.py"
KV = "refengine/kv_cache_manager.py"
QUEUE = "refengine/request_queue.py"
RUNNER = "refengine/model_runner.py"
SAMPLER = "refengine/sampler.py"
DETOK = "refengine/detokenizer.py"
OUTPUT = "refengine/output_processor.py"

# The fast subsets, by area: each is quick (seconds to a minute here) and run with -x.
# (the stateful Hypothesis machine, test_scheduler_stateful.py, is left out: minutes per run; the recorded traces
# come first because they are the fastest to fail)
SCHED_TESTS = [
    "conformance/test_recorded_traces.py",
    "conformance/test_scheduler_examples.py",
    "refengine/tests/test_async_scheduling.py",
]
RUNNER_TESTS = [
    "refengine/tests/test_model_runner.py",
    "refengine/tests/test_model_runner_transfers.py",
    "refengine/tests/test_engine_behaviour.py",
]
SAMPLER_TESTS = ["refengine/tests/test_sampler.py", "refengine/tests/test_penalties.py"]
OUTPUT_TESTS = [
    "refengine/tests/test_detokenizer.py",
    "refengine/tests/test_output_kind.py",
    "refengine/tests/test_engine_behaviour.py",
]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str  # the bug, in words


def _m(name: str, path: str, old: str, new: str, tests: list[str], what: str) -> Mutant:
    return Mutant(name, path, old, new, tuple(tests), what)


MUTANTS = [
    # ---- scheduler ----
    _m(
        "sched-preempted-to-back",
        SCHED_PREEMPT,
        "        out.preempted_req_ids.append(req.request_id)\n        self.waiting.prepend(req)",
        "        out.preempted_req_ids.append(req.request_id)\n        self.waiting.add(req)",
        SCHED_TESTS,
        "a preempted request re-enters the waiting queue at its back, not its front",
    ),
    _m(
        "sched-fcfs-victim-first",
        SCHED_PREEMPT,
        "        return self.running[-1]",
        "        return self.running[0]",
        SCHED_TESTS,
        "FCFS preempts the earliest admitted request instead of the last",
    ),
    _m(
        "sched-priority-victim-min",
        SCHED_PREEMPT,
        "return max(self.running, key=lambda r: (r.priority, r.arrival_time))",
        "return min(self.running, key=lambda r: (r.priority, r.arrival_time))",
        SCHED_TESTS,
        "priority preempts the most urgent request instead of the least",
    ),
    _m(
        "sched-budget-ignored",
        SCHED,
        "n = full if full < budget else budget",
        "n = full",
        SCHED_TESTS,
        "a running request is scheduled past the token budget",
    ),
    _m(
        "sched-threshold-when-alone",
        SCHED,
        "lone = len(self.running) + len(self.waiting) <= 1",
        "lone = False",
        SCHED_TESTS,
        "a lone request is held to the long-prefill threshold",
    ),
    _m(
        "sched-admit-after-preemption",
        BATCHING,
        "        if not out.preempted_req_ids:\n",
        "        if True:\n",
        SCHED_TESTS,
        "waiting requests are admitted in a step that preempted",
    ),
    _m(
        "sched-max-num-seqs-off-by-one",
        SCHED,
        "if len(self.running) >= max_seqs:",
        "if len(self.running) > max_seqs:",
        SCHED_TESTS,
        "one request more than max_num_seqs may run",
    ),
    _m(
        "sched-unchunked-prefill-split",
        SCHED,
        "if not c.enable_chunked_prefill and n > self._budget:",
        "if not c.enable_chunked_prefill and n > self._budget + 1:",
        SCHED_TESTS,
        "without chunked prefill a prompt one token over the budget is split",
    ),
    _m(
        "sched-priority-self-preempt-stops",
        SCHED,
        "                    if priority:\n                        continue",
        "                    if priority:\n                        break",
        SCHED_TESTS,
        "priority: a request that preempted itself ends the running pass",
    ),
    _m(
        "sched-async-last-token",
        SCHED,
        "if placeholders and computed + 2 - placeholders >=",
        "if placeholders and computed + 1 - placeholders >=",
        SCHED_TESTS,
        "async: a request whose in-flight token is not its last is skipped",
    ),
    _m(
        "sched-min-tokens-eos",
        SCHED_UPDATE,
        "if num_output >= sp.min_tokens:",
        "if num_output > sp.min_tokens:",
        SCHED_TESTS + RUNNER_TESTS,
        "EOS at exactly min_tokens does not stop the request",
    ),
    _m(
        "sched-max-tokens-off-by-one",
        SCHED_UPDATE,
        "if num_output >= sp.max_tokens or",
        "if num_output > sp.max_tokens or",
        SCHED_TESTS,
        "a request generates max_tokens + 1 tokens",
    ),
    _m(
        "sched-ignore-eos-ignored",
        SCHED_UPDATE,
        "if not sp.ignore_eos and last in req.eos_token_ids:",
        "if last in req.eos_token_ids:",
        SCHED_TESTS + RUNNER_TESTS,
        "ignore_eos=True still stops at EOS",
    ),
    _m(
        "sched-lost-tokens-metric",
        SCHED_PREEMPT,
        "req.num_lost_tokens = req.num_computed_tokens",
        "req.num_lost_tokens = 0",
        SCHED_TESTS + RUNNER_TESTS,
        "recomputed tokens after a preemption are not counted (num_recomputed_tokens)",
    ),
    # ---- waiting queue ----
    _m(
        "queue-ties-by-insertion",
        QUEUE,
        "key = (request.priority, request.arrival_time, request.request_id)",
        'key = (request.priority, request.arrival_time, "")',
        SCHED_TESTS,
        "exact (priority, arrival_time) ties keep insertion order instead of falling to the request id",
    ),
    # ---- block pool ----
    _m(
        "pool-hashless-to-tail",
        POOL,
        "            self.free_queue.move_to_end(block.block_id, last=False)\n",
        "            pass\n",
        SCHED_TESTS,
        "freed blocks without a hash are not reused first (cached blocks get evicted sooner)",
    ),
    _m(
        "pool-mru-eviction",
        POOL,
        "_, block = self.free_queue.popitem(last=False)",
        "_, block = self.free_queue.popitem(last=True)",
        SCHED_TESTS,
        "new blocks come from the most recently freed end of the free queue",
    ),
    _m(
        "pool-touch-keeps-free",
        POOL,
        "            if block.ref_cnt == 0:\n                del self.free_queue",
        "            if block.ref_cnt < 0:\n                del self.free_queue",
        SCHED_TESTS,
        "a prefix hit on a free block leaves it in the free queue",
    ),
    _m(
        "pool-no-evict",
        POOL,
        "            self._evict(block)\n",
        "",
        SCHED_TESTS,
        "a reused block keeps its old hash in the cache map",
    ),
    _m(
        "pool-hash-not-chained",
        POOL,
        "return hash((parent_hash, tuple(token_ids)))",
        "return hash((None, tuple(token_ids)))",
        SCHED_TESTS,
        "block hashes do not chain to the previous block: equal blocks after different prefixes hit",
    ),
    # ---- KV cache manager ----
    _m(
        "kv-hit-covers-last-token",
        KV,
        "max_blocks = (request.num_tokens - 1) // self.block_size",
        "max_blocks = request.num_tokens // self.block_size",
        SCHED_TESTS,
        "a prefix hit may cover the last prompt token (nothing left to compute logits from)",
    ),
    _m(
        "kv-free-head-first",
        KV,
        "self.block_pool.free_blocks(reversed(blocks))",
        "self.block_pool.free_blocks(blocks)",
        SCHED_TESTS,
        "a request's blocks are freed head first, so its prefix is evicted first",
    ),
    _m(
        "kv-cache-unknown-tokens",
        KV,
        "num_full = min(num_tokens, request.num_tokens) // self.block_size",
        "num_full = num_tokens // self.block_size",
        SCHED_TESTS,
        "async: blocks holding placeholder tokens are put in the prefix cache",
    ),
    _m(
        "kv-free-hits-not-counted",
        KV,
        "if max(need, need_fit) > self.block_pool.num_free_blocks - free_hits:",
        "if max(need, need_fit) > self.block_pool.num_free_blocks:",
        SCHED_TESTS,
        "hits on free blocks are counted as free blocks too (allocation overcommits)",
    ),
    # ---- model runner inputs ----
    _m(
        "runner-decode-seq-lens",
        RUNNER,
        "ends = starts + 1  # [S] seq_lens",
        "ends = starts  # [S] seq_lens",
        RUNNER_TESTS,
        "decode steps' seq_lens leave out the token being decoded",
    ),
    _m(
        "runner-slot-offset",
        RUNNER,
        "* bs + positions % bs  # [T]",
        "* bs + (positions + 1) % bs  # [T]",
        RUNNER_TESTS,
        "slot_mapping writes each token's KV one slot off",
    ),
    _m(
        "runner-min-tokens-mask",
        "refengine/sampling_inputs.py",
        "masked = np.flatnonzero(num_out < batch.min_tokens[rows])",
        "masked = np.flatnonzero(num_out < batch.min_tokens[rows] - 1)",
        RUNNER_TESTS + SAMPLER_TESTS,
        "EOS is unmasked one token before min_tokens",
    ),
    # ---- sampler ----
    _m(
        "sampler-top-p-inclusive",
        SAMPLER,
        "drop |= (cum - probs) >= top_p[:, None]",
        "drop |= cum >= top_p[:, None]",
        SAMPLER_TESTS,
        "top-p drops the token that crosses the nucleus",
    ),
    _m(
        "sampler-temperature-mul",
        SAMPLER,
        "sub = sub / md.temperature[:, None]",
        "sub = sub * md.temperature[:, None]",
        SAMPLER_TESTS,
        "logits multiplied by the temperature",
    ),
    _m(
        "sampler-keep-none",
        SAMPLER,
        "    drop[:, 0] = False\n",
        "",
        SAMPLER_TESTS,
        "top-k/top-p may drop every token of a row",
    ),
    _m(
        "sampler-repetition-sign",
        SAMPLER,
        "torch.where(logits > 0, logits / rp, logits * rp)",
        "logits / rp",
        SAMPLER_TESTS,
        "repetition penalty divides negative logits too (raising them)",
    ),
    _m(
        "sampler-min-p-absolute",
        SAMPLER,
        "probs < probs.amax(dim=-1, keepdim=True) * min_p[:, None]",
        "probs < min_p[:, None]",
        SAMPLER_TESTS,
        "min_p compared with the probability, not scaled by the top one",
    ),
    # ---- detokenizer ----
    _m(
        "detok-stop-across-tokens",
        DETOK,
        "idx = self._unsent.find(stop, max(0, before - len(stop) + 1))",
        "idx = self._unsent.find(stop, before)",
        OUTPUT_TESTS,
        "a stop string split across two tokens is missed",
    ),
    _m(
        "detok-include-stop-swapped",
        DETOK,
        "cut = idx + len(stop) if self.request.sampling_params.include_stop_str_in_output else idx",
        "cut = idx if self.request.sampling_params.include_stop_str_in_output else idx + len(stop)",
        OUTPUT_TESTS,
        "include_stop_str_in_output inverted",
    ),
    _m(
        "detok-hold-too-short",
        DETOK,
        "self._hold = max(map(len, self._stops)) - 1 if self._stops else 0",
        "self._hold = max(map(len, self._stops)) - 2 if self._stops else 0",
        OUTPUT_TESTS,
        "streamed text holds back one character too few: the start of a stop string leaks out",
    ),
    _m(
        "detok-no-final-flush",
        DETOK,
        "                self._unsent += self._stream.flush()",
        "                pass",
        OUTPUT_TESTS,
        "an incomplete UTF-8 character at the very end is dropped",
    ),
    _m(
        "detok-stop-before-min-tokens",
        DETOK,
        "check_stops=n >= self._min_tokens",
        "check_stops=True",
        OUTPUT_TESTS,
        "stop strings end a request before min_tokens",
    ),
    # ---- output side ----
    _m(
        "output-sent-count",
        OUTPUT,
        "            state.num_sent_tokens = len(ids)",
        "            state.num_sent_tokens = len(new_ids)",
        OUTPUT_TESTS,
        "the output's sent-token count counts only the last delta (tokens are repeated)",
    ),
    _m(
        "output-preempted-is-finished",
        OUTPUT,
        "finished = status > _FINISHED_AFTER",
        "finished = status >= _FINISHED_AFTER",
        OUTPUT_TESTS + SCHED_TESTS[:1],
        "a preempted request's output is marked finished",
    ),
    _m(
        "output-stop-string-not-finishing",
        OUTPUT,
        "            self.scheduler.finish_requests([req.request_id], RequestStatus.FINISHED_STOPPED)",
        "            req.status = RequestStatus.FINISHED_STOPPED",
        OUTPUT_TESTS,
        "a stop string sets the status but the scheduler keeps the request (and its blocks)",
    ),
]
