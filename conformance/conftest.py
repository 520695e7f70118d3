"""Shared pytest setup for the conformance suite: the `--engine` option and its adapter fixture, `--base-url` (the
server the HTTP suite in conformance/http talks to), and the Hypothesis profile (conformance/hypothesis_profiles.py:
`fast`, the default, `ci`, and `thorough`, for nightly runs), chosen by CBBENCH_HYPOTHESIS_PROFILE.

Profiles only set defaults: a test's own `@settings(max_examples=...)` still wins, so the kernel tests keep theirs.

`--engine NAME` other than refengine checks that engine's scheduler: only the tests that drive a scheduler through
the adapter (those taking the `adapter_cls` fixture) and the tests marked with the engine's name (the vLLM
differential, `vllm`) run; the rest check refengine alone (its model, server, mutants) and are deselected, as the
default run already runs them. The HTTP suite is not even collected then: it talks to a server, not to a scheduler,
so an engine's own environment (.venv-vllm) needs none of its client's dependencies; nor are the other foreign
engines' own test files (test_<name>_*.py). The run ends with a section
that names everything the suite did not check on that engine (skips, expected failures, configurations refused).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import conformance._triton_env  # noqa: F401  (must run before anything imports the Triton kernels)
from conformance import hypothesis_profiles
from conformance.adapters import (
    ADAPTERS,
    CHECKED_PROPERTY,
    DEPARTED_PROPERTY,
    NOT_DRAWN_PROPERTY,
    REFUSED_PROPERTY,
    STALLED_PROPERTY,
    load_adapter,
)
from conformance.progress import guarded

hypothesis_profiles.load()  # fast (the default) / ci / thorough, by CBBENCH_HYPOTHESIS_PROFILE

_HTTP_SUITE = Path(__file__).parent / "http"
_DESELECTED_KEY = pytest.StashKey[int]()
_DESELECTED_OUTPUT = "cbbench_deselected"  # the same count, sent from a pytest-xdist worker to the controller


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        action="store",
        default="refengine",
        choices=sorted(ADAPTERS),
        help="which scheduler the engine-agnostic conformance tests drive (through conformance/adapters); with an "
        "engine other than refengine only those tests (and the tests marked with its name) run",
    )
    parser.addoption(
        "--base-url",
        action="store",
        default=None,
        help="run the HTTP suite (conformance/http) against this OpenAI-compatible server, e.g. "
        "http://127.0.0.1:8000; without it the suite starts its own `cbbench serve`",
    )


def _foreign_engine(config: pytest.Config) -> str | None:
    engine = config.getoption("--engine")
    return None if engine == "refengine" else engine


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    engine = _foreign_engine(config)
    if engine is None:
        return None
    if collection_path == _HTTP_SUITE:
        return True
    # another foreign engine's own tests (test_vllm_*.py, test_transformers_*.py): its package may not even import
    # in this engine's environment
    others = [name for name in ADAPTERS if name not in ("refengine", engine)]
    if collection_path.parent == _HTTP_SUITE.parent and collection_path.name.startswith(
        tuple(f"test_{name}_" for name in others)
    ):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    engine = _foreign_engine(config)
    if engine is None:
        return
    keep, drop = [], []
    for item in items:
        driven = "adapter_cls" in getattr(item, "fixturenames", ()) or item.get_closest_marker(engine) is not None
        (keep if driven else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    config.stash[_DESELECTED_KEY] = len(drop)
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: the controller prints the summary
        config.workeroutput[_DESELECTED_OUTPUT] = len(drop)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: every worker collects (and deselects) the same items; keep one worker's count."""
    count = getattr(node, "workeroutput", {}).get(_DESELECTED_OUTPUT)
    if count is not None:
        node.config.stash[_DESELECTED_KEY] = count


@pytest.fixture(scope="session")
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.config.getoption("--engine")


