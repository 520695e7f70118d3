"""The gate's false-alarm rate and power, measured: N A/A gates (the same commit on both sides) and N gates against a
scratch commit that plants a per-step delay of a fraction of the step's own duration, tabulated as they finish; and
the one A/A gate ci/gpu_check.sh ends with.

    python -m benchmarks.gate_power campaign OUTDIR [--aa 20] [--planted 0.05:10,0.1:5,0.2:5] [-- GATE OPTIONS]
    python -m benchmarks.gate_power tabulate OUTDIR      # the table of what OUTDIR holds so far
    python -m benchmarks.gate_power aa OUT.csv [-- GATE OPTIONS]   # one A/A gate of this checkout's files

A campaign happens in a temporary clone of this repository (never on a branch of it): its HEAD is the base of every
gate; for each fraction f a scratch commit appends to refengine/engine/llm_engine.py a wrapper that makes
`LLMEngine.step` busy-wait f times the step's own duration after it (busy, as more work would be, so a shared
machine's contention slows it as it slows real work). An A/A gate is `cbbench gate --base HEAD` in the clone's
clean work tree; a planted one adds `--head planted-<f>`. The gates run in an interleaved schedule (A/A, 5 %,
A/A, 10 %, A/A, 5 %, A/A, 20 %, ...), so a campaign cut short still covers every kind, and the machine's load is
recorded before and after each. Each gate appends one line to OUTDIR/gates.csv (its kind, exit code, verdict,
per-metric ratios, wall and CPU seconds: the gate process and every process it waited for, from the kernel's
accounting) and rewrites OUTDIR/summary.md; its results pair is OUTDIR/gate-NNN.csv. The gate's own code is the
clone's (PYTHONPATH), so editing the checkout while a campaign runs changes nothing it measures.

`aa` copies this checkout's files (those git tracks or would track; every file but caches and virtual environments
where there is no git history, as on a lent GPU machine) into a one-commit repository and gates its HEAD against its
clean work tree: the same code twice, so any FAIL is a false alarm. It prints the verdict, writes the gate's pair at
OUT.csv and its JSON verdict at OUT.gate.json, and exits 0 whenever the gate ran (pass or false alarm).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cbbench.perf.gate.run import EXIT_INCONCLUSIVE
from cbbench.perf.gate.trees import Tree, arm_environment, import_root

STEP_FILE = "refengine/engine/llm_engine.py"
SIM_FILE = "refengine/sim/sim_device.py"
PLANTED_STEP = """

# planted by benchmarks.gate_power (a scratch commit, never merged): every step {fraction} of its own
# duration longer, spent busy as more work would be
def _planted_slowdown(step):  # type: ignore[no-untyped-def]
    import functools
    import time

    @functools.wraps(step)
    def slower(self):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = step(self)
        until = time.perf_counter() + {fraction} * (time.perf_counter() - t0)
        while time.perf_counter() < until:
            pass
        return out

    return slower


LLMEngine.step = _planted_slowdown(LLMEngine.step)  # type: ignore[method-assign]
"""
PLANTED_SIM = """

# planted by a scratch commit (never merged): every simulated step {factor} x the cost model's time
_unplanted_slowdown = planted_slowdown


def planted_slowdown() -> float:  # noqa: F811
    return {factor} * _unplanted_slowdown()
"""
GIT_ID = ("-c", "user.name=cbbench-gate-power", "-c", "user.email=gate-power@cbbench.local")
FIELDS = (
    "gate",
    "kind",
    "fraction",
    "exit",
    "verdict",
    "wall_s",
    "cpu_s",
    "load_before",
    "load_after",
    "ratios",
    "statuses",
    "error",
)


def git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", "-C", str(repo), *GIT_ID, *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout.strip()


def scratch_clone(src: Path, dst: Path) -> Path:
    """A clone of `src`'s committed HEAD at `dst` (objects shared, nothing copied that git need not)."""
    subprocess.run(["git", "clone", "--quiet", "--shared", str(src), str(dst)], check=True, capture_output=True)
    git(dst, "checkout", "--quiet", "--detach", git(src, "rev-parse", "HEAD"))
    return dst


