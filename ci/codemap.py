"""The project's one code map, docs/architecture.md, made from each module's docstring.

    python ci/codemap.py            # rewrite the table in docs/architecture.md
    python ci/codemap.py --check    # exit 1 if it is out of date (a test runs this)

Every module of refengine/, cbbench/ (kernels, workloads, perf), benchmarks/ and conformance/ (tests aside) gets one
row: its path and the first paragraph of its docstring. A module without a docstring is an error: the docstring says
what the file owns, so the map cannot rot. The text around the table (between the markers) is written by hand.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
FOLDERS = ("refengine", "cbbench", "benchmarks", "conformance")
BEGIN, END = "<!-- codemap:begin -->", "<!-- codemap:end -->"


def _is_test(path: Path) -> bool:
    return "tests" in path.parts or path.name.startswith("test_") or path.name == "conftest.py"


def rows() -> list[str]:
    out, missing = [], []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if _is_test(rel) or (path.name == "__init__.py" and path.stat().st_size == 0):
                continue
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            if not doc:
                missing.append(str(rel))
                continue
            first = " ".join(doc.strip().split("\n\n")[0].split())
            out.append(f"| `{rel}` | {first.replace('|', '/')} |")
    if missing:
        raise SystemExit("modules without a docstring (say what the file owns): " + ", ".join(missing))
    return out


def render(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    table = "\n".join(["| module | owns |", "|---|---|", *rows()])
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/architecture.md is out of date")
    args = ap.parse_args()
    text = DOC.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        print(f"{DOC.relative_to(ROOT)}: no {BEGIN} ... {END} markers", file=sys.stderr)
        return 2
    new = render(text)
    if args.check:
        if new != text:
            print("docs/architecture.md is out of date: run python ci/codemap.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
