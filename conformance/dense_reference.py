"""Each sampled step's logits against a dense forward: the same token sequence run whole through the Hugging Face twin
(refengine/models/hf_twin.py), with no KV cache, no paging, no prefix hit, no swap and no chunking.

A greedy token survives a slightly wrong KV cache on a random-weight tiny model; its logits do not. `StepRecorder`
hooks an `LLMEngine` at three seams it already has, none of them in the hot path of an engine that is not recorded:

- `scheduler.schedule`, wrapped on the instance: after each schedule() it notes, per scheduled request, the
  Request object, how many of its tokens the step leaves computed (the sampled row's context) and whether the
  step reaches the end of what is known (it must sample there, and only there);
- the runner's `execute_model` (and the batch queue's, under async scheduling): it pairs the step with the logits
  the sampler saw and the rows that sampled;
- the sampler, passed as `LLMEngine(sampler=recorder.sample)`: it keeps a copy of the logits before sampling.

After the run, `check_against_dense` requires (1) that exactly the expected requests sampled in every step, and
(2) that every sampled row's logits equal the dense forward of its request's first `context` tokens (the request's
final token list: under async scheduling the placeholder tokens are known by then) within DENSE_LOGITS_ATOL.
`check_runner_tokens` requires that after every step the runner's row holds exactly the request's tokens known
then (what it knew before, plus the token it sampled), read against the same final token list.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from refengine.models.presets import TEST_MODEL
from refengine.request import Request
from refengine.sample.sampler import SamplingMetadata, sample
from refengine.scheduler.scheduler_output import ModelRunnerOutput, SchedulerOutput

# fp32 on the CPU, the engine against transformers on the same weights: only the order of float32 sums differs
# (batched GEMMs of other shapes, attention over paged blocks, one softmax against another), which moves the tiny
# model's logits by about 1e-5 (refengine/tests/test_model.py holds the two models to 1e-4 for the same reason).
# The bugs this check is for move them by 1e-2 and more: a block of stale or missing KV changes every later logit.
DENSE_LOGITS_ATOL = 1e-4


@dataclass
class ScheduledRow:
    request: Request
    context: int  # tokens computed once this step has run: the sampled row's logits predict token `context`
    known: int  # tokens known before the step (under async scheduling its in-flight placeholders included)

    @property
    def expect_sample(self) -> bool:
        """The step reaches the end of what is known: it must sample there, and only there."""
        return self.context >= self.known


@dataclass
class RecordedStep:
    rows: dict[str, ScheduledRow]
    sampled: list[str] = field(default_factory=list)  # request ids that got a token, in row order
    logits: list[torch.Tensor] = field(default_factory=list)  # the sampler's input, [n, vocab] each call
    runner_tokens: dict[str, list[int]] = field(default_factory=dict)  # each row's tokens in the runner after it
    swapped_out: dict[str, int] = field(default_factory=dict)  # request id -> its computed tokens, swapped out


class StepRecorder:
    """Records every step of `engine` (see the module docstring); install with `install(engine)` after the engine is
    built with `sampler=recorder.sample`."""

    def __init__(self, inner_sampler: Callable[..., torch.Tensor] = sample) -> None:
        self._inner = inner_sampler
        self.steps: list[RecordedStep] = []
        self._by_out: dict[int, RecordedStep] = {}
        self._current = threading.local()  # the step the worker thread is executing

    def sample(self, logits: torch.Tensor, md: SamplingMetadata, generator: torch.Generator | None) -> torch.Tensor:
        step = getattr(self._current, "step", None)
        if step is not None:
            step.logits.append(logits.detach().clone())  # (the sampler writes into logits; the runner reuses them)
        return self._inner(logits, md, generator)

    def install(self, engine: Any) -> None:
        sched, runner = engine.scheduler, engine.model_runner
        schedule, execute = sched.schedule, runner.execute_model

        def recorded_schedule() -> SchedulerOutput:
            # what is known before this step: the tokens, and under async scheduling the in-flight placeholders
            known = {rid: r.num_tokens + r.num_output_placeholders for rid, r in sched.requests.items()}
            out = schedule()
            rows = {}
            for rid in out.num_scheduled_tokens:
                req = sched.requests[rid]
                rows[rid] = ScheduledRow(req, req.num_computed_tokens, known[rid])
            step = RecordedStep(rows)
            if out.blocks_to_swap_out:
                for rid in out.preempted_req_ids:
                    if rid in sched.kv_cache_manager.swapped:
                        step.swapped_out[rid] = sched.requests[rid].num_computed_tokens
            self.steps.append(step)
            self._by_out[id(out)] = step
            return out

        def recorded_execute(out: SchedulerOutput) -> ModelRunnerOutput:
            step = self._by_out.pop(id(out))
            self._current.step = step
            try:
                result = execute(out)
            finally:
                self._current.step = None
            step.sampled = [rid for rid, toks in zip(result.req_ids, result.sampled_token_ids) if toks]
            # (read here, in the thread that runs the steps: nothing else writes the runner's rows)
            batch = runner.input_batch
            step.runner_tokens = {rid: batch.token_ids_of(rid) for rid in result.req_ids if rid in batch}
            return result

        sched.schedule = recorded_schedule
        runner.execute_model = recorded_execute
        if engine.batch_queue is not None:
            engine.batch_queue._execute_model = recorded_execute


def check_runner_tokens(recorder: StepRecorder) -> int:
    """After every step, each scheduled request's row in the runner holds its known tokens and no others; returns
    the rows checked."""
    checked = 0
    for i, step in enumerate(recorder.steps):
        for rid, tokens in step.runner_tokens.items():
            row = step.rows[rid]
            want = row.request.all_token_ids[: row.known + row.expect_sample]
            assert tokens == want, (
                f"step {i}, request {rid}: the runner holds {len(tokens)} tokens, the scheduler {len(want)} "
                f"(first difference at {next((j for j, (a, b) in enumerate(zip(tokens, want)) if a != b), None)})"
            )
            checked += 1
    return checked


@functools.lru_cache(maxsize=2)
def hf_twin(model: str = TEST_MODEL) -> torch.nn.Module:
    """The transformers model holding `model`'s preset weights (fp32, CPU)."""
    from refengine.models.hf_twin import to_hf_model
    from refengine.worker.worker import _load_model_cached

    lm, cfg = _load_model_cached(model, torch.device("cpu"), torch.float32, 0, "torch")
    return to_hf_model(lm, cfg)