def plant(repo: Path, path: str, text: str, tag: str) -> str:
    """Append `text` to `path` in a scratch commit on top of `repo`'s HEAD, tagged `tag` (HEAD stays where it was);
    returns the commit's sha."""
    head = git(repo, "rev-parse", "HEAD")
    target = repo / path
    original = target.read_text()
    target.write_text(original + text)
    try:
        git(repo, "add", path)
        git(repo, "commit", "--quiet", "-m", f"scratch: {tag}")
        sha = git(repo, "rev-parse", "HEAD")
        git(repo, "tag", "--force", tag, sha)
    finally:
        git(repo, "checkout", "--quiet", "--force", "--detach", head)  # the file as HEAD has it again
    return sha


def plant_step_delay(repo: Path, fraction: float) -> str:
    """The tag of a scratch commit whose engine steps take `fraction` longer (busy)."""
    tag = f"planted-{fraction:g}"
    plant(repo, STEP_FILE, PLANTED_STEP.format(fraction=repr(float(fraction))), tag)
    return tag


def plant_sim_slowdown(repo: Path, factor: float) -> str:
    """The tag of a scratch commit whose simulated steps take `factor` x the cost model's time."""
    tag = f"planted-sim-{factor:g}"
    plant(repo, SIM_FILE, PLANTED_SIM.format(factor=repr(float(factor))), tag)
    return tag


def schedule(aa: int, planted: dict[float, int]) -> list[float]:
    """The gates to run, interleaved: 0.0 is an A/A gate, f a gate against the delay f; A/A every other gate, the
    fractions in turn (the smallest twice as often while it has gates left), so a cut-short campaign covers all."""
    left = dict(planted)
    fractions = sorted(left)
    turn = [x for f in fractions[1:] for x in (fractions[0], f)] or fractions[:1]
    out: list[float] = []
    i = 0
    while aa > 0 or any(left.values()):
        if aa > 0:
            out.append(0.0)
            aa -= 1
        for _ in range(len(turn)):
            f = turn[i % len(turn)]
            i += 1
            if left.get(f, 0) > 0:
                out.append(f)
                left[f] -= 1
                break
    return out


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else ""


