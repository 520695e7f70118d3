"""The `hf-cb` peer: transformers' continuous batching on refengine's own weights (`hf.hf_model`).

`init_continuous_batching`, one `add_request` per request with its own `max_new_tokens`, EOS disabled;
`max_requests_per_batch = max_num_seqs`, `max_batch_tokens = max_num_batched_tokens`, and an explicit `num_blocks` /
`page_size` (its default sizing is a GPU's, far more than a CPU run needs). Per-token timestamps come from `record_timestamps=True`
(time.perf_counter, the same clock as monotonic on Linux; the run keeps to perf_counter throughout anyway). Not
simulated: a simulated plan leaves it out. A failure returns a `RunResult` with `error` set instead of raising.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cbbench.perf.backends.backend import Backend, ProgressFn, RunResult, warmup_prompts
from cbbench.perf.backends.hf import MULTI_TURN_REFUSED, hf_model, peer_record
from cbbench.perf.knobs import EngineKnobs

if TYPE_CHECKING:
    from cbbench.perf.plan.spec import RunSpec
    from cbbench.workloads.workload import Workload, WorkloadRequest

HF_CB_PAGE_SIZE = 16  # tokens per page; refengine's default block size, so the cache granularity is alike
HF_CB_TIMEOUT_S = 600.0  # no result for this long: the generation thread is taken as hung
# on a CPU it logs an ERROR for the missing optional psutil; a real failure reaches us as a result's error
_CB_LOGGER = "ContinuousBatchingLogger"


def run_hf_cb(
    workload: Workload,
    model: str,
    *,
    device: str,
    dtype: str | None,
    max_num_seqs: int,
    max_num_batched_tokens: int | None,
    warmup: int = 2,
    seed: int = 0,
    progress: ProgressFn | None = None,
) -> RunResult:
    # named in this order even when the token budget is unset, as results files already hold hf-cb's knobs
    knobs = EngineKnobs(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        order=("max_num_seqs", "max_num_batched_tokens"),
    )
    res = RunResult("hf-cb", "continuous", knobs)
    if workload.is_multi_turn:
        res.error = MULTI_TURN_REFUSED
        return res
    manager = None
    try:
        reqs = workload.requests
        hf = hf_model(model, device=device, dtype=dtype, seed=seed)
        manager = _start_manager(hf, reqs, max_num_seqs, max_num_batched_tokens, seed)
        if warmup:
            for j, p in enumerate(warmup_prompts(warmup, seed, hf.config.vocab_size)):
                manager.add_request(p, request_id=f"warmup-{j}", max_new_tokens=4)
            _collect(manager, warmup, lambda out: None)
        order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_time)
        if progress:
            progress(0)  # the measured run starts: the manager is up and warmed up
        t0 = time.perf_counter()
        for i in order:  # the generation thread runs meanwhile
            time.sleep(max(0.0, t0 + reqs[i].arrival_time - time.perf_counter()))
            manager.add_request(
                reqs[i].prompt_token_ids, request_id=str(i), max_new_tokens=reqs[i].output_len, record_timestamps=True
            )

        def done(out: Any) -> None:
            r, i = reqs[int(out.request_id)], out.request_id
            if out.error is not None:
                raise RuntimeError(f"request {i}: {out.error}")
            if len(out.generated_tokens) != r.output_len:
                raise RuntimeError(f"request {i}: {len(out.generated_tokens)} tokens, asked for {r.output_len}")
            times = list(out.timestamps)
            res.records.append(peer_record(i, r, t0 + r.arrival_time, times, times[-1], out.lifespan[0]))
            if progress:
                progress(1, res.records[-1:])

        _collect(manager, len(reqs), done)
        res.records.sort(key=lambda r: int(r.request_id))
        res.duration = max(r.finish_time for r in res.records if r.finish_time is not None) - t0  # peer_record sets it
    except Exception as e:
        return RunResult("hf-cb", "continuous", knobs, error=f"{type(e).__name__}: {e}"[:300])
    finally:
        if manager is not None:
            manager.stop(block=True, timeout=10)
            manager.destroy()
    return res


def _start_manager(
    hf: Any,  # (transformers types its generation methods as tensors)
    reqs: Sequence[WorkloadRequest],
    max_num_seqs: int,
    max_num_batched_tokens: int | None,
    seed: int,
) -> Any:
    """transformers' continuous-batching manager for `reqs`, started: greedy, EOS disabled, sized explicitly."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    max_len = max(r.prompt_len + r.output_len for r in reqs)
    # enough pages for every request in flight at its full length, plus one page each of slack
    num_blocks = max_num_seqs * (math.ceil(max_len / HF_CB_PAGE_SIZE) + 1)
    gen = GenerationConfig(  # type: ignore[no-untyped-call]  # transformers leaves its **kwargs __init__ unannotated
        do_sample=False, max_new_tokens=max(r.output_len for r in reqs), eos_token_id=-1, pad_token_id=0
    )
    cb = ContinuousBatchingConfig(
        num_blocks=num_blocks,
        max_batch_tokens=max_num_batched_tokens or 2048,
        page_size=HF_CB_PAGE_SIZE,
        max_requests_per_batch=max_num_seqs,
        seed=seed,
    )
    logging.getLogger(_CB_LOGGER).setLevel(logging.CRITICAL)
    manager = hf.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    manager.start()
    return manager


def _collect(manager: Any, n: int, on_finished: Callable[[Any], None]) -> None:
    got = 0
    while got < n:
        out = manager.get_result(timeout=HF_CB_TIMEOUT_S)
        if out is None:
            raise RuntimeError("transformers' continuous batching returned no result (generation thread stopped)")
        if out.is_finished():
            on_finished(out)
            got += 1


@Backend.register("hf-cb", kind="peer")
class HfCbBackend(Backend):
    """transformers' continuous batching (`generate_batch`'s manager)."""

    def run(self, spec: RunSpec, progress: ProgressFn | None = None) -> RunResult:
        st = self.settings
        assert spec.knobs.max_num_seqs is not None, "a peer's entry names its batch size"  # narrows the type
        return run_hf_cb(
            spec.workload,
            st.model,
            device=st.device.name,
            dtype=st.dtype,
            max_num_seqs=spec.knobs.max_num_seqs,
            max_num_batched_tokens=spec.knobs.max_num_batched_tokens,
            warmup=st.warmup,
            seed=st.seed,
            progress=progress,
        )
