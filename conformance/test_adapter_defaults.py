"""The knobs every adapter takes (conformance/adapters/__init__.py's ADAPTER_KNOB_DEFAULTS) are refengine's, with
refengine's defaults: a foreign adapter fills a knob a test leaves out with exactly what refengine would use, so a
difference a test reports is the engine's, not a default's. async_scheduling is the one knob refengine resolves by
device (None: on for CUDA); a model-free scheduler has no device, so the adapters run it off unless asked."""

from __future__ import annotations

import dataclasses

from conformance.adapters import ADAPTER_KNOB_DEFAULTS
from refengine.config import SchedulerConfig

RESOLVED_BY_DEVICE = {"async_scheduling": False}


def test_the_adapters_defaults_are_refengines():
    ours = {f.name: f.default for f in dataclasses.fields(SchedulerConfig) if f.name in ADAPTER_KNOB_DEFAULTS}
    assert set(ours) == set(ADAPTER_KNOB_DEFAULTS), set(ADAPTER_KNOB_DEFAULTS) - set(ours)
    assert {**ours, **RESOLVED_BY_DEVICE} == ADAPTER_KNOB_DEFAULTS
