"""Each option of `cbbench perf`, `plan` and `gate` is declared once (perf/plan/declared.py; the plan's SLO and the
gate's own options in their command modules, as groups of the same kind), and the commands are made from the
declarations (docs/architecture.md, "Options, declared once"):

- every parameter of the three commands, the engine knobs aside, is a declaration the command lists, with the
  declaration's name, spelling, default, help and metavar, in the listed order;
- no command module spells an option itself: no typer.Option, no option parameter of its own, no flag written as a
  string (`"--batching"`), no declaration outside a group;
- no module of the harness writes a declared default again beside the option's name (a parameter, a field, a
  keyword, a `.get(name, default)`), so `--warmup`'s 8 is written once;
- a variant of a declaration (plan's default device, the gate's batching) cannot restate what it varies.

Each check is a function of a source tree, and each is shown to fail on a tree with the duplicate planted.
`python perf/tests/test_options_declared_once.py [ROOT]` prints the counts docs/architecture.md quotes.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.main import get_command

from cbbench.perf.cli import gate_cmd, plan_cmd
from cbbench.perf.cli import main as perf_cmd
from cbbench.perf.cli.params import takes
from cbbench.perf.knobs import knob_names
from cbbench.perf.plan.declared import GROUPS, RUN, Group, Option

REPO = Path(__file__).resolve().parents[3]
COMMANDS: dict[str, tuple[Option[Any], ...]] = {
    "perf": perf_cmd.PERF_OPTIONS,
    "plan": plan_cmd.PLAN_OPTIONS,
    "gate": gate_cmd.GATE_OPTIONS,
}
COMMAND_MODULES = ("cbbench/perf/cli/main.py", "cbbench/perf/cli/plan_cmd.py", "cbbench/perf/cli/gate_cmd.py")
# the option layer: the commands made from the declarations and the typed options; every value written here beside
# an option's name counts, a neutral one too (a `quiet: bool = False` restates the declared False)
OPTION_LAYER = (
    *COMMAND_MODULES,
    "cbbench/perf/cli/params.py",
    "cbbench/perf/cli/app.py",
    "cbbench/perf/plan/options.py",
    "cbbench/perf/grid/build.py",
    "cbbench/perf/plan/spec.py",
    "cbbench/perf/knobs.py",
)
# the other commands (serve, show, compare, timeline, the benches, sim) declare their own options, not perf's: an
# option of theirs that shares a name with one of perf's is theirs to default
OTHER_COMMANDS = ("cbbench/perf/cli/",)
# values anyone writes for "not set", "off" or "one": outside the option layer, a function's `seed: int = 0` or
# `quiet: bool = False` is its own and restates nothing
_NEUTRAL = (False, True, 0, 1, "")
# what a run is of (as perf/tests/test_knob_path.py has it): every command and API names its own device
_OWN_TO_EACH = ("device",)
# (file, name) -> where the harness still restates a declared default outside the option layer, and why it is left
RESTATED_LEFT = {
    ("cbbench/perf/backends/openai.py", "prompt_format"): "HttpArgs, made from ClientOptions; backends/ is outside "
    "the option layer this change keeps to (issue 48 item 1), and its defaults serve a caller that makes one alone",
    ("cbbench/perf/backends/openai.py", "request_timeout"): "(HttpArgs, as above)",
    ("cbbench/perf/backends/openai.py", "prefix_cache_isolation"): "(HttpArgs, as above)",
    ("cbbench/perf/backends/http_client.py", "prompt_format"): "HttpTarget, the client's own (as above)",
    ("cbbench/perf/gate/run.py", "format"): "GateOptions.format is the gate's verdict format (cli/gate_cmd.py's "
    "GATE.format), not perf's table format: the same name and default, another option",
}
_DECLARE = {"option", "optional", "repeated", "Option"}  # what makes a declaration (plan/declared.py)


def all_groups() -> list[Group]:
    """Every group of options: the shared ones and the commands' own."""
    return [*GROUPS, plan_cmd.SLO, gate_cmd.GATE]


def declared_defaults(groups: Sequence[Group]) -> dict[str, list[object]]:
    """{option name: its declared defaults} (one per group that declares the name), None left out (not given)."""
    out: dict[str, list[object]] = {}
    for g in groups:
        for o in g:
            if o.default is not None:
                out.setdefault(o.name, []).append(o.default)
    return out


