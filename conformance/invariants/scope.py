"""Every invariant of the suite, sorted: `universal` (what any continuous-batching engine owes its users: nothing lost
or duplicated, KV accounted, a request's tokens in order, the right finish, its own budget kept, progress) or
`engine-specific` (one engine's design, vLLM's or a batching mode of refengine's, that another engine may do
otherwise and still be correct).

This is data the run reads, not prose: the state machine counts the checks of each invariant that applies to the
drawn configuration (`applies`), conftest.py's closing section of a `--engine` run lists them by scope, and an
adapter's `departures` from an engine-specific invariant are reported as its design, from a universal one as the
engine breaking it. test_invariant_scope.py checks that the sorting is complete: every name a check can fail with is
here, and every departure an adapter declares names an invariant here and a case that shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

UNIVERSAL = "universal"
ENGINE_SPECIFIC = "engine-specific"


def _always(cfg: dict) -> bool:
    return True


@dataclass(frozen=True)
class Invariant:
    name: str
    scope: str  # UNIVERSAL or ENGINE_SPECIFIC
    rule: str  # what it says, one line
    design: str = ""  # engine-specific only: whose design it is
    applies: Callable[[dict], bool] = _always  # the configurations in which the state machine checks it
    per_step: bool = True  # checked at every step of the state machine (else: per sampled token or at teardown)


def _continuous(cfg: dict) -> bool:
    return cfg["batching"] == "continuous"


def _swap(cfg: dict) -> bool:
    return cfg["preemption_mode"] == "swap"


_ALL = (
    # ---- universal ----------------------------------------------------------------------------------------------
    Invariant("prefill_budget", UNIVERSAL, "the prompt tokens one step computes never exceed the engine's budget"),
    Invariant("scheduled_tokens", UNIVERSAL, "a step gives a live request at least one, at most its remaining tokens"),
    Invariant("max_num_seqs", UNIVERSAL, "no more requests hold KV at once than the engine's cap"),
    Invariant(
        "admission_order",
        UNIVERSAL,
        "no starvation: admission follows the queue's order (FCFS, or by priority), nobody overtakes",
    ),
    Invariant("block_accounting", UNIVERSAL, "free + held KV blocks = the pool; each block's ref count = its holders"),
    Invariant("blocks_per_request", UNIVERSAL, "a running request holds the blocks its computed tokens need"),
    Invariant("block_sharing", UNIVERSAL, "a block is shared only as the same full block of an identical prefix"),
    Invariant("host_blocks", UNIVERSAL, "host (swap) blocks are held exactly by swapped-out requests", applies=_swap),
    Invariant("swap", UNIVERSAL, "a swapped-out victim's blocks are all copied out, and back in", applies=_swap),
    Invariant("preemption_needed", UNIVERSAL, "a request is preempted only when the KV it needs cannot be had"),
    Invariant("token_accounting", UNIVERSAL, "computed tokens grow by what is scheduled, back to 0 on recompute"),
    Invariant("outputs_kept", UNIVERSAL, "nothing lost or duplicated: a request holds exactly its sampled tokens"),
    Invariant(
        "sample_position", UNIVERSAL, "a request's tokens in order: a token lands where it was sampled", per_step=False
    ),
    Invariant(
        "finish",
        UNIVERSAL,
        "a request finishes exactly at EOS / stop token / max_tokens, with that reason",
        per_step=False,
    ),
    Invariant("aborted", UNIVERSAL, "an aborted request ends with 'abort' and holds nothing", per_step=False),
    Invariant("progress", UNIVERSAL, "no deadlock: a step with work left schedules or preempts something"),
    Invariant("liveness", UNIVERSAL, "every request finishes within a bound once arrivals stop", per_step=False),
    Invariant("all_finished", UNIVERSAL, "every request ends with a finish reason", per_step=False),
    Invariant("no_leaks", UNIVERSAL, "when all finished, every block is free", per_step=False),
    # ---- engine-specific ----------------------------------------------------------------------------------------
    Invariant(
        "token_budget",
        ENGINE_SPECIFIC,
        "decodes and prefill chunks share one token budget per step (and long_prefill_token_threshold)",
        design="vLLM V1 (and refengine): one budget over every scheduled token",
    ),
    Invariant(
        "decode_first",
        ENGINE_SPECIFIC,
        "a step admits a waiting request only after scheduling every running one",
        design="vLLM V1's running-then-waiting pass in one mixed step",
        applies=_continuous,
    ),
    Invariant(
        "priority_arrival_order",
        ENGINE_SPECIFIC,
        "under priority, one priority's requests wait in arrival order, a preempted one keeping its place",
        design="vLLM V1's priority queue: (priority, arrival_time) per request, kept across preemption",
        applies=lambda cfg: cfg["policy"] == "priority",
    ),
    Invariant(
        "preemption_victim",
        ENGINE_SPECIFIC,
        "the victim is the most recently admitted (FCFS) or least urgent, latest (priority) running request",
        design="vLLM V1's victim order",
    ),
    Invariant(
        "no_admission_after_preemption",
        ENGINE_SPECIFIC,
        "a step that preempted admits nothing",
        design="vLLM V1 (preemption stops its waiting pass)",
        applies=lambda cfg: not cfg["priority_preemption"],
    ),
    Invariant(
        "cached_tokens",
        ENGINE_SPECIFIC,
        "a request's prefix-cache hit is its first admission's, kept across readmissions",
        design="vLLM V1's Request.num_cached_tokens (its usage and metrics); checked where the adapter reports it",
    ),
    Invariant(
        "sequence_no_mixing",
        ENGINE_SPECIFIC,
        "a step is all prefill chunks or all decodes",
        design="refengine's batching='sequence' (TGI-like); SGLang's default",
        applies=lambda cfg: cfg["batching"] == "sequence",
    ),
    Invariant(
        "no_preemption_outside_continuous",
        ENGINE_SPECIFIC,
        "the sequence, static and none modes never preempt",
        design="refengine's sequence / static / none modes (TGI-like)",
        applies=lambda cfg: cfg["batching"] != "continuous",
    ),
    Invariant(
        "static_batch",
        ENGINE_SPECIFIC,
        "nothing joins a batch until all of it finished",
        design="refengine's batching='static' / 'none'",
        applies=lambda cfg: cfg["batching"] in ("static", "none"),
    ),
)

INVARIANTS: dict[str, Invariant] = {i.name: i for i in _ALL}


def scope(name: str) -> str:
    """The scope of the invariant `name` (KeyError for a name the suite does not know)."""
    return INVARIANTS[name].scope


def checked_each_step(cfg: dict) -> list[str]:
    """The invariants the state machine checks at every step of an example with this configuration."""
    return [i.name for i in _ALL if i.per_step and i.applies(cfg)]
