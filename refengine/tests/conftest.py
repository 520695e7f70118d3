"""Shared pytest setup for refengine's own unit tests: the Triton interpreter switch and the suite's Hypothesis
profile, the same two things conformance/conftest.py sets up, so that these tests run alike alone or beside it.

The profile (`fast`, the default, `ci` or `thorough`) is chosen by CBBENCH_HYPOTHESIS_PROFILE; see
conformance/hypothesis_profiles.py.
"""

import conformance._triton_env  # noqa: F401  (must run before anything imports the Triton kernels)
from conformance import hypothesis_profiles

hypothesis_profiles.load()  # fast (the default) / ci / thorough, by CBBENCH_HYPOTHESIS_PROFILE
