"""Reading and writing result files: the CSV (checked on the way in) and the per-run JSON.

Each is written atomically (a temporary beside the target, then a rename), so a reader or an interrupt never sees
half a file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from glob import escape as glob_escape
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # imported where used: `compare` and `show` read with rows.py and start fast
    import pandas as pd


from cbbench.perf.results.cells import neutralise, restore
from cbbench.perf.results.columns import COLUMNS, METRIC_COLUMNS, SCHEMA_VERSION, upgrade_lines
from cbbench.perf.results.environment import environment_info

_FILE_ERROR_WORDS = {  # what a file error says about the file, with no `[Errno N]` for a user to decode
    FileNotFoundError: "no such file",
    PermissionError: "permission denied",
    IsADirectoryError: "is a folder, not a file",
    NotADirectoryError: "a part of the path is not a folder",
}


def file_error_line(e: OSError) -> str:
    """`PATH: no such file` for a file error (Python words it `[Errno 2] No such file or directory: 'PATH'`)."""
    words = next((w for t, w in _FILE_ERROR_WORDS.items() if isinstance(e, t)), e.strerror or type(e).__name__)
    return f"{e.filename}: {words}" if e.filename else str(words)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: a reader (or an interrupt)
    sees the old file or the new one, never half of one."""
    path = Path(path)
    if path.exists() and not path.is_file():  # the rename would replace a device (/dev/full) or fail on a folder
        raise ValueError(f"{path} exists and is not a regular file")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, file_mode(path))  # mkstemp makes 0600; a result file is as readable as any other
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries `atomic_write_text` left beside `path` when it was killed (SIGKILL) mid-write; call
    it before writing `path` again. Returns what was removed."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{glob_escape(path.name)}.*.tmp")) if path.parent.is_dir() else []
    for tmp in stale:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return stale


def file_mode(path: Path) -> int:
    if path.exists():
        return path.stat().st_mode & 0o777
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_csv(path: str | os.PathLike[str], rows: Sequence[Mapping[str, object]]) -> Path:
    """Write `rows` (replacing the file, atomically) with the fixed header."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="raise")
    w.writeheader()
    for row in rows:
        w.writerow({k: neutralise(v) for k, v in row.items()})
    return atomic_write_text(path, buf.getvalue())


def append_rows(path: str | os.PathLike[str], rows: Sequence[Mapping[str, object]]) -> Path:
    """Append rows, writing the header first for a new file; a file with another header raises ValueError."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return write_csv(path, rows)
    with path.open(newline="") as f:
        header = next(csv.reader(f), [])
    if tuple(header) != COLUMNS:
        raise ValueError(f"{path}: its header is not schema version {SCHEMA_VERSION}'s; write a new file")
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
        for row in rows:
            w.writerow({k: neutralise(v) for k, v in row.items()})
    return path


def column_difference(header: Sequence[str]) -> str:
    """How a header differs from this schema's columns, naming them: `extra column "x"; missing column "y"`."""
    have, want = list(header), list(COLUMNS)
    extra = [c for c in have if c not in want]
    missing = [c for c in want if c not in have]
    parts = [f"extra column {c!r}" for c in extra[:3]] + [f"missing column {c!r}" for c in missing[:3]]
    if len(extra) + len(missing) > 6:
        parts.append(f"{len(extra) + len(missing) - 6} more differences")
    if not parts:
        parts.append("the columns are in another order")
    return f"columns differ from schema version {SCHEMA_VERSION}: " + "; ".join(parts)


