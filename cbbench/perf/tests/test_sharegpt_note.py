"""The ShareGPT loader's note about a cut-off file: said once per process, at INFO, never as a warning."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from cbbench.workloads import sharegpt as sharegpt_mod
from cbbench.workloads.sharegpt import load_sharegpt

LOGGER = "cbbench.workloads.sharegpt"


def _cut_file(path, n: int = 5) -> None:
    recs = [
        {
            "id": f"r{i}",
            "conversations": [{"from": "human", "value": "p " * (5 + i)}, {"from": "gpt", "value": "o " * (5 + i)}],
        }
        for i in range(n)
    ]
    text = json.dumps(recs)
    path.write_text(text[: text.rindex('{"id"') + 12])  # cut inside the last record


def test_truncation_note_is_info_and_said_once(tmp_path, caplog):
    path = tmp_path / "cut.json"
    _cut_file(path)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    for _ in range(3):
        sharegpt_mod._load_cached.cache_clear()  # parse afresh each time, as after a cache eviction
        data = load_sharegpt(path)
        assert data.truncated and data.num_records == 4
    notes = [r for r in caplog.records if r.name == LOGGER]
    assert len(notes) == 1
    assert notes[0].levelno == logging.INFO
    assert "4 complete records" in notes[0].getMessage()


def test_nothing_reaches_stderr_by_default(tmp_path):
    """In a plain process (no logging configured, as the CLI) an INFO note prints nothing; a warning would print
    through logging's last-resort handler. A subprocess, because pytest's own log capture hides that handler."""
    path = tmp_path / "cut2.json"
    _cut_file(path, 6)
    code = "import sys; from cbbench.workloads.sharegpt import load_sharegpt; load_sharegpt(sys.argv[1]); load_sharegpt(sys.argv[1])"
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
