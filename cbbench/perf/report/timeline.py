"""`cbbench timeline`: the picture of the batching modes from a real run. For each batching mode, a Gantt chart of
which request holds which slot at each engine step, prefill and decode shaded apart, with the mode's slot utilisation in the title.

Slots are derived from the engine's StepStats alone: a request takes the lowest free slot when it first appears in a
step (scheduled or running) and keeps it until it finishes; a request of a static batch (its `batch_ids` entry)
keeps its slot, held empty (hatched) after it finishes, until its whole batch has left: static batching's waste.
Utilisation = slot-steps doing work / (max_num_seqs x steps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from refengine.sampling_params import SamplingParams
from refengine.sim.sim_device import DeviceSpec

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

    from refengine.engine.step_stats import StepStats

TIMELINE_PROMPT_LENS = (8, 40, 16, 24, 8, 32, 12, 48, 8, 20, 16, 28)  # varied, so the modes differ visibly
TIMELINE_OUTPUT_LENS = (4, 16, 2, 10, 24, 3, 12, 6, 18, 2, 8, 14)


@dataclass
class Cell:
    step: int
    slot: int
    request_id: str
    kind: str  # "prefill" | "decode" | "held" (static: finished, slot not yet free) | "idle" (admitted, not scheduled)


@dataclass(frozen=True)
class StepView:
    """What the slots are read from, of one step: its scheduled, running and prefill request ids and the static batch
    of each request present (None outside static batching)."""

    scheduled: list[str]
    running: list[str]
    prefill: list[str]
    batch_ids: Mapping[str, int | None]

    @classmethod
    def of(cls, s: StepView | StepStats | Mapping[str, object]) -> StepView:
        """The view of a StepStats or of a step dict from a run's JSON (a `StepRecord` as the JSON stores it,
        perf/records.py: one `batch_id` stands for every request of the step)."""
        if isinstance(s, StepView):
            return s
        if isinstance(s, Mapping):  # (a run JSON's lists of ids, as written)
            scheduled, running = cast(list[str], s["scheduled_req_ids"]), cast(list[str], s["running_req_ids"])
            present = [*scheduled, *running]
            prefill = cast(list[str], s.get("prefill_req_ids") or [])
            return cls(scheduled, running, prefill, dict.fromkeys(present, cast(int | None, s.get("batch_id"))))
        return cls(s.scheduled_req_ids, s.running_req_ids, s.prefill_req_ids, s.batch_ids)


def assign_slots(steps: Sequence[StepView | StepStats | Mapping[str, object]], max_num_seqs: int) -> list[Cell]:
    """Slot occupancy per step, from StepStats (or the JSON's step dicts) alone: scheduled / running / prefill
    request ids and batch ids.

    A request with a static batch id keeps its slot until a request of another batch appears (its whole batch has
    left); one without frees its slot the step after it stops running, or at once when it is preempted (present
    neither scheduled nor running: it waits, holding no slot, and is drawn nowhere until it is readmitted)."""
    slot_of: dict[str, int] = {}
    batch_of: dict[str, int] = {}  # request -> static batch, for requests now holding a slot
    cells: list[Cell] = []
    free = list(range(max_num_seqs))
    for i, step in enumerate(steps):
        view = StepView.of(step)
        scheduled_ids, running_ids, prefill_ids, batch_ids = view.scheduled, view.running, view.prefill, view.batch_ids
        running = set(running_ids)
        present = set(scheduled_ids) | running
        for rid in [r for r in slot_of if r not in present and r not in batch_of]:
            free.append(slot_of.pop(rid))  # preempted since the last step: it waits, holding no slot
        new_batches = {batch_ids.get(r) for r in present} - {None} - set(batch_of.values())
        if new_batches:  # a new static batch forms only once the previous one has wholly left
            for rid in [r for r in slot_of if r in batch_of]:
                free.append(slot_of.pop(rid))
                del batch_of[rid]
        for rid in sorted(present - set(slot_of), key=_order):
            free.sort()
            # (more requests than max_num_seqs only in a foreign or inconsistent log: give them extra rows)
            slot_of[rid] = free.pop(0) if free else max(slot_of.values(), default=-1) + 1
            batch = batch_ids.get(rid)
            if batch is not None:
                batch_of[rid] = batch
        prefill, scheduled = set(prefill_ids), set(scheduled_ids)
        for rid, slot in slot_of.items():
            if rid in scheduled:
                kind = "prefill" if rid in prefill else "decode"
            elif rid in present:
                kind = "idle"
            else:
                kind = "held"
            cells.append(Cell(i, slot, rid, kind))
        for rid in [r for r in slot_of if r not in running and r not in batch_of]:
            free.append(slot_of.pop(rid))  # finished outside a static batch: the slot is free for the next step
    return cells


def _order(rid: str) -> tuple[int, str]:
    return (int(rid), "") if rid.isdigit() else (1 << 30, rid)


def utilisation(cells: Sequence[Cell], num_steps: int, max_num_seqs: int) -> float:
    busy = sum(c.kind in ("prefill", "decode") for c in cells)
    return busy / (max_num_seqs * num_steps) if num_steps else float("nan")


def run_mode(
    model: str,
    device: str,
    batching: str,
    prompts: Sequence[list[int]],
    output_lens: Sequence[int],
    max_num_seqs: int,
    seed: int,
) -> list[StepStats]:
    """Run the requests through one engine; returns its StepStats."""
    from refengine.engine.llm_engine import LLMEngine  # (loads torch: drawing a saved timeline does not)

    engine = LLMEngine(
        model,
        device=device,
        seed=seed,
        batching=batching,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=64,
        num_gpu_blocks=256,
    )
    for i, (p, n) in enumerate(zip(prompts, output_lens)):
        engine.add_request(str(i), p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return list(engine.step_stats)


def run_timeline(
    out: str | Path,
    *,
    model: str = "tiny-qwen2",
    device: str = "cpu",
    num_requests: int = 12,
    max_num_seqs: int = 4,
    seed: int = 0,
    modes: Sequence[str] = ("continuous", "sequence", "static", "none"),
) -> tuple[Path, dict[str, float]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if num_requests < 1 or max_num_seqs < 1:
        raise ValueError("num_requests and max_num_seqs must be >= 1")
    if DeviceSpec.parse(device).is_cpu:
        import torch

        torch.set_num_threads(1)  # as `cbbench perf`: OpenMP spin-waits slow a shared CPU down
    rng = np.random.default_rng(seed)
    k = len(TIMELINE_PROMPT_LENS)
    plens = [TIMELINE_PROMPT_LENS[i % k] for i in range(num_requests)]
    olens = [TIMELINE_OUTPUT_LENS[i % k] for i in range(num_requests)]
    prompts = [rng.integers(1000, 30000, size=n).tolist() for n in plens]
    cmap = plt.get_cmap("tab20")
    fig, axes = plt.subplots(
        len(modes), 1, figsize=(12, 1.0 + 0.55 * max_num_seqs * len(modes)), squeeze=False, sharex=True
    )
    util: dict[str, float] = {}
    for ax, mode in zip(axes[:, 0], modes):
        stats = run_mode(model, device, mode, prompts, olens, max_num_seqs, seed)
        cells = assign_slots(stats, max_num_seqs)
        util[mode] = utilisation(cells, len(stats), max_num_seqs)
        _draw_cells(ax, cells, cmap)
        ax.set_title(f"{mode}: {len(stats)} steps, slot utilisation {util[mode]:.0%}", fontsize=9, loc="left")
        ax.set_yticks(range(max_num_seqs), [f"slot {i}" for i in range(max_num_seqs)], fontsize=7)
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("engine step")
    _legend(fig)
    fig.suptitle(f"{num_requests} requests, max_num_seqs={max_num_seqs}, {model}", fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out, util


def _draw_cells(ax: Axes, cells: Sequence[Cell], cmap: Colormap) -> None:
    """One mode's row of the figure: a bar per (slot, step), coloured by request, styled by what the slot did."""
    for c in cells:
        color = cmap(int(c.request_id) % 20)
        if c.kind == "held":
            ax.barh(c.slot, 1, left=c.step, color="white", edgecolor="0.6", hatch="///", linewidth=0.3)
        elif c.kind == "idle":
            ax.barh(c.slot, 1, left=c.step, color=color, alpha=0.25, linewidth=0)
        else:
            ax.barh(
                c.slot,
                1,
                left=c.step,
                color=color,
                alpha=1.0 if c.kind == "prefill" else 0.6,
                edgecolor="black" if c.kind == "prefill" else "none",
                linewidth=0.6,
            )
            if c.kind == "prefill":
                ax.text(c.step + 0.5, c.slot, c.request_id, ha="center", va="center", fontsize=6)


def _legend(fig: Figure) -> None:
    from matplotlib.patches import Patch

    fig.legend(
        handles=[
            Patch(facecolor="0.4", edgecolor="black", label="prefill (request id)"),
            Patch(facecolor="0.4", alpha=0.6, label="decode"),
            Patch(facecolor="0.4", alpha=0.25, label="admitted, waiting for its prefill"),
            Patch(facecolor="white", edgecolor="0.6", hatch="///", label="held by a finished request (static)"),
        ],
        loc="upper right",
        fontsize=7,
        ncol=4,
    )
