"""The planted bugs `python -m conformance.mutate` runs the fast suite against, one at a time.

Each mutant is a small source patch (an exact snippet -> its replacement) in one file of refengine or of the perf
report, a bug of a kind a real change could introduce. Snippets carry enough context to be unique in their file; a
snippet that is no longer found (the code was refactored) makes the mutant "stale", reported as such and never
counted as killed: update its snippet then. `tests` names the fast suite subset that should kill it (the area's
tests). The mutants live by side: `scheduler_side` (scheduler, waiting queue, block pool, KV manager), `engine_side`
(runner inputs, sampler, detokenizer, output side), `report_side` (the report's slot timeline), `adapter_side` (the
adapters to foreign engines, judged by that engine's run in its own environment); `mutant` holds the
`Mutant` type and the subsets.
"""

from __future__ import annotations

from conformance.mutants.adapter_side import ADAPTER_MUTANTS
from conformance.mutants.engine_side import ENGINE_MUTANTS
from conformance.mutants.mutant import Mutant
from conformance.mutants.report_side import REPORT_MUTANTS
from conformance.mutants.scheduler_side import SCHEDULER_MUTANTS

MUTANTS: list[Mutant] = [*SCHEDULER_MUTANTS, *ENGINE_MUTANTS, *REPORT_MUTANTS, *ADAPTER_MUTANTS]

__all__ = ["MUTANTS", "Mutant"]
