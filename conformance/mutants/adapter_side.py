"""The planted bugs of the adapters: the layer between the suite and a foreign engine's scheduler, which turns its
state into the suite's views (ReqView, StepView). A bug there makes the suite judge an engine by wrong facts (a
false failure, or a real one hidden), and only a run against that engine shows it: each of these runs the engine's
conformance run (`--engine NAME`) in the environment that has the engine (`Mutant.python`)."""

from __future__ import annotations

from conformance.mutants.mutant import (
    SGLANG_ADAPTER,
    SGLANG_ENGINE_TESTS,
    SGLANG_PYTHON,
    TF_ADAPTER,
    TF_ENGINE_TESTS,
    VLLM_ADAPTER,
    VLLM_ENGINE_TESTS,
    VLLM_PYTHON,
    Mutant,
    mutant,
)

ADAPTER_MUTANTS: list[Mutant] = [
    mutant(
        "tf-adapter-outputs-after-reset",
        TF_ADAPTER,
        "            num_output_tokens=len(state.initial_tokens) - n_prompt + len(state.generated_tokens),\n",
        "            num_output_tokens=len(state.generated_tokens),\n",
        TF_ENGINE_TESTS,
        "transformers: a request's outputs counted from generated_tokens only, which a soft reset (recompute) folds "
        "into its initial tokens",
    ),
    mutant(
        "tf-adapter-stop-token-is-length",
        TF_ADAPTER,
        '"stop" if last in state._eos_token_ids else "length"',
        '"stop" if last == self.eos_token_id else "length"',
        TF_ENGINE_TESTS,
        "transformers: a request ended by one of its stop token ids is reported finished by length, not stop",
    ),
    mutant(
        "tf-adapter-swap-in-pairs-swapped",
        TF_ADAPTER,
        "blocks_to_swap_in=[(h, d - self._offset) for h, d in self._swap_in],",
        "blocks_to_swap_in=[(d - self._offset, h) for h, d in self._swap_in],",
        TF_ENGINE_TESTS,
        "transformers: a swap-in reported as (device, host) pairs instead of (host, device)",
    ),
    mutant(
        "tf-adapter-block-ids-unshifted",
        TF_ADAPTER,
        "block_ids=[] if finished else [b - self._offset for b in self.allocator.block_table.get(rid, [])],",
        "block_ids=[] if finished else list(self.allocator.block_table.get(rid, [])),",
        TF_ENGINE_TESTS,
        "transformers: a request's block ids reported in the allocator's id space (trash sectors first), not the "
        "suite's 0..num_gpu_blocks-1",
    ),
    mutant(
        "vllm-adapter-block-ids-unshifted",
        VLLM_ADAPTER,
        "block_ids = [b - 1 for b in self.sched.kv_cache_manager.get_block_ids(r.request_id)[0]]",
        "block_ids = list(self.sched.kv_cache_manager.get_block_ids(r.request_id)[0])",
        VLLM_ENGINE_TESTS,
        "vLLM: a request's block ids reported with vLLM's null block 0 counted, one above the suite's ids",
        python=VLLM_PYTHON,
    ),
    mutant(
        "vllm-adapter-waiting-misses-kv-holders",
        VLLM_ADAPTER,
        "return list(self.sched.kv_holding_waiting) + list(self.sched.waiting)",
        "return list(self.sched.waiting)",
        VLLM_ENGINE_TESTS,
        "vLLM: the waiting view leaves out the waiting requests that still hold KV blocks",
        python=VLLM_PYTHON,
        equivalent=True,  # docs/mutation.md: no configuration the adapter builds puts a request in that queue
    ),
    mutant(
        "vllm-adapter-new-ids-from-running",
        VLLM_ADAPTER,
        "new_req_ids=[rid for rid in out.num_scheduled_tokens if rid in waiting_before],",
        "new_req_ids=[r.req_id for r in out.scheduled_new_reqs],",
        VLLM_ENGINE_TESTS,
        "vLLM: the admitted ids taken from scheduled_new_reqs, which leaves out resumed (preempted) requests "
        "under vLLM's V1 model runner",
        python=VLLM_PYTHON,
        equivalent=True,  # docs/mutation.md: vLLM 0.33 builds the V2 runner here, which gets resumed ones as new
    ),
    mutant(
        "sglang-adapter-pages-unshifted",
        SGLANG_ADAPTER,
        "return [p - 1 for p in dict.fromkeys(int(x) // self.block_size for x in slots)]",
        "return [p for p in dict.fromkeys(int(x) // self.block_size for x in slots)]",
        SGLANG_ENGINE_TESTS,
        "SGLang: a request's blocks reported as SGLang's page ids, one above the suite's (its page 0 is padding)",
        python=SGLANG_PYTHON,
    ),
    mutant(
        "sglang-adapter-waiting-in-list-order",
        SGLANG_ADAPTER,
        "        if s.enable_priority_scheduling:\n            SchedulePolicy._sort_by_priority_and_fcfs(",
        "        if False:\n            SchedulePolicy._sort_by_priority_and_fcfs(",
        SGLANG_ENGINE_TESTS,
        "SGLang: the waiting view in the list's order, not the order its policy sorts it into before a prefill pass",
        python=SGLANG_PYTHON,
    ),
]
