"""The quick pass of the mutation score: scheduler-side mutants against the recorded vLLM traces only, in one process.

    python -m conformance.mutate_replay [--only NAME ...]

For the mutants of the scheduler, waiting queue, block pool and KV manager (`REPLAY_MODULES`), a pytest start per
mutant costs far more than the check (torch's import alone; the replay of all traces takes seconds). Here one worker
process imports the temporary copy once (conformance.mutate's copy, never the working tree), and for each mutant
patches the file, reloads those modules in dependency order, replays every recorded trace
(conformance/test_recorded_traces.py's check) and restores the file. A mutant is killed when some trace diverges or
the engine raises; `python -m conformance.mutate` runs the full subsets of the same mutants.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.mutants import MUTANTS, Mutant
from conformance.mutate import check_copy_is_imported, copy_tree

# reloaded in this order after each patch: each one's `from ... import` then picks up the patched classes
REPLAY_MODULES = [
    "refengine.kv_cache.block_pool",
    "refengine.kv_cache.kv_cache_manager",
    "refengine.scheduler.request_queue",
    "refengine.scheduler.preemption",
    "refengine.scheduler.batching",
    "refengine.scheduler.scheduler",
    "refengine.scheduler",  # the package re-exports Scheduler: reloaded, it re-binds the patched class
    "conformance.adapters.refengine_adapter",
]
REPLAY_PATHS = {m.replace(".", "/") + ".py" for m in REPLAY_MODULES}


def _reload() -> None:
    for name in REPLAY_MODULES:
        importlib.reload(importlib.import_module(name))


def _kills(rows: list[dict], recorded_with: str) -> str | None:
    """The first divergence (or error) of the current refengine on the corpus, or None if every trace replays."""
    from conformance.adapters.refengine_adapter import RefEngineAdapter
    from conformance.progress import guarded
    from conformance.sched_traces import TraceDivergence, replay

    for row in rows:
        try:  # (guarded: a mutant that loops inside a step is a kill, not a hang of the whole pass)
            replay(guarded(RefEngineAdapter), row, recorded_with)
        except TraceDivergence as e:
            return str(e).splitlines()[0]
        except Exception as e:  # noqa: BLE001 (a crash the bug causes kills it too)
            return f"trace {row['id']}: {type(e).__name__}: {e}"
    return None


def worker(tree: Path, names: list[str]) -> None:
    """Runs inside the copy (PYTHONPATH=tree); prints one JSON line per mutant."""
    from conformance.test_recorded_traces import HEADER, ROWS

    chosen = [m for m in MUTANTS if m.name in names]
    for m in chosen:
        target = tree / m.path
        original = target.read_text()
        if original.count(m.old) != 1:
            print(json.dumps([m.name, "stale", 0.0, ""]), flush=True)
            continue
        start = time.monotonic()
        target.write_text(original.replace(m.old, m.new))
        try:
            _reload()
            why = _kills(ROWS, HEADER["recorded_with"])
        except Exception as e:  # noqa: BLE001 (the patched module does not even import)
            why = f"import: {type(e).__name__}: {e}"
        finally:
            target.write_text(original)
            _reload()
        verdict = "survived" if why is None else "killed"
        print(json.dumps([m.name, verdict, time.monotonic() - start, why or ""]), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.mutate_replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    mutants = [m for m in MUTANTS if m.path in REPLAY_PATHS and (args.only is None or m.name in args.only)]
    if args.worker is not None:
        worker(args.worker, [m.name for m in mutants])
        return 0
    results: list[tuple[Mutant, str]] = []
    with tempfile.TemporaryDirectory(prefix="cbbench-mutate-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        check_copy_is_imported(tree)
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [
            sys.executable,
            "-m",
            "conformance.mutate_replay",
            "--worker",
            str(tree),
            "--only",
            *[m.name for m in mutants],
        ]
        with subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, text=True) as p:
            for line in p.stdout:
                name, verdict, secs, why = json.loads(line)
                print(f"{name}: {verdict} ({secs:.1f}s) {why[:160]}", flush=True)
                results.append((next(m for m in mutants if m.name == name), verdict))
        if p.returncode != 0:
            print(f"worker failed (exit {p.returncode})", file=sys.stderr)
            return 2
    killed = sum(v == "killed" for _, v in results)
    scored = sum(v != "stale" for _, v in results)
    print(f"replay score: {killed}/{scored} killed, {len(results) - scored} stale")
    return 1 if killed < scored else 0


if __name__ == "__main__":
    sys.exit(main())
