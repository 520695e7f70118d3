"""How the command line words what the API says: an API error names the field (`max_num_seqs must be ...`); a
`cbbench` command names the flag the user typed (`--max-num-seqs must be ...`). The API's ValueErrors keep the
field's name; `cbbench.perf.cli.app.one_line_errors` rewords them on their way to stderr.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# What is reworded: a snake_case option name anywhere in the message (never inside a path or a flag), and a
# one-word option name that starts it as its subject (`device: ...`, `seed must ...`): a one-word name elsewhere
# is as likely an English word ("the device is busy").
_SNAKE = re.compile(r"(?<![\w/.-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w/.-])")
_SUBJECT = re.compile(r"^[a-z][a-z0-9]*(?=:| must )")


def flag_wording(message: str, params: Sequence[Any]) -> str:
    """`message` with the command's option names (its click `params`) spelled as their flags (see above)."""
    flags: dict[str, str] = {
        p.name: p.opts[0] for p in params if p.name and getattr(p, "opts", None) and p.opts[0].startswith("--")
    }

    def flag(m: re.Match[str]) -> str:
        return flags.get(m.group(0), m.group(0))

    return _SUBJECT.sub(flag, _SNAKE.sub(flag, message), count=1)
