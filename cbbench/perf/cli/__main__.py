"""`python -m cbbench.perf.cli`: the `cbbench` command (how ci/ runs it from a checkout)."""

import sys

from cbbench.perf.cli.main import app

sys.exit(app())