def declared_flags(groups: Sequence[Group]) -> set[str]:
    """Every spelling of every option: `--warmup`, `--ignore-eos/--no-ignore-eos`, `--no-ignore-eos`."""
    flags: set[str] = set()
    for g in groups:
        for o in g:
            flags |= {o.flag, *o.flags, *(part for f in o.flags for part in f.split("/"))}
    return flags


# ---- the commands' parameters are the declarations -----------------------------------------------------------


def _expected_opts(o: Option[Any]) -> tuple[list[str], list[str]]:
    """click's opts and secondary_opts of a declaration, as typer makes them."""
    if not o.flags:
        dashed = o.flag
        return [dashed], ([f"--no-{dashed[2:]}"] if o.kind is bool else [])
    first, _, second = o.flags[0].partition("/")
    return [first], ([second] if second else [])


def param_mismatches(command: Any, declared: Sequence[Option[Any]], knobs: Sequence[str]) -> list[str]:
    """How a click command's parameters differ from `declared` (then `knobs`, then --help): a parameter that is not
    a declaration, one missing, or one whose spelling, default, help or metavar is not its declaration's."""
    params = [p for p in command.params if p.name != "help"]
    names = [p.name for p in params]
    want = [o.name for o in declared] + list(knobs)
    if names != want:
        extra, missing = [n for n in names if n not in want], [n for n in want if n not in names]
        if extra or missing:
            return [f"{command.name}: not declared {extra}, declared but missing {missing}"]
        return [f"{command.name}: the parameters are not in the declared order"]
    found = []
    for p, o in zip(params, declared):
        opts, secondary = _expected_opts(o)
        got = {"opts": p.opts, "secondary": p.secondary_opts, "default": p.default, "help": p.help, "mv": p.metavar}
        expected = {"opts": opts, "secondary": secondary, "default": o.default, "help": o.help, "mv": o.metavar}
        found += [
            f"{command.name} {o.flag}: {k} {got[k]!r}, declared {v!r}" for k, v in expected.items() if got[k] != v
        ]
    return found


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_commands_parameters_are_its_declarations(name):
    command = get_command(perf_cmd.app).commands[name]
    assert param_mismatches(command, COMMANDS[name], knob_names(exclude=("batching",))) == []


def test_the_parameter_check_can_fail():
    """A command that declares one parameter of its own beside the declarations is caught."""
    app = typer.Typer()

    @takes([RUN.seed])
    def cmd(*, values: Any, warmup: int = 8) -> None:  # (a hand-written --warmup: restated)
        pass

    app.command()(cmd)
    app.command("other")(cmd)  # (two commands: get_command makes a group of them, as cbbench's)
    command = get_command(app).commands["cmd"]
    assert param_mismatches(command, [RUN.seed], []) == ["cmd: not declared ['warmup'], declared but missing []"]
    assert param_mismatches(command, [RUN.seed, RUN.warmup], []) == [
        "cmd --warmup: help None, declared 'short synthetic requests of staggered lengths run first, not measured'"
    ]


def test_what_gate_forwards_and_plan_takes_of_perf_is_perf_s():
    """A variant keeps its declaration's key: the gate forwards, and plan takes, only options perf knows."""
    perf = {o.key for o in COMMANDS["perf"]}
    assert {o.key for o in gate_cmd.FORWARDED} <= perf
    assert {o.key for o in COMMANDS["plan"] if o.group != "slo"} <= perf


def test_a_shared_option_is_declared_in_one_group():
    names = [o.name for g in GROUPS for o in g]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_a_declaration_named_again_keeps_its_name_and_group():
    class Elsewhere(Group):
        title = "elsewhere"
        w = RUN.warmup

    assert Elsewhere.w is RUN.warmup and RUN.warmup.key == ("run", "warmup")


def test_a_variant_cannot_restate_its_declaration():
    with pytest.raises(ValueError, match="--warmup: a variant restates the declared default"):
        RUN.warmup.but(default=8)
    with pytest.raises(ValueError, match="restates the declared help"):
        RUN.warmup.but(default=4, help=RUN.warmup.help)
    assert RUN.warmup.but(default=4).key == RUN.warmup.key and RUN.warmup.default == 8


# ---- no command module spells an option itself ---------------------------------------------------------------