def read_named(path: str | os.PathLike[str]) -> str:
    """A results file's text, or one ValueError naming the file and why it cannot be read. A UTF-8 BOM (a
    spreadsheet or an editor added it) is not part of the text."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:  # a folder, no permission, a symlink loop, not UTF-8
        why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ValueError(f"{path}: cannot be read ({why})") from None


def checked_lines(path: str | os.PathLike[str]) -> tuple[str, list[list[str]]]:
    """A results CSV's text and its lines as cells: a cbbench results file, every line whole, the last one ended
    (ValueError naming the file). Shared by `read_csv` and rows.py's reader, which needs no pandas."""
    text = read_named(path)
    try:
        lines = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:  # e.g. a cell over csv's field size limit (131072 characters)
        raise ValueError(f"{path}: not a readable CSV ({e})") from None
    if not lines or "schema_version" not in lines[0]:
        raise ValueError(f"{path}: not a cbbench results CSV (no schema_version column)")
    for i, cells in enumerate(lines[1:], start=2):
        if len(cells) != len(lines[0]):
            raise ValueError(
                f"{path}: line {i} has {len(cells)} of {len(lines[0])} cells: the file is truncated or damaged"
            )
    if len(lines) > 1 and not text.endswith("\n"):
        raise ValueError(f"{path}: the last line does not end: the file is truncated")
    upgraded = upgrade_lines(lines)  # a file of an older schema reads as this one's
    if upgraded is not None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(upgraded)
        return buf.getvalue(), upgraded
    return text, lines


def read_csv(path: str | os.PathLike[str], *, allow_empty: bool = False) -> pd.DataFrame:
    """Read a results CSV, checking its schema version and columns, that every row is whole (a truncated file
    raises), that there is at least one row (unless `allow_empty`), and that metric cells are numbers."""
    import pandas as pd

    text, _ = checked_lines(path)
    df = pd.read_csv(io.StringIO(text), keep_default_na=True)
    versions = set(pd.to_numeric(df["schema_version"], errors="coerce").dropna().astype(int))
    if versions - {SCHEMA_VERSION}:
        raise ValueError(
            f"{path}: schema_version {sorted(versions)}, this cbbench reads {SCHEMA_VERSION} "
            "(rerun the baseline's configurations with `cbbench perf --like` to refresh it)"
        )
    if tuple(df.columns) != COLUMNS:
        raise ValueError(f"{path}: {column_difference(df.columns)}")
    for c in df.columns:  # user strings were marked against spreadsheet formulas when written (cells.py)
        if not pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]):
            df[c] = df[c].map(restore)
    if df.empty and not allow_empty:
        raise ValueError(f"{path}: no result rows (a header only)")
    for m in METRIC_COLUMNS:
        bad = df[m].notna() & pd.to_numeric(df[m], errors="coerce").isna()
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise ValueError(f"{path}: metric {m} holds {df[m].iloc[i]!r} on row {i + 1}, not a number")
    return df


def write_run_json(
    path: str | os.PathLike[str],
    *,
    config: Mapping[str, object],
    rows: Sequence[Mapping[str, object]],
    records: Mapping[str, Sequence[Mapping[str, object]]] | Sequence[Mapping[str, object]],
    workload: object = None,
    environment: Mapping[str, object] | None = None,
    steps: object = None,
    server_metrics: Mapping[str, object] | None = None,
) -> Path:
    """The full record of a perf invocation: environment, config, workload, CSV rows, per-request records
    (a list, or a dict run-label -> list), and optionally the per-step traces and, for HTTP runs, the scraped
    /metrics series by run label (`server_metrics`, only when there is one). Non-finite floats become strings."""
    device = config.get("device")
    doc: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "environment": dict(environment) if environment is not None else environment_info(_text(device)),
        "config": dict(config),
        "workload": workload_dict(workload),
        "rows": list(rows),
        "records": records,
        "steps": steps,
    }
    if server_metrics:
        doc["server_metrics"] = dict(server_metrics)
    return atomic_write_text(path, json.dumps(jsonable(doc), indent=1, default=str))


def _text(v: object) -> str | None:
    return None if v is None else str(v)


@runtime_checkable
class SavedAsDict(Protocol):
    """What a run JSON saves of a workload (a `workloads.Workload` is one)."""

    def to_dict(self) -> Mapping[str, object]: ...


def workload_dict(workload: object) -> object:
    """A run JSON's `workload`: the workload's `to_dict()`, or what was given (its dict, or None)."""
    return workload.to_dict() if isinstance(workload, SavedAsDict) else workload


def jsonable(x: object) -> object:
    """Strict JSON: inf / nan as strings, tuples as lists, numpy scalars as Python numbers (anything else as it is:
    `json.dumps(default=str)` writes it as text)."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    np = sys.modules.get("numpy")  # a numpy value exists only once numpy is imported: no import just to check
    if np is not None and isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if np is not None and isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x
