"""The sorting of the invariants (conformance/invariants/scope.py) is complete and every engine's declarations name
what they depart from: a new check cannot land without a scope, and a departure cannot be declared without an
invariant the suite knows and a case that shows it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from conformance.adapters import ADAPTERS
from conformance.invariants.scope import ENGINE_SPECIFIC, INVARIANTS, UNIVERSAL

ROOT = Path(__file__).parent
# Where a check can fail an invariant: the invariant modules and the state machine's own liveness bound
CHECK_SOURCES = [*sorted((ROOT / "invariants").glob("*.py")), ROOT / "test_scheduler_stateful.py"]


def failed_names(paths: list[Path]) -> set[str]:
    """Every invariant name passed as a literal to `_fail(...)` in these files."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "_fail":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    names.add(first.value)
    return names


def declarations() -> dict[str, object]:
    """Each engine's class that declares departures, where it can be imported here (vLLM's needs .venv-vllm; SGLang's
    declarations live in sglang_rules.py, importable without SGLang)."""
    out: dict[str, object] = {"sglang": importlib.import_module("conformance.adapters.sglang_rules").SGLangRules}
    for name, target in ADAPTERS.items():
        module, cls = target.split(":")
        try:
            out.setdefault(name, getattr(importlib.import_module(module), cls))
        except ImportError:
            continue
    return out


def test_every_invariant_a_check_can_fail_has_a_scope():
    names = failed_names(CHECK_SOURCES)
    assert "token_budget" in names and "liveness" in names  # the scan sees both kinds of source
    assert names <= set(INVARIANTS), f"invariants without a scope in scope.py: {sorted(names - set(INVARIANTS))}"
    assert set(INVARIANTS) <= names, f"scope.py names invariants no check fails: {sorted(set(INVARIANTS) - names)}"


def test_scopes_are_well_formed():
    for inv in INVARIANTS.values():
        assert inv.scope in (UNIVERSAL, ENGINE_SPECIFIC), inv
        assert inv.rule, inv
        # an engine-specific invariant says whose design it is; a universal one belongs to no engine
        assert bool(inv.design) == (inv.scope == ENGINE_SPECIFIC), inv


def _case_exists(case: str) -> bool:
    path, _, test = case.partition("::")
    file = ROOT.parent / path
    return file.is_file() and f"def {test.split('[')[0]}(" in file.read_text()


@pytest.mark.parametrize("engine", sorted(declarations()))
def test_every_departure_names_a_known_invariant_and_a_case(engine):
    cls = declarations()[engine]
    departures = getattr(cls, "departures", {})
    cases = getattr(cls, "departure_cases", {})
    for name, reason in departures.items():
        assert name in INVARIANTS, f"{engine} departs from `{name}`, which scope.py does not know"
        assert reason, f"{engine}'s departure from `{name}` gives no reason"
        assert name in cases, f"{engine}'s departure from `{name}` names no case that shows it"
        assert _case_exists(cases[name]), f"{engine}'s case for `{name}` is not a test: {cases[name]}"
    assert set(cases) <= set(departures), (
        f"{engine} names cases of no departure: {sorted(set(cases) - set(departures))}"
    )
    for name, reason in getattr(cls, "unchecked", {}).items():
        assert name in INVARIANTS and reason, f"{engine} leaves `{name}` unchecked without a known name or a reason"
