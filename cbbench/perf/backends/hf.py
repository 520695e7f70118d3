"""The peers of a perf run, on refengine's own weights (`to_hf_model`), prompts, output lengths and concurrency.

- `hf-static`: Hugging Face `model.generate` on batches of `max_num_seqs` prompts in arrival order, left-padded,
  greedy, every member generating the batch's longest output (`min_new_tokens == max_new_tokens`, no EOS), so
  nobody stops early. Only each request's own `output_len` tokens count as output; the rest is static batching's
  waste, reported as `slot_waste` from synthetic per-step records (slots held = batch size, running = members whose
  own output is not yet complete). A streamer stamps every generated position (all members of a batch get their
  n-th token at the same time); a request finishes, as its caller sees it, when its batch returns.
- `hf-cb`: transformers' continuous batching, in hf_cb.py (it uses this module's model and records; this module
  knows nothing of it).

On a simulated GPU (`sim:<gpu>`) hf-static is modelled on the engine's cost model (`run_hf_static_sim`); hf-cb
is not simulated, and a simulated plan leaves it out.

Both return `base.RunResult`; a peer that fails returns one with `error` set instead of raising. Each is a "peer"
backend (`HfStaticBackend`, `HfCbBackend`), run beside refengine when `--peers` names it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cbbench.perf.backends.backend import Backend, ProgressFn, RunResult, warmup_prompts
from cbbench.perf.knobs import EngineKnobs
from cbbench.perf.records import PEER_STEP_KEYS, REQUEST_KEYS, RequestRecord, StepRecord
from cbbench.perf.sim.hf_static import simulate_hf_static_on, workload_requests
from refengine.sim.sim_device import DeviceSpec

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from cbbench.perf.plan.spec import RunSpec
    from cbbench.workloads.workload import Workload, WorkloadRequest


def hf_model(
    model: str, *, device: str, dtype: str | None, seed: int, attn_implementation: str = "sdpa"
) -> PreTrainedModel:
    """A transformers model holding the weights refengine loads for (model, dtype, seed): a preset's random draw
    is a pure function of its seed, a folder is read again."""
    from refengine.models.hf_twin import to_hf_model  # (brings in torch)
    from refengine.models.loader import load_model  # (brings in torch)

    ref, config = load_model(model, device=device, dtype=dtype, seed=seed)
    return to_hf_model(ref, config, attn_implementation=attn_implementation)


def peer_record(
    rid: str, r: WorkloadRequest, arrival: float, token_times: list[float], finish: float, first_scheduled: float | None
) -> RequestRecord:
    return RequestRecord(
        rid,
        r.prompt_len,
        r.output_len,
        arrival,
        first_scheduled,
        token_times[0],
        token_times,
        finish,
        num_preemptions=0,
        num_cached_tokens=None,
        finish_reason="length",
    )


class _StampStreamer:
    """`generate(streamer=...)`: put() is called once with the prompt, then once per generated position."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _generate_batch(model: Any, prompts: Sequence[list[int]], new_tokens: int, pad_id: int) -> list[float]:
    import torch

    width = max(len(p) for p in prompts)
    dev = model.device
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)
    streamer = _StampStreamer()
    # streamers take batch size 1 only through TextStreamer's checks; ours accepts any batch
    model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=pad_id,
        streamer=streamer,
    )
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return streamer.times


# a static generate() batch cannot hold a turn back until the previous answer returns: the peers refuse the workload
MULTI_TURN_REFUSED = "multi-turn workloads run on refengine and the HTTP backends only, not on the HF peers"


def run_hf_static_sim(
    workload: Workload, model: str, *, device: str, dtype: str | None, max_num_seqs: int
) -> RunResult:
    """hf-static on a simulated GPU: the same batching on the engine's cost model (perf/sim/hf_static.py),
    times in simulated seconds from 0, as the simulated engine's."""
    res = RunResult("hf-static", "static", EngineKnobs(max_num_seqs=max_num_seqs))
    sim = simulate_hf_static_on(device, model, workload_requests(workload), max_num_seqs, dtype or "bfloat16")
    res.records = [RequestRecord.from_dict(r, REQUEST_KEYS) for r in sim.records]  # the CPU peer's keys
    res.steps = [
        StepRecord(
            s["time"],
            s["num_scheduled_tokens"],
            s["num_running"],
            s["num_waiting"],
            None,
            None,
            None,
            slots_held=s["slots_held"],
            layout=PEER_STEP_KEYS,
        )
        for s in sim.steps
    ]
    res.duration = sim.duration_s
    return res


