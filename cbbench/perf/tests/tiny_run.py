"""The tiny `cbbench perf` run the CLI tests share: 3 fixed requests (8 prompt, 4 output tokens) on the test suites'
model (tiny-qwen2 with an 8192-row vocabulary), 2 slots, one warm-up, quiet. A test appends what it varies (`--peers`, `--batching`, ...)."""

from refengine.models.presets import TEST_MODEL

TINY_RUN = [
    "--model",
    TEST_MODEL,
    "--workload",
    "fixed",
    "--workload-param",
    "input_len=8,output_len=4",
    "--num-prompts",
    "3",
    "--max-num-seqs",
    "2",
    "--warmup",
    "1",
    "--cpu-threads",
    "0",
    "--quiet",
]
