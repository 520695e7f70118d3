"""The backends a perf run drives, one `Backend` each, registered by name (`base.py`, `registry.py`)."""