def run_gate(
    repo: Path, out: Path, k: int, fraction: float, tag: str | None, gate_args: Sequence[str], env: dict[str, str]
) -> dict[str, Any]:
    """One gate in the clone; its line of gates.csv."""
    target = out / f"gate-{k:03d}.csv"
    argv = [sys.executable, "-m", "cbbench.perf.cli", "gate", "--base", "HEAD", "--output", str(target)]
    argv += (["--head", tag] if tag else []) + ["--format", "json", "--quiet", *gate_args]
    before, t0 = _load(), time.perf_counter()
    # the gate's own code is the clone's too (PYTHONPATH), not whatever the checkout this runs from holds by then
    proc = subprocess.Popen(argv, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    line: dict[str, Any] = {
        "gate": k,
        "kind": "A/A" if not tag else "planted",
        "fraction": fraction,
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "load_before": before,
        "load_after": _load(),
    }
    try:
        doc = json.loads(stdout)
    except ValueError:
        doc = None
    if doc is None:
        line.update(verdict="error", error=(stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1])
        return line
    line["verdict"] = "FAIL" if doc["regressed"] else "INCONCLUSIVE" if doc.get("inconclusive") else "PASS"
    line["ratios"] = json.dumps({r["metric"]: r["ratio"] for r in doc["rows"]})
    line["statuses"] = json.dumps({r["metric"]: r["status"] for r in doc["rows"]})
    line["runs_cpu_s"] = sum(doc["cpu_s"].values())
    return line


def _children_cpu() -> float:
    ru = os.times()
    return ru.children_user + ru.children_system


def campaign(out: Path, aa: int, planted: dict[float, int], gate_args: Sequence[str], src: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    log = out / "gates.csv"
    done = [r for r in _read(log)] if log.exists() else []
    plan = schedule(aa, planted)[len(done) :]
    with tempfile.TemporaryDirectory(prefix="cbbench-gate-power-") as tmp:
        repo = scratch_clone(src, Path(tmp) / "repo")
        tags = {f: plant_step_delay(repo, f) for f in planted}
        clone = Tree("head", "clone", git(repo, "rev-parse", "HEAD"), repo, checked_out=False)
        env = arm_environment(import_root(clone, Path(tmp)))
        for k, fraction in enumerate(plan, start=len(done) + 1):
            cpu0 = _children_cpu()
            line = run_gate(repo, out, k, fraction, tags.get(fraction), gate_args, env)
            line["cpu_s"] = round(_children_cpu() - cpu0, 1)
            line.pop("runs_cpu_s", None)
            _append(log, line)
            (out / "summary.md").write_text(tabulate(_read(log)))
            print(
                f"gate {k}: {line['kind']} {fraction:g} -> {line.get('verdict')} ({line['wall_s']} s, load "
                f"{line['load_before']})",
                flush=True,
            )


def _append(path: Path, line: dict[str, Any]) -> None:
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(line)


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def tabulate(lines: Sequence[dict[str, str]]) -> str:
    """Markdown: per kind (A/A, each planted fraction), gates run, failed (the gate's exit 1), errors, the median /
    max wall and CPU minutes per gate, the load averages seen, and how many gates each metric failed."""
    groups: dict[str, list[dict[str, str]]] = {}
    for line in lines:
        f = float(line["fraction"])
        groups.setdefault("A/A" if f == 0 else f"planted {f:.0%}", []).append(line)
    out = [
        "| gates | run | failed | errors | wall min (median, max) | CPU min (median, max) | load (1 min) | failed on |",
        "|---|---:|---:|---:|---|---|---|---|",
    ]
    for name in sorted(groups, key=lambda n: (n != "A/A", float(n.split()[-1].rstrip("%")) if n != "A/A" else 0)):
        g = groups[name]
        ok = [x for x in g if x["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE")]
        failed = sum(x["verdict"] == "FAIL" for x in ok)
        walls = [float(x["wall_s"]) / 60 for x in g]
        cpus = [float(x["cpu_s"]) / 60 for x in g if x.get("cpu_s")]
        loads = [float(x["load_before"].split()[0]) for x in g if x.get("load_before")]
        on: dict[str, int] = {}  # which metrics regressed, over the gates that failed
        for x in ok:
            for metric, status in (json.loads(x["statuses"]) if x.get("statuses") else {}).items():
                on[metric] = on.get(metric, 0) + (status == "regressed")
        why = ", ".join(f"{m} {n}" for m, n in sorted(on.items(), key=lambda kv: -kv[1]) if n)
        out.append(
            f"| {name} | {len(ok)} | {failed} | {len(g) - len(ok)} | {statistics.median(walls):.1f}, {max(walls):.1f} "
            f"| {statistics.median(cpus):.1f}, {max(cpus):.1f} | {min(loads):.1f}-{max(loads):.1f} | {why} |"
            if cpus and loads
            else f"| {name} | {len(ok)} | {failed} | {len(g) - len(ok)} | | | | {why} |"
        )
    return "\n".join(out) + "\n"


def _planted(text: str) -> dict[float, int]:
    out = {}
    for item in text.split(","):
        if item.strip():
            f, _, n = item.partition(":")
            out[float(f)] = int(n or 10)
    return out


SKIP_DIRS = {"results", "build", "wheels", "__pycache__", "node_modules"}  # outputs, caches, wheelhouses


def snapshot(src: Path, dst: Path) -> Path:
    """`src`'s files as a new one-commit repository at `dst`: what git tracks or would track in `src` when it is a
    repository, else every file outside hidden folders (.git, .venv), SKIP_DIRS and *.egg-info."""
    listed = subprocess.run(
        ["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if listed.returncode == 0:
        files = [Path(p.decode()) for p in listed.stdout.split(b"\0") if p]
    else:
        files = []
        for folder, dirs, names in os.walk(src):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")]
            files += [Path(folder, n).relative_to(src) for n in names]
    for rel in files:
        if (src / rel).is_file() or (src / rel).is_symlink():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dst / rel, follow_symlinks=False)
    git(dst, "init", "--quiet")
    git(dst, "add", "--all")
    git(dst, "commit", "--quiet", "--message", "snapshot for an A/A gate")
    return dst


def aa(out: Path, gate_args: Sequence[str], src: Path) -> int:
    """One A/A gate of `src`'s files (module docstring); the exit code: 0 when the gate ran, else the gate's."""
    out = out.resolve()
    with tempfile.TemporaryDirectory(prefix="cbbench-gate-aa-") as tmp:
        repo = snapshot(src, Path(tmp) / "repo")
        clone = Tree("head", "snapshot", git(repo, "rev-parse", "HEAD"), repo, checked_out=False)
        env = arm_environment(import_root(clone, Path(tmp)))
        argv = [sys.executable, "-m", "cbbench.perf.cli", "gate", "--base", "HEAD", "--output", str(out)]
        argv += ["--format", "json", "--summary", str(out.with_suffix(".gate.md")), *gate_args]
        res = subprocess.run(argv, cwd=repo, env=env, stdout=subprocess.PIPE, check=False)
    if res.returncode not in (0, 1, EXIT_INCONCLUSIVE):
        print(f"A/A gate: could not run (exit {res.returncode})", flush=True)
        return res.returncode
    out.with_suffix(".gate.json").write_bytes(res.stdout)
    doc = json.loads(res.stdout)
    verdict = (
        "FAIL (a false alarm: both arms ran the same code)"
        if doc["regressed"]
        else f"INCONCLUSIVE ({doc['message'].partition(': ')[2]})"
        if doc.get("inconclusive")
        else "PASS"
    )
    worst = min(doc["rows"], key=lambda r: r["p_worse"] if r["p_worse"] is not None else 1.0)
    print(
        f"A/A gate: {verdict}; {doc['repeats']} runs per arm, {doc['tests']} tests, {doc['wall_s']:.0f} s; "
        f"smallest p {worst['p_worse']:.3g} ({worst['metric']}, ratio {worst['ratio']:.4f})",
        flush=True,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--repo", type=Path, default=Path.cwd(), help="the checkout measured (default: this folder)")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("campaign", help="A/A and planted gates into OUTDIR, tabulated as they finish")
    c.add_argument("out", type=Path)
    c.add_argument("--aa", type=int, default=20, help="A/A gates")
    c.add_argument("--planted", default="0.05:10,0.1:5,0.2:5", help="FRACTION:GATES, comma separated")
    c.add_argument("gate_args", nargs="*", help="after --: options for every `cbbench gate`")
    t = sub.add_parser("tabulate", help="the table of OUTDIR's gates")
    t.add_argument("out", type=Path)
    a = sub.add_parser("aa", help="one A/A gate of this checkout's files")
    a.add_argument("out", type=Path, help="the gate's CSV (its JSON verdict beside it: OUT.gate.json)")
    a.add_argument("gate_args", nargs="*", help="after --: options for `cbbench gate`")
    args = p.parse_args(argv)
    if shutil.which("git") is None:
        raise SystemExit("gate_power: git is needed")
    if args.command == "tabulate":
        print(tabulate(_read(args.out / "gates.csv")), end="")
        return 0
    src = args.repo.resolve()
    if args.command == "aa":
        return aa(args.out, args.gate_args, src)
    src = Path(git(src, "rev-parse", "--show-toplevel"))  # the repository whose HEAD is measured
    campaign(args.out, args.aa, _planted(args.planted), args.gate_args, src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
