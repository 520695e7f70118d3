"""How a gate reads: a text table per configuration (a terminal or a CI log), one markdown table (a CI step
summary such as $GITHUB_STEP_SUMMARY) or JSON (everything, for tools); each metric's base and head medians, the
ratio head / base, its interval, the minimum effect and the verdict, then the test that decided it."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TypedDict

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from cbbench.perf.gate.verdict import BAD, INCONCLUSIVE, Decision, as_dict
from cbbench.perf.results.gate import _clean, _md, _num

FORMATS = ("text", "markdown", "json")


class Verdict(TypedDict):
    """A finished gate, as its reports and its JSON say it: the arms, the verdict and its words, the test and its
    numbers, where the runs are and what they cost (run.py's `_summary`)."""

    base: str
    head: str
    regressed: bool
    inconclusive: bool
    message: str
    repeats: int  # runs per arm
    max_repeats: int | None
    looks: int
    order: str
    test: str
    tests: int
    confidence: float
    alpha: float  # each test's one-sided level
    min_effect_sources: list[str]
    notes: list[str]
    output: str
    wall_s: float
    cpu_s: dict[str, float]  # per arm


class ArmError(TypedDict):
    """The arm whose run ended a gate, why, and where its stderr was kept."""

    arm: str
    message: str
    stderr: str | None


class Unfinished(TypedDict, total=False):
    """A gate still running (its results pair is rewritten after every run) or ended by an arm's failure (`error`):
    no verdict (its fields None), the runs finished so far."""

    order: str
    test: str
    tests: int
    confidence: float | None
    alpha: float | None
    regressed: bool | None
    inconclusive: bool | None
    message: str
    base: str
    head: str
    repeats: int
    finished: int
    error: ArmError
    output: str | None
    wall_s: float


RATIO_NOTE = (
    "base, head: medians of each arm's runs; ratio: the median of head / base over every pair of runs "
    "(Hodges-Lehmann), the estimate the test goes with"
)
_STYLE = {
    "regressed": "bold red",
    "missing in head": "bold red",
    "improved": "green",
    "small change": "yellow",
    INCONCLUSIVE: "yellow",
}


def _ratio(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.4f}"


def interval(d: Decision) -> str:
    if math.isnan(d.low):
        return ""
    if d.low == 0 and d.high == math.inf:
        return "(too few runs)"
    return f"{d.low:.4f} - {d.high:.4f}"


def test_line(summary: Verdict) -> str:
    """The test, in one sentence, with the numbers that make it this gate's."""
    return (
        f"Mann-Whitney U on the log of each metric, {summary['repeats']} runs per arm in ABBA order; "
        f"{summary['tests']} tests, Bonferroni: each one-sided at alpha {summary['alpha']:.2g} "
        f"({summary['confidence']:.0%} for the whole gate); the interval is the ratio's at "
        f"{1 - summary['alpha']:.4g} on each side; a regression is significant, in the bad direction and beyond "
        f"the minimum effect; inconclusive: the interval's bad side reaches beyond the minimum effect"
    )


def verdict_word(decisions: Sequence[Decision]) -> str:
    """FAIL (a regression), INCONCLUSIVE (none shown, none ruled out) or PASS."""
    if any(d.status in BAD for d in decisions):
        return "FAIL"
    return "INCONCLUSIVE" if any(d.status == INCONCLUSIVE for d in decisions) else "PASS"


def _unseen(decisions: Sequence[Decision]) -> str:
    """`output_throughput 12.0 % (min 1.5 %)`: each inconclusive metric and the smallest change its runs could see."""
    many = len({x.config for x in decisions}) > 1
    shown = [d for d in decisions if d.status == INCONCLUSIVE]
    return ", ".join(
        f"{d.metric} {d.unseen:.1%} (min {d.min_effect:.1%})" + (f" ({d.config})" if many else "") for d in shown[:4]
    ) + (" ..." if len(shown) > 4 else "")


def message(decisions: Sequence[Decision]) -> str:
    bad = [d for d in decisions if d.status in BAD]
    if not bad and any(d.status == INCONCLUSIVE for d in decisions):
        return (
            "INCONCLUSIVE: no regression shown, but these runs could not rule out one larger than the minimum effect; "
            "the smallest change in the bad direction they could have seen: " + _unseen(decisions)
        )
    if not bad:
        small = sum(d.status == "small change" for d in decisions)
        better = sum(d.status == "improved" for d in decisions)
        extra = [f"{better} improved"] * bool(better) + [f"{small} significant but within the minimum effect"] * bool(
            small
        )
        return "PASS: no regression" + (f" ({'; '.join(extra)})" if extra else "")
    names = ", ".join(
        f"{d.metric} {_ratio(d.ratio)}x" + (f" ({d.config})" if len({x.config for x in decisions}) > 1 else "")
        for d in bad[:4]
    )
    return f"FAIL: {len(bad)} regression(s): {names}" + (" ..." if len(bad) > 4 else "")


def render_text(decisions: Sequence[Decision], summary: Verdict) -> Group:
    parts: list[RenderableType] = [
        Text(f"cbbench gate: base {summary['base']} -> head {summary['head']}", style="bold")
    ]
    by_config: dict[str, list[Decision]] = {}
    for d in decisions:
        by_config.setdefault(d.config, []).append(d)
    for config, group in by_config.items():
        t = Table(title=Text(config), title_justify="left", title_style="bold")
        t.add_column("metric", no_wrap=True)
        for col in ("", "base", "head", "ratio", "interval", "min"):
            t.add_column(col, justify="right", no_wrap=True)
        t.add_column("status", no_wrap=True)
        for d in group:
            t.add_row(
                d.metric,
                {"higher": "↑", "lower": "↓"}.get(d.direction, ""),
                _num(d.base),
                _num(d.head),
                _ratio(d.ratio),
                interval(d),
                f"{d.min_effect:.1%}",
                d.status,
                style=_STYLE.get(d.status, ""),
            )
        parts.append(t)
    for note in summary.get("notes", []):
        parts.append(Text(note, style="yellow"))
    parts.append(Text(RATIO_NOTE, style="dim"))
    parts.append(Text(test_line(summary), style="dim"))
    if summary.get("min_effect_sources"):
        parts.append(Text("minimum effects from: " + ", ".join(summary["min_effect_sources"]), style="dim"))
    if summary.get("output"):
        parts.append(Text(f"runs: {summary['output']}", style="dim"))
    style = "bold red" if summary["regressed"] else "yellow" if summary.get("inconclusive") else "green"
    parts.append(Text(summary["message"], style=style))
    return Group(*parts)


def render_markdown(decisions: Sequence[Decision], summary: Verdict) -> str:
    verdict = verdict_word(decisions)
    lines = [
        f"### cbbench gate: {_md(summary['base'])} -> {_md(summary['head'])}",
        "",
        f"**{verdict}**: {_md(summary['message'].partition(': ')[2] or summary['message'])}",
        "",
        "| configuration | metric | base | head | ratio | interval | min effect | status |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for d in decisions:
        status = f"**{d.status}**" if d.status in BAD or d.status == INCONCLUSIVE else d.status
        lines.append(
            f"| {_md(d.config)} | {_md(d.metric)} | {_num(d.base)} | {_num(d.head)} | {_ratio(d.ratio)} "
            f"| {interval(d)} | {d.min_effect:.1%} | {status} |"
        )
    lines += ["", *(f"- {_md(n)}" for n in summary.get("notes", []))]
    lines += [f"{_md(RATIO_NOTE)}. {_md(test_line(summary))}", ""]
    if summary.get("output"):
        lines += [f"Runs: `{summary['output']}`", ""]
    return "\n".join(lines)


def render_json(decisions: Sequence[Decision], summary: Verdict) -> str:
    doc = {k: _clean(v) for k, v in summary.items()}
    doc["rows"] = [{k: _clean(v) for k, v in as_dict(d).items()} for d in decisions]
    return json.dumps(doc, indent=1)


def render_error(summary: Unfinished, fmt: str) -> str:
    """The verdict of a gate that one arm's failure ended (`summary["error"]`): the arm and why, and where its runs
    and its stderr are; never a ratio."""
    err = summary["error"]
    where = [f"runs so far: {summary['output']}"] * bool(summary.get("output"))
    where += [f"its stderr: {err['stderr']}"] * bool(err.get("stderr"))
    if fmt == "json":
        doc = {k: _clean(v) for k, v in summary.items()}
        doc["rows"] = []
        return json.dumps(doc, indent=1) + "\n"
    if fmt == "markdown":
        lines = [
            f"### cbbench gate: {_md(summary['base'])} -> {_md(summary['head'])}",
            "",
            f"**ERROR** ({_md(err['arm'])} arm): {_md(err['message'])}",
            "",
            *(f"- {_md(w)}" for w in where),
            "",
        ]
        return "\n".join(lines)
    head = f"cbbench gate: base {summary['base']} -> head {summary['head']}\n"
    return head + str(summary["message"]) + "".join(f"\n{w}" for w in where) + "\n"