def _group_bodies(tree: ast.Module) -> set[int]:
    """The ids of the nodes inside a class that derives from Group: where options are declared."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == "Group" for b in node.bases):
            inside |= {id(n) for n in ast.walk(node)}
    return inside


def _called(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def spelled_options(root: Path, modules: Sequence[str], groups: Sequence[Group]) -> list[str]:
    """`file:line: what` for each place a command module spells an option instead of taking its declaration: a
    typer.Option or Argument, a parameter named after an option, a flag as a string, a declaration outside a
    group."""
    names = {o.name for g in groups for o in g}
    flags = declared_flags(groups)
    found: list[tuple[str, int, str]] = []
    for rel in modules:
        tree = ast.parse((root / rel).read_text())
        declared_here = _group_bodies(tree)
        for node in ast.walk(tree):
            if id(node) in declared_here:
                continue
            where = (rel, getattr(node, "lineno", 0))
            if isinstance(node, ast.Call) and _called(node) in {"Option", "Argument", "Opt"} | _DECLARE:
                found.append((*where, f"{_called(node)}(...)"))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [(*where, f"parameter {name}") for _, name, _ in _defaults(node) if name in names]
            elif isinstance(node, ast.Constant) and node.value in flags:
                found.append((*where, repr(node.value)))
    return [f"{rel}:{line}: {what}" for rel, line, what in sorted(found, key=lambda f: f[:2])]


def test_no_command_module_spells_an_option():
    assert spelled_options(REPO, COMMAND_MODULES, all_groups()) == []


# ---- no default is written twice ------------------------------------------------------------------------------


def _value(node: ast.expr | None) -> tuple[bool, object]:
    """(True, value) for a constant expression (6 * 3600, Path("results"), -1), else (False, None)."""
    if isinstance(node, ast.Constant):
        return True, node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        ok, v = _value(node.operand)
        return (True, -v) if ok and isinstance(v, (int, float)) else (False, None)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        (ok_l, left), (ok_r, right) = _value(node.left), _value(node.right)
        if ok_l and ok_r and isinstance(left, (int, float)) and isinstance(right, (int, float)):
            ops = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}
            return (True, ops[type(node.op)]) if type(node.op) in ops else (True, left / right)
    if isinstance(node, ast.Call) and _called(node) == "Path" and len(node.args) == 1:
        ok, v = _value(node.args[0])
        return (True, Path(v)) if ok and isinstance(v, str) else (False, None)
    return False, None


def _defaults(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[tuple[int, str, ast.expr | None]]:
    """(line, parameter, default) of each parameter of a function that has a default."""
    a = node.args
    pos = [*a.posonlyargs, *a.args]
    yield from ((node.lineno, p.arg, d) for p, d in zip(pos[len(pos) - len(a.defaults) :], a.defaults))
    yield from ((node.lineno, p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None)


def _named_values(tree: ast.Module) -> Iterator[tuple[int, str, ast.expr | None]]:
    """(line, name, value) of every value written beside a name: a parameter's default, a class field, a keyword
    argument, a `.get("name", default)`, a dict entry `"name": value`."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _defaults(node)
        elif isinstance(node, ast.ClassDef):
            for n in node.body:
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                    yield n.lineno, n.target.id, n.value
        elif isinstance(node, ast.Call):
            yield from ((node.lineno, k.arg, k.value) for k in node.keywords if k.arg)
            key = node.args[0] if node.args else None
            if _called(node) == "get" and len(node.args) == 2 and isinstance(key, ast.Constant):
                yield node.lineno, str(key.value), node.args[1]
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    yield node.lineno, k.value, v


