"""What the code cites is in the repository (issue 27: a module cited something outside it): in cbbench/ (kernels,
workloads, perf; tests aside) and benchmarks/, every repository path a docstring or comment names (`perf/report/plot.py`,
`docs/perf.md`) exists, every dotted module it names (`cbbench.perf.bench.step`, `cbbench.perf.records.StepRecord`) resolves,
and nothing cites the seed chapter, which lives outside the repository (docs/scheduling.md stands for it)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CHECKED = ("cbbench", "benchmarks")
# a path from the repository root; results/ is left out: its paths name files the commands write (results/x.csv), and
# so is benchmarks/: vLLM has one too, which the metrics cite (`benchmarks/serve.py`)
PATH = re.compile(
    r"(?<![\w/.-])((?:refengine|cbbench|kernels|workloads|perf|conformance|ci|docs)/[\w./-]*\w\.(?:py|md|sh|toml))\b"
)
MODULE = re.compile(
    r"(?<![\w./-])((?:refengine|cbbench\.kernels|cbbench\.workloads|cbbench\.perf|conformance|benchmarks)(?:\.[a-z_]\w*)+)"
)
SEED = re.compile(r"\bseed/|§|zh\.md")


def _sources() -> list[Path]:
    files = [p for folder in CHECKED for p in sorted((REPO / folder).rglob("*.py"))]
    return [p for p in files if "tests" not in p.relative_to(REPO).parts]


def _resolves(dotted: str) -> bool:
    """A module, or a name defined in the longest module prefix of `dotted`."""
    parts = dotted.split(".")  # every import name is the folder of its name (cbbench/kernels/, refengine/, ...)
    for k in range(len(parts), 1, -1):
        base = REPO.joinpath(*parts[:k])
        src = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if src.is_file():
            return k == len(parts) or re.search(rf"\b{re.escape(parts[k])}\b", src.read_text()) is not None
    return False


def _citations(pattern: re.Pattern[str]) -> list[tuple[str, int, str]]:
    out = []
    for path in _sources():
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.lstrip().startswith(("import ", "from ")):
                out += [(str(path.relative_to(REPO)), i, m.group(1)) for m in pattern.finditer(line)]
    return out


def test_cited_paths_exist() -> None:
    cited = _citations(PATH)
    assert len(cited) > 20  # the scan finds the citations there are (it can fail)
    assert [c for c in cited if not (REPO / c[2]).exists()] == []


def test_cited_modules_resolve() -> None:
    cited = _citations(MODULE)
    assert len(cited) > 20
    assert [c for c in cited if not _resolves(c[2])] == []


def test_nothing_cites_the_seed_chapter() -> None:
    hits = [
        (str(p.relative_to(REPO)), line) for p in _sources() for line in p.read_text().splitlines() if SEED.search(line)
    ]
    assert hits == []


def test_the_checks_catch_a_stale_citation() -> None:
    assert not (REPO / "perf/bench_step.py").exists() and PATH.search("stub (perf/bench_step.py)")
    assert not _resolves("cbbench.perf.runner.step_dicts") and not _resolves("cbbench.perf.bench_sampler")
    assert (
        _resolves("benchmarks.sampler_cost")
        and _resolves("cbbench.perf.bench.step")
        and _resolves("cbbench.perf.records.StepRecord")
    )