@pytest.fixture(scope="session")
def adapter_cls(engine_name: str):
    """The SchedulerAdapter class of the engine under test; skips when that engine is not installed."""
    if engine_name == "vllm":
        pytest.importorskip(
            "vllm",
            reason="--engine vllm needs vllm installed (see docs/conformance.md: 'Checking another engine's scheduler')",
        )
    try:
        # every schedule() under the progress guard: a stuck engine fails its test with its state, never hangs it
        return guarded(load_adapter(engine_name))
    except ImportError as e:  # the adapter module itself, or something it needs, is missing
        pytest.skip(f"--engine {engine_name}: adapter not importable ({e})")


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """What the suite checked on a foreign engine (each invariant by scope), where the engine departs or breaks one
    (with the case that shows it), and what it did not check, each with its reason (docs/conformance.md keeps the
    tables)."""
    engine = _foreign_engine(config)
    if engine is None:
        return
    tr = terminalreporter
    tr.section(f"checked and not checked on --engine {engine}")
    skipped: dict[str, list[str]] = {}
    for report in tr.stats.get("skipped", []):
        skipped.setdefault(_skip_reason(report), []).append(report.nodeid)
    for reason, ids in sorted(skipped.items(), key=lambda kv: sorted(kv[1])):
        ids = sorted(ids)
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        tr.line(f"SKIPPED {shown}: {reason}")
    for report in tr.stats.get("xfailed", []):
        tr.line(f"XFAIL   {report.nodeid}: {report.wasxfail}")
    counts: dict[str, Counter[str]] = {
        REFUSED_PROPERTY: Counter(),
        DEPARTED_PROPERTY: Counter(),
        STALLED_PROPERTY: Counter(),
    }
    not_drawn: dict[str, str] = {}
    checked: Counter[str] = Counter()
    for report in tr.stats.get("passed", []) + tr.stats.get("failed", []):
        for key, value in report.user_properties:
            if key == CHECKED_PROPERTY:
                checked.update(value)
            elif key in counts:
                counts[key].update(value)
            elif key == NOT_DRAWN_PROPERTY:
                not_drawn.update(value)
    for reason, knob in sorted(not_drawn.items(), key=lambda kv: kv[1]):
        tr.line(f"NOT DRAWN by the state machine (it draws {knob}): {reason}")
    for reason, n in sorted(counts[REFUSED_PROPERTY].items()):
        tr.line(f"REFUSED {n} drawn configuration(s) of the state machine: {reason}")
    for reason, n in sorted(counts[STALLED_PROPERTY].items()):
        tr.line(f"STALLED {n} example(s) of the state machine ended in a state the engine never leaves: {reason}")
    try:
        adapter = load_adapter(engine)
    except ImportError:
        adapter = None
    _summarize_invariants(tr, engine, adapter, checked, counts[DEPARTED_PROPERTY])
    deselected = config.stash.get(_DESELECTED_KEY, 0)
    if deselected:
        tr.line(
            f"{deselected} tests of refengine alone deselected (its model, server, mutants; the default run has them)"
        )


def _summarize_invariants(tr, engine: str, adapter, checked: Counter[str], departed: Counter[str]) -> None:
    """Per invariant (conformance/invariants/scope.py), by scope: checked (how often, by the state machine), departed
    from by design (an engine-specific one, with its case), or broken (a universal one: the engine's, with its
    case). An invariant the state machine never checked on this engine (its modes refused) says so."""
    from conformance.invariants.scope import INVARIANTS, UNIVERSAL

    departures = getattr(adapter, "departures", {}) if adapter is not None else {}
    cases = getattr(adapter, "departure_cases", {}) if adapter is not None else {}
    unchecked = getattr(adapter, "unchecked", {}) if adapter is not None else {}
    for scope_name in (UNIVERSAL, "engine-specific"):
        names = [
            n for n, i in INVARIANTS.items() if i.scope == scope_name and n not in departures and n not in unchecked
        ]
        done = ", ".join(f"{n} ({checked[n]})" for n in names if checked[n])
        idle = ", ".join(n for n in names if not checked[n])
        tr.line(f"CHECKED {scope_name} invariants (checks in the state machine): {done or 'none'}")
        if idle:
            tr.line(f"NOT CHECKED {scope_name} invariants (never applied to a configuration this run drew): {idle}")
    for name, reason in sorted(unchecked.items()):
        tr.line(f"NOT CHECKED invariant `{name}`: {reason}")
    for name, reason in sorted(departures.items()):
        case = cases.get(name, "no case named")
        n = departed[name]
        inv = INVARIANTS.get(name)
        if inv is not None and inv.scope == UNIVERSAL:
            tr.line(
                f"BREAKS universal invariant `{name}` ({n} violations in the state machine, counted, not raised), "
                f"{engine}'s: {reason} [case: {case}]"
            )
        else:
            design = f" ({inv.design})" if inv is not None and inv.design else ""
            tr.line(
                f"DEPARTS engine-specific invariant `{name}`{design} ({n} violations in the state machine, counted, "
                f"not raised): {reason} [case: {case}]"
            )
