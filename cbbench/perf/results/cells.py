"""How a user's string is stored in a results CSV cell, and read back.

A spreadsheet runs a cell that starts with `=`, `+`, `-` or `@` as a formula, so a `--label` such as `=HYPERLINK(..)`
would run when a user opens the CSV. `neutralise` prefixes such a text cell with `'` (the spreadsheet's own
"this is text" mark, which it does not show); a cell that already starts with `'` gets one more, so `restore`
(which drops one leading `'`) gives back exactly the string that was written. Numbers (`-1.5`, `-inf`) are left
alone: a spreadsheet reads them as numbers, never as formulas.
"""

from __future__ import annotations

import math
from typing import overload

FORMULA_STARTS = ("=", "+", "-", "@")  # what a spreadsheet takes for the start of a formula
TEXT_MARK = "'"


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def neutralise(v: object) -> object:
    """The cell to write for `v`: non-finite floats as "inf" / "nan" (pandas reads them back), formula-like text
    marked as text."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, str) and v.startswith((*FORMULA_STARTS, TEXT_MARK)) and not _is_number(v):
        return TEXT_MARK + v
    return v


@overload
def restore(v: str) -> str: ...
@overload
def restore(v: object) -> object: ...
def restore(v: object) -> object:
    """The string `neutralise` was given (cells that are not text pass through)."""
    if isinstance(v, str) and v.startswith(TEXT_MARK):
        return v[1:]
    return v