def _batch_steps(reqs: Sequence[WorkloadRequest], times: Sequence[float]) -> list[StepRecord]:
    """A static batch's synthetic steps: every slot held, running = members whose own output is not complete."""
    n = len(reqs)
    return [
        StepRecord(t, n, sum(r.output_len > k for r in reqs), 0, None, None, None, slots_held=n, layout=PEER_STEP_KEYS)
        for k, t in enumerate(times)
    ]


def run_hf_static(
    workload: Workload,
    model: str,
    *,
    device: str,
    dtype: str | None,
    max_num_seqs: int,
    warmup: int = 2,
    seed: int = 0,
    progress: ProgressFn | None = None,
) -> RunResult:
    if DeviceSpec.parse(device).simulated:
        if progress:
            progress(0)  # the simulation is the measured run
        sim = run_hf_static_sim(workload, model, device=device, dtype=dtype, max_num_seqs=max_num_seqs)
        if progress:  # simulated in one go: the whole run is done at once (the progress line said 0/N)
            progress(len(sim.records))
        return sim
    res = RunResult("hf-static", "static", EngineKnobs(max_num_seqs=max_num_seqs))
    if workload.is_multi_turn:
        res.error = MULTI_TURN_REFUSED
        return res
    try:
        hf = hf_model(model, device=device, dtype=dtype, seed=seed)
        hf.generation_config.eos_token_id = None
        pad_id = 0
        import torch  # (here: importing the backend registry stays light)

        with torch.inference_mode():
            if warmup:
                _generate_batch(hf, warmup_prompts(min(warmup, max_num_seqs), seed, hf.config.vocab_size), 4, pad_id)
            order = sorted(range(len(workload.requests)), key=lambda i: workload.requests[i].arrival_time)
            if progress:
                progress(0)  # the measured run starts: the model is loaded and warmed up
            t0 = time.perf_counter()
            end = t0
            for b in range(0, len(order), max_num_seqs):
                idx = order[b : b + max_num_seqs]
                reqs = [workload.requests[i] for i in idx]
                # a batch starts once its last member has arrived and the previous batch has returned
                start = max(end, t0 + max(r.arrival_time for r in reqs))
                time.sleep(max(0.0, start - time.perf_counter()))
                start = time.perf_counter()
                longest = max(r.output_len for r in reqs)
                times = _generate_batch(hf, [r.prompt_token_ids for r in reqs], longest, pad_id)
                end = time.perf_counter()
                for i, r in zip(idx, reqs):
                    res.records.append(peer_record(str(i), r, t0 + r.arrival_time, times[: r.output_len], end, start))
                res.steps.extend(_batch_steps(reqs, times))
                if progress:
                    progress(len(reqs), res.records[-len(reqs) :])
        res.records.sort(key=lambda r: int(r.request_id))
        res.duration = end - t0
    except Exception as e:  # a peer's failure is a row in the table, not the end of the run
        return RunResult("hf-static", "static", res.knobs, error=f"{type(e).__name__}: {e}")
    return res


@Backend.register("hf-static", kind="peer")
class HfStaticBackend(Backend):
    """Hugging Face `generate`, static batches of `max_num_seqs`."""

    def run(self, spec: RunSpec, progress: ProgressFn | None = None) -> RunResult:
        st = self.settings
        assert spec.knobs.max_num_seqs is not None, "a peer's entry names its batch size"  # narrows the type
        return run_hf_static(
            spec.workload,
            st.model,
            device=st.device.name,
            dtype=st.dtype,
            max_num_seqs=spec.knobs.max_num_seqs,
            warmup=st.warmup,
            seed=st.seed,
            progress=progress,
        )
