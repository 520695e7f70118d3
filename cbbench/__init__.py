"""cbbench: a benchmark and conformance harness for continuous-batching LLM inference.

What it installs, by import name:
- `refengine`: the reference engine (`from refengine import LLM, LLMEngine, SamplingParams`), its own package;
- `cbbench.kernels`: the Triton kernels the engine runs and their torch oracle;
- `cbbench.workloads`: the request workloads a benchmark replays (ShareGPT, synthetic, custom files, traces);
- `cbbench.perf`: the `cbbench` command and its Python API: runs, metrics, result files, compare and the gate.

The repository keeps the design card's top-level folders: kernels/, perf/ and workloads/ there are links to the
packages in this folder, so that every tool that resolves `cbbench.<name>` by path (type checkers, IDEs, import
graphs) finds the code, and a reader who opens kernels/ finds it too.
"""
