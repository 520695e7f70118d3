"""PenaltyTables: what the presence / frequency / repetition penalties read, kept on the device per penalised row.

For each row with a penalty: `prompt_mask[slot]` ([V] bool, the token occurs in the prompt) and `output_counts[slot]`
([V] int32, its occurrences in the output so far). They are updated incrementally from the runner's host token table
(the truth: prompt + every token sampled so far, real tokens even under async scheduling, since the runner's
steps run one after another and each appends its sampled ids before the next step reads them):

  * a row remembers how many of its tokens the tables already hold (`num_counted`); when it samples, the tokens
    after those cross to the device inside the step's one staging copy, as linear indices slot * V + token id
    (one per row in a decode step), and are scattered in: no per-step cost proportional to the context, no extra
    transfer, nothing read back;
  * a row (re)written whole (admission, resumption after recompute or swap, a token resync) counts from 0: its
    slot is cleared and rebuilt from all its tokens at its next sample, so preemption needs no special case.

Memory: only penalised rows hold a slot, and the tables grow by doubling up to max_num_seqs. At vocab 151936 a
slot is 0.76 MB (int32 counts + bool mask), 194 MB if all 256 rows are penalised: less than vLLM's per-step
[num_reqs, V + 1] int64 bin counts, and nothing at all is allocated while no request has a penalty. (Like vLLM's
penalty tensors, the tables are not in the KV-sizing profile run; gpu_memory_utilization's headroom covers them.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from refengine.sampling_params import SamplingParams

_MIN_SLOTS = 4


@dataclass
class PenaltyStep:
    """One step's host side: the arrays to pack (in ARRAY_NAMES order) and the counts to commit after the update."""

    arrays: list[np.ndarray]
    rows: np.ndarray  # [p] the penalised rows that sample
    num_tokens: np.ndarray  # [p] their token counts, which the tables hold once this step's update has run

    ARRAY_NAMES = ("penalty_idx", "penalty_rows", "penalty_slots", "fresh_slots", "prompt_lin", "output_lin")


class PenaltyTables:
    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device) -> None:
        self.max_num_reqs, self.vocab_size, self.device = max_num_reqs, vocab_size, device
        self.slot = np.full(max_num_reqs, -1, dtype=np.int64)  # row -> slot; -1: the row has no penalty
        self.num_counted = np.zeros(max_num_reqs, dtype=np.int64)  # the row's tokens the tables hold
        self.free_slots: list[int] = []
        self.capacity = 0
        self.prompt_mask = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)  # [capacity, V]
        self.output_counts = torch.zeros(0, vocab_size, dtype=torch.int32, device=device)  # [capacity, V]
        self.presence = torch.zeros(max_num_reqs, dtype=torch.float32, device=device)  # per row
        self.frequency = torch.zeros(max_num_reqs, dtype=torch.float32, device=device)
        self.repetition = torch.ones(max_num_reqs, dtype=torch.float32, device=device)

    # ---- rows (host, at admission and removal) ----------------------------------------------------------------
    def set_row(self, row: int, sp: SamplingParams) -> None:
        if not sp.has_penalties:
            self.release(row)
            return
        if self.slot[row] < 0:
            if not self.free_slots:
                self._grow()
            self.slot[row] = self.free_slots.pop()
        self.num_counted[row] = 0
        # (one small host-to-device write per admission, none per step)
        self.presence[row] = float(sp.presence_penalty)
        self.frequency[row] = float(sp.frequency_penalty)
        self.repetition[row] = float(sp.repetition_penalty)

    def recount(self, row: int) -> None:
        """The row's tokens were rewritten: rebuild its tables at its next sample."""
        self.num_counted[row] = 0

    def release(self, row: int) -> None:
        if self.slot[row] >= 0:
            self.free_slots.append(int(self.slot[row]))
            self.slot[row] = -1

    def _grow(self) -> None:
        new = min(max(_MIN_SLOTS, 2 * self.capacity), self.max_num_reqs)
        mask = torch.zeros(new, self.vocab_size, dtype=torch.bool, device=self.device)
        counts = torch.zeros(new, self.vocab_size, dtype=torch.int32, device=self.device)
        mask[: self.capacity] = self.prompt_mask
        counts[: self.capacity] = self.output_counts
        self.prompt_mask, self.output_counts = mask, counts
        self.free_slots.extend(range(new - 1, self.capacity - 1, -1))
        self.capacity = new

    # ---- one step -----------------------------------------------------------------------------------------
    def step_arrays(
        self, rows: np.ndarray, token_ids: np.ndarray, num_tokens: np.ndarray, num_prompt_tokens: np.ndarray
    ) -> PenaltyStep | None:
        """Host side, for the rows that sample: None when none of them has a penalty (the step pays nothing)."""
        if len(self.free_slots) == self.capacity:  # no row holds a slot
            return None
        slots = self.slot[rows]
        idx = np.flatnonzero(slots >= 0)  # [p] indices into the sampling rows
        if not len(idx):
            return None
        prows, slots = rows[idx], slots[idx]
        start, end = self.num_counted[prows], num_tokens[prows]
        lens = end - start
        owner = np.repeat(np.arange(len(idx)), lens)  # [t] which penalised row each new token belongs to
        offsets = np.cumsum(lens) - lens
        pos = start[owner] + np.arange(int(lens.sum())) - offsets[owner]  # [t] positions in the rows
        lin = slots[owner] * self.vocab_size + token_ids[prows[owner], pos]
        is_out = pos >= num_prompt_tokens[prows[owner]]
        arrays = [idx, prows, slots, slots[start == 0], lin[~is_out], lin[is_out]]
        return PenaltyStep(arrays, prows, end)

    def update_and_gather(self, step: PenaltyStep, views: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Device side: scatter the step's new tokens in, then gather the penalised rows' tables and parameters
        (the SamplingMetadata fields). Enqueued only, nothing waits on the device."""
        t = dict(zip(PenaltyStep.ARRAY_NAMES, views))
        fresh, prompt_lin, output_lin = t["fresh_slots"], t["prompt_lin"], t["output_lin"]
        if len(fresh):  # (lengths are host metadata of the views: no sync)
            self.prompt_mask[fresh] = False
            self.output_counts[fresh] = 0
        if len(prompt_lin):
            self.prompt_mask.view(-1)[prompt_lin] = True
        if len(output_lin):
            ones = torch.ones(len(output_lin), dtype=torch.int32, device=self.device)
            self.output_counts.view(-1).index_add_(0, output_lin, ones)
        self.num_counted[step.rows] = step.num_tokens
        slots, prows = t["penalty_slots"], t["penalty_rows"]
        return dict(
            penalty_idx=t["penalty_idx"],
            prompt_mask=self.prompt_mask[slots],
            output_counts=self.output_counts[slots],
            presence_penalty=self.presence[prows],
            frequency_penalty=self.frequency[prows],
            repetition_penalty=self.repetition[prows],
        )
