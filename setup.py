"""cbbench's import names, which pyproject.toml cannot spell: the folders kernels/, perf/ and workloads/ install as
`cbbench.kernels`, `cbbench.perf` and `cbbench.workloads` (PyPI has distributions named `kernels` and `perf`, and
transformers >= 5.25 installs Hugging Face's `kernels`), and refengine/ as `refengine`, the name its public API
(SPEC) uses. The folders have no __init__.py at their top, so that from the repository's root they never shadow
another distribution's `kernels` or `perf`. Everything else about the distribution is in pyproject.toml.
"""

from setuptools import find_namespace_packages, find_packages, setup

NAMESPACED = ("kernels", "perf", "workloads")  # folder -> import name cbbench.<folder>
TESTS = ["tests", "tests.*", "*.tests", "*.tests.*"]

packages = find_packages(include=["refengine", "refengine.*"], exclude=TESTS)
package_dir = {}
for folder in NAMESPACED:
    package_dir[f"cbbench.{folder}"] = folder
    packages += [f"cbbench.{folder}"]
    packages += [f"cbbench.{folder}.{p}" for p in find_namespace_packages(where=folder, exclude=TESTS)]

setup(packages=packages, package_dir=package_dir)
