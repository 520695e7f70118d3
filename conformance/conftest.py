"""Shared pytest setup for the conformance suite: the `--engine` option and its adapter fixture, `--base-url` (the
server the HTTP suite in conformance/http talks to), and the Hypothesis profile (conformance/hypothesis_profiles.py:
`fast`, the default, `ci`, and `thorough`, for nightly runs), chosen by CBBENCH_HYPOTHESIS_PROFILE.

Profiles only set defaults: a test's own `@settings(max_examples=...)` still wins, so the kernel tests keep theirs.
"""

import pytest

import conformance._triton_env  # noqa: F401  (must run before anything imports the Triton kernels)
from conformance import hypothesis_profiles
from conformance.adapters import ADAPTERS, load_adapter

hypothesis_profiles.load()  # fast (the default) / ci / thorough, by CBBENCH_HYPOTHESIS_PROFILE


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
        pytest.importorskip(
            "vllm",
            reason="--engine vllm needs vllm installed (see docs/conformance.md: 'Checking another engine's scheduler')",
        )
    try:
        return load_adapter(engine_name)
    except ImportError as e:  # the adapter module itself, or something it needs, is missing
        pytest.skip(f"--engine {engine_name}: adapter not importable ({e})")
