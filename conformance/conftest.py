"""Shared pytest setup for the conformance suite: the `--engine` option and its adapter fixture, `--base-url` (the
server the HTTP suite in conformance/http talks to), and the Hypothesis profiles (`ci`, the default, and
`thorough`, for nightly runs), chosen by CBBENCH_HYPOTHESIS_PROFILE.

Profiles only set defaults: a test's own `@settings(max_examples=...)` still wins, so the kernel tests keep theirs.
"""
import os

import pytest
from hypothesis import HealthCheck, settings

import conformance._triton_env  # noqa: F401  (must run before anything imports the Triton kernels)
from conformance.adapters import ADAPTERS, load_adapter

PROFILE_ENV = "CBBENCH_HYPOTHESIS_PROFILE"

# Stateful scheduler runs are many small steps each; `deadline=None` because a shared 2-core CI box makes per-example
# timing meaningless, and too_slow is suppressed for the same reason.
_COMMON = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=100, stateful_step_count=40, **_COMMON)
settings.register_profile("thorough", max_examples=1500, stateful_step_count=80, **_COMMON)
settings.load_profile(os.environ.get(PROFILE_ENV, "ci"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        action="store",
        default="refengine",
        choices=sorted(ADAPTERS),
        help="which scheduler the engine-agnostic conformance tests drive (through conformance/adapters)",
    )
    parser.addoption(
        "--base-url",
        action="store",
        default=None,
        help="run the HTTP suite (conformance/http) against this OpenAI-compatible server, e.g. "
        "http://127.0.0.1:8000; without it the suite starts its own `cbbench serve`",
    )


@pytest.fixture(scope="session")
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.config.getoption("--engine")


@pytest.fixture(scope="session")
def adapter_cls(engine_name: str):
    """The SchedulerAdapter class of the engine under test; skips when that engine is not installed."""
    if engine_name == "vllm":
        pytest.importorskip("vllm", reason="--engine vllm needs vllm installed (see README: 'Checking another engine')")
    try:
        return load_adapter(engine_name)
    except ImportError as e:  # the adapter module itself, or something it needs, is missing
        pytest.skip(f"--engine {engine_name}: adapter not importable ({e})")
