"""The planted bugs of the engine side: the model runner's inputs, the sampler, the detokenizer and the output side
(output processor, and the engine's handling of stop strings)."""

from __future__ import annotations

from conformance.mutants.common import (
    DETOK,
    ENGINE,
    KILL_TESTS,
    OUTPUT,
    OUTPUT_TESTS,
    RUNNER,
    RUNNER_TESTS,
    SAMPLER,
    SAMPLER_TESTS,
    SCHED_TESTS,
    Mutant,
    mutant,
)

ENGINE_MUTANTS: list[Mutant] = [
    # ---- model runner inputs ----
    mutant(
        "runner-decode-seq-lens",
        RUNNER,
        "ends = starts + 1  # [S] seq_lens",
        "ends = starts  # [S] seq_lens",
        RUNNER_TESTS,
        "decode steps' seq_lens leave out the token being decoded",
    ),
    mutant(
        "runner-slot-offset",
        RUNNER,
        "* bs + positions % bs  # [T]",
        "* bs + (positions + 1) % bs  # [T]",
        RUNNER_TESTS,
        "slot_mapping writes each token's KV one slot off",
    ),
    mutant(
        "runner-min-tokens-mask",
        RUNNER,
        "masked = np.flatnonzero(num_out < batch.min_tokens[rows])",
        "masked = np.flatnonzero(num_out < batch.min_tokens[rows] - 1)",
        KILL_TESTS + RUNNER_TESTS + SAMPLER_TESTS,
        "EOS is unmasked one token before min_tokens",
    ),
    # ---- sampler ----
    mutant(
        "sampler-top-p-inclusive",
        SAMPLER,
        "drop |= (cum - probs) >= top_p[:, None]",
        "drop |= cum >= top_p[:, None]",
        KILL_TESTS + SAMPLER_TESTS,
        "top-p drops the token that crosses the nucleus",
    ),
    mutant(
        "sampler-temperature-mul",
        SAMPLER,
        "sub = sub / md.temperature[:, None]",
        "sub = sub * md.temperature[:, None]",
        SAMPLER_TESTS,
        "logits multiplied by the temperature",
    ),
    mutant(
        "sampler-keep-none",
        SAMPLER,
        "    drop[:, 0] = False\n",
        "",
        SAMPLER_TESTS,
        "top-k/top-p may drop every token of a row",
    ),
    mutant(
        "sampler-repetition-sign",
        SAMPLER,
        "torch.where(logits > 0, logits / rp, logits * rp)",
        "logits / rp",
        SAMPLER_TESTS,
        "repetition penalty divides negative logits too (raising them)",
    ),
    mutant(
        "sampler-min-p-absolute",
        SAMPLER,
        "probs < probs.amax(dim=-1, keepdim=True) * min_p[:, None]",
        "probs < min_p[:, None]",
        SAMPLER_TESTS,
        "min_p compared with the probability, not scaled by the top one",
    ),
    # ---- detokenizer ----
    mutant(
        "detok-stop-across-tokens",
        DETOK,
        "idx = self._unsent.find(stop, max(0, before - len(stop) + 1))",
        "idx = self._unsent.find(stop, before)",
        OUTPUT_TESTS,
        "a stop string split across two tokens is missed",
    ),
    mutant(
        "detok-include-stop-swapped",
        DETOK,
        "cut = idx + len(stop) if self.request.sampling_params.include_stop_str_in_output else idx",
        "cut = idx if self.request.sampling_params.include_stop_str_in_output else idx + len(stop)",
        OUTPUT_TESTS,
        "include_stop_str_in_output inverted",
    ),
    mutant(
        "detok-hold-too-short",
        DETOK,
        "self._hold = max(map(len, self._stops)) - 1 if self._stops else 0",
        "self._hold = max(map(len, self._stops)) - 2 if self._stops else 0",
        OUTPUT_TESTS,
        "streamed text holds back one character too few: the start of a stop string leaks out",
    ),
    mutant(
        "detok-no-final-flush",
        DETOK,
        "                self._unsent += self._stream.flush()",
        "                pass",
        OUTPUT_TESTS,
        "an incomplete UTF-8 character at the very end is dropped",
    ),
    mutant(
        "detok-stop-before-min-tokens",
        DETOK,
        "check_stops=n >= self._min_tokens",
        "check_stops=True",
        KILL_TESTS + OUTPUT_TESTS,
        "stop strings end a request before min_tokens",
    ),
    # ---- output side ----
    mutant(
        "output-sent-count",
        OUTPUT,
        "            state.num_sent_tokens = len(ids)",
        "            state.num_sent_tokens = len(new_ids)",
        OUTPUT_TESTS,
        "the output's sent-token count counts only the last delta (tokens are repeated)",
    ),
    mutant(
        "output-preempted-is-finished",
        OUTPUT,
        "finished = status > _FINISHED_AFTER",
        "finished = status >= _FINISHED_AFTER",
        KILL_TESTS + OUTPUT_TESTS + SCHED_TESTS[:1],
        "a preempted request's output is marked finished",
    ),
    mutant(
        "output-stop-string-not-finishing",
        ENGINE,
        "            sched.finish_requests([r.request_id for r in stopped], RequestStatus.FINISHED_STOPPED)\n",
        "            for r in stopped:\n                r.status = RequestStatus.FINISHED_STOPPED\n",
        OUTPUT_TESTS,
        "a stop string sets the status but the scheduler keeps the request (and its blocks)",
    ),
]