def restated_defaults(root: Path, groups: Sequence[Group]) -> list[str]:
    """`file:line:name` for each default of `groups` written again beside its option's name in cbbench/perf: in the
    option layer any value, elsewhere one that is not neutral (the tests, the declarations themselves and the other
    commands aside)."""
    defaults = declared_defaults(groups)
    for name in _OWN_TO_EACH:
        defaults.pop(name, None)
    found = []
    for path in sorted((root / "cbbench" / "perf").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        strict = rel in OPTION_LAYER
        if "tests" in path.relative_to(root).parts or (rel.startswith(OTHER_COMMANDS) and not strict):
            continue
        tree = ast.parse(path.read_text())
        declarations = _group_bodies(tree)
        for line, name, node in _named_values(tree):
            ok, value = _value(node)
            if not ok or name not in defaults or id(node) in declarations:
                continue
            same = [d for d in defaults[name] if type(d) is type(value) and d == value]
            if same and (strict or not any(type(value) is type(n) and value == n for n in _NEUTRAL)):
                found.append(f"{rel}:{line}:{name}")
    return found


def _left(found: str) -> bool:
    rel, _, name = found.split(":")
    return (rel, name) in RESTATED_LEFT


def test_no_declared_default_is_written_again():
    """perf's own defaults (the shared groups), across the harness; the commands' own groups are their modules'
    (test_no_command_module_spells_an_option)."""
    found = restated_defaults(REPO, GROUPS)
    assert [f for f in found if not _left(f)] == []
    assert sorted({f.split(":")[0] + ":" + f.split(":")[2] for f in found}) == sorted(
        f"{r}:{n}" for r, n in RESTATED_LEFT
    )


# ---- each check fails on a planted duplicate -------------------------------------------------------------------

PLANTED = {
    # a command that spells its options as before (issue 48): its own parameters, a typer.Option, a flag string
    "cbbench/perf/cli/main.py": (
        "import typer\n"
        "Warmup = typer.Option('--warmup', help='short synthetic requests')\n"
        "def perf(ctx, warmup: int = 8, request_timeout: float = 6 * 3600, seed: int = 0) -> None:\n"
        "    argv = ['--batching', 'continuous', '--ignore-eos/--no-ignore-eos']\n"
        "    return option(int, 8)\n"
    ),
    # a backend and a results reader that restate the warm-up default; a seed of 0 is a function's own
    "cbbench/perf/backends/in_process.py": "def run_refengine(w, *, warmup: int = 8, seed: int = 0) -> None:\n    pass\n",
    "cbbench/perf/plan/like.py": "def f(plan):\n    return plan.run_options.get('warmup', 8)\n",
    # the typed options restating a default, a neutral one included (the option layer counts every value)
    "cbbench/perf/plan/options.py": (
        "class RunOptions:\n    seed: int = 0\n    result_dir: Path = Path('results')\n    cpu_threads: int | None = None\n"
    ),
}


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    for rel, text in PLANTED.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_spelling_check_can_fail(planted):
    assert spelled_options(planted, ["cbbench/perf/cli/main.py"], all_groups()) == [
        "cbbench/perf/cli/main.py:2: Option(...)",
        "cbbench/perf/cli/main.py:2: '--warmup'",
        "cbbench/perf/cli/main.py:3: parameter warmup",
        "cbbench/perf/cli/main.py:3: parameter request_timeout",
        "cbbench/perf/cli/main.py:3: parameter seed",
        "cbbench/perf/cli/main.py:4: '--batching'",
        "cbbench/perf/cli/main.py:4: '--ignore-eos/--no-ignore-eos'",
        "cbbench/perf/cli/main.py:5: option(...)",
    ]


def test_the_restated_default_check_can_fail(planted):
    assert restated_defaults(planted, GROUPS) == [
        "cbbench/perf/backends/in_process.py:1:warmup",
        "cbbench/perf/cli/main.py:3:warmup",
        "cbbench/perf/cli/main.py:3:request_timeout",
        "cbbench/perf/cli/main.py:3:seed",
        "cbbench/perf/plan/like.py:2:warmup",
        "cbbench/perf/plan/options.py:2:seed",
        "cbbench/perf/plan/options.py:3:result_dir",
    ]


# ---- the counts of docs/architecture.md -------------------------------------------------------------------------


def counts(root: Path) -> dict[str, int]:
    """What docs/architecture.md quotes, for the tree at `root`, by the rules above (this tree's declarations tell
    which names, spellings and defaults to look for)."""
    out = {}
    for rel in (*COMMAND_MODULES, "cbbench/perf/cli/perf_params.py", "cbbench/perf/cli/params.py"):
        if not (root / rel).exists():
            continue
        tree = ast.parse((root / rel).read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _called(n) in ("Opt", "Option")]
        out[f"typer.Option calls in {rel}"] = len(calls)
        if rel in COMMAND_MODULES:
            command = dict(zip(COMMAND_MODULES, COMMANDS))[rel]
            f = next(f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == command)
            own = [n for _, n, _ in _defaults(f) if n not in ("ctx", "values", "knobs")]
            out[f"option parameters of {command}()"] = len(own)
        if rel in COMMAND_MODULES or rel.endswith("perf_params.py"):
            out[f"places {rel} spells an option"] = len(spelled_options(root, [rel], all_groups()))
    restated = restated_defaults(root, GROUPS)
    out["perf's defaults written again beside the name in cbbench/perf"] = len(restated)
    out["... of them the warm-up's 8"] = sum(f.endswith(":warmup") for f in restated)
    return out


if __name__ == "__main__":
    for what, n in counts(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO).items():
        print(f"{n:5}  {what}")