def dense_logits(hf_model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """[vocab] float32: the logits after `token_ids`, one forward of the whole sequence, no cache."""
    with torch.inference_mode():
        out = hf_model(torch.tensor([token_ids]), use_cache=False)
    return out.logits[0, -1].float()


def check_against_dense(
    recorder: StepRecorder, hf_model: torch.nn.Module, atol: float = DENSE_LOGITS_ATOL
) -> tuple[int, float]:
    """Assert (1) and (2) of the module docstring for every recorded step; returns (sampled rows checked, largest
    difference seen)."""
    cache: dict[tuple[int, ...], torch.Tensor] = {}
    checked, worst = 0, 0.0
    for i, step in enumerate(recorder.steps):
        expected = [rid for rid, row in step.rows.items() if row.expect_sample]
        assert step.sampled == expected, (
            f"step {i}: sampled {step.sampled}, but only {expected} reach the end of their known tokens "
            f"(computed / known tokens: { {r: (w.context, w.known) for r, w in step.rows.items()} })"
        )
        got = torch.cat(step.logits) if step.logits else torch.empty(0)
        assert got.shape[0] == len(step.sampled), f"step {i}: {got.shape[0]} logits rows for {step.sampled}"
        for rid, row_logits in zip(step.sampled, got):
            row = step.rows[rid]
            context = tuple(row.request.all_token_ids[: row.context])
            if context not in cache:
                cache[context] = dense_logits(hf_model, list(context))
            diff = float((row_logits - cache[context]).abs().max())
            assert diff <= atol, (
                f"step {i}, request {rid} at {row.context} tokens: logits differ from the dense forward by {diff:.3g} "
                f"(> {atol}): the KV it attended to is not that of its tokens"
            )
            checked += 1
            worst = max(worst, diff)
    return checked, worst
