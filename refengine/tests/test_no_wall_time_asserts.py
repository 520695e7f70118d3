"""No test asserts that something happened within a wall-clock time: on a shared machine load alone fails such a
check on a correct tree (issue 47: a refusal "within 3 s" took 9 s at load 5). A test checks the order of events, a
count (engine steps), an injected clock or a time scale it fixes; performance targets belong in benchmarks, and
waits for asynchronous events go through refengine/tests/waiting.py's hang guard.

The check reads every test file's AST. In each function, a value is clock-derived when it comes from
time.time() / monotonic() / perf_counter() (or their _ns forms), directly or through names assigned from one. An
`assert` is flagged where a clock-derived value is bounded above by a constant (`elapsed < 3`, `t1 - t0 <= LIMIT_S`)
or by a deadline (a name assigned clock + constant: `now() < deadline`). Lower bounds (`elapsed >= GRACE_S`: load only
makes things later) and comparisons of recorded times with each other (`before < event_time < after`: the order of
events) pass. It is a reading of the common shapes, not a proof: a wall-clock bound hidden in a helper passes it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_DIRS = ("conformance", "refengine", "cbbench", "kernels", "workloads")
CLOCKS = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"}
# (file, function) -> why its wall-clock bound stays. None does: the last ones became hang guards (waiting.py) or
# counts of engine steps. An entry needs a reason no load can reach its bound.
ALLOWED: dict[tuple[str, str], str] = {}


def _is_clock_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr in CLOCKS and isinstance(f.value, ast.Name) and f.value.id == "time"
    return isinstance(f, ast.Name) and f.id in CLOCKS - {"time"}  # `from time import monotonic`


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(_is_clock_call(n) or (isinstance(n, ast.Name) and n.id in names) for n in ast.walk(node))


def _constant_like(node: ast.AST) -> bool:
    """A literal number, an UPPER_CASE name, or arithmetic of those: a bound the test fixed in advance."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return node.id.isupper()
    if isinstance(node, ast.Attribute):  # module.LIMIT_S
        return node.attr.isupper()
    if isinstance(node, ast.BinOp):
        return _constant_like(node.left) and _constant_like(node.right)
    if isinstance(node, ast.UnaryOp):
        return _constant_like(node.operand)
    return False


def _assigned(fn: ast.AST) -> list[tuple[list[str], ast.AST]]:
    out = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign):
            targets = [m.id for t in n.targets for m in ast.walk(t) if isinstance(m, ast.Name)]
            out.append((targets, n.value))
        elif isinstance(n, (ast.AnnAssign, ast.AugAssign)) and isinstance(n.target, ast.Name) and n.value is not None:
            out.append(([n.target.id], n.value))
    return out


def _bounded_above(value: ast.AST, bound: ast.AST, clock: set[str], deadlines: set[str]) -> bool:
    """`value <= bound` where value is clock-derived and bound a constant or a deadline."""
    if not _mentions(value, clock):
        return False
    return _constant_like(bound) or (isinstance(bound, ast.Name) and bound.id in deadlines)


def timed_asserts(source: str) -> list[tuple[str, int, str]]:
    """(function, line, the assert's test) of every wall-clock upper bound asserted in `source`."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        clock: set[str] = set()
        deadlines: set[str] = set()
        assigned = _assigned(fn)
        for _ in range(4):  # names assigned from names: a few rounds reach the fixpoint in practice
            for targets, value in assigned:
                if _mentions(value, clock):
                    clock.update(targets)
                    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
                        sides = (value.left, value.right)
                        if any(_mentions(s, clock) for s in sides) and any(_constant_like(s) for s in sides):
                            deadlines.update(targets)

        for a in ast.walk(fn):
            if not isinstance(a, ast.Assert):
                continue
            for cmp in (n for n in ast.walk(a.test) if isinstance(n, ast.Compare)):
                sides = [cmp.left, *cmp.comparators]
                for op, left, right in zip(cmp.ops, sides, sides[1:]):
                    if isinstance(op, (ast.Lt, ast.LtE)) and _bounded_above(left, right, clock, deadlines):
                        found.append((fn.name, a.lineno, ast.unparse(a.test)))
                    elif isinstance(op, (ast.Gt, ast.GtE)) and _bounded_above(right, left, clock, deadlines):
                        found.append((fn.name, a.lineno, ast.unparse(a.test)))
    return found


def _test_files() -> list[Path]:
    files = []
    for top in TEST_DIRS:
        for p in sorted((ROOT / top).rglob("test_*.py")):
            if ".venv" not in p.parts and not p.resolve().is_relative_to(ROOT / ".venv"):
                files.append(p)
    return files


def test_no_test_asserts_a_wall_clock_bound():
    offenders = []
    for path in _test_files():
        rel = path.relative_to(ROOT).as_posix()
        for fn, line, text in timed_asserts(path.read_text()):
            if (rel, fn) not in ALLOWED:
                offenders.append(f"{rel}:{line} in {fn}: assert {text}")
    assert not offenders, "wall-clock bounds asserted (load can fail them; see this file's docstring):\n" + "\n".join(
        offenders
    )


def test_the_check_sees_the_shapes_it_is_for():
    flagged = """
import time
from time import perf_counter
def f(live):
    t0 = time.monotonic()
    r = post()
    assert time.monotonic() - t0 < REFUSED_WITHIN_S
    left = perf_counter()
    elapsed = perf_counter() - left
    assert ok and elapsed <= 10.0, "slow"
    deadline = time.monotonic() + 60
    assert time.monotonic() < deadline
    assert 3 > time.time() - t0
"""
    assert [line for _, line, _ in timed_asserts(flagged)] == [7, 10, 12, 13]
    passing = """
import time
def g(rec, ev, sent):
    before = time.monotonic()
    run()
    after = time.monotonic()
    assert before < rec.arrival_time < rec.finish_time < after
    assert ev.times[-1] - sent >= GRACE_S - 1.0
    assert time.monotonic() - before > 0.5
    assert steps <= ABORT_WITHIN_STEPS
"""
    assert timed_asserts(passing) == []
