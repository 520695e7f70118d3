"""Kernel launches per decoder layer of one eager forward (`python -m benchmarks.launches`).

On a GPU every launch costs host time (a torch op's dispatch, a Triton launch's argument handling) whether or not
the kernel is big, so a small model's eager step is bound by how many it launches. This counts them on the CPU with
torch.profiler over one forward of a preset: a mixed step (a prefill chunk beside decodes, after a prefill that
filled the cache), for

- refengine with the torch attention backend: the layers run the kernels' torch oracles (kernels/reference.py);
- refengine with the triton backend (the GPU's path: on a GPU when there is one, else through TRITON_INTERPRET=1,
  so at a tiny shape): the fused Triton kernels and the merged GEMMs;
- the transformers twin (same weights, eager attention, one sequence): op for op what refengine's decoder computed
  before its projections were merged and its norms, RoPE and SiLU-and-mul fused, so its counts are the "before".

What is counted, per decoder layer (inside `*DecoderLayer` forwards, averaged over the layers) and per forward:
- torch ops: aten ops called from Python (a composite op such as aten::linear counts once): the dispatches;
- kernels: the ops that compute, i.e. aten ops that are not views, allocations or no-op conversions and have no
  such op under them, and GEMMs (COMPUTE), plus Triton launches (the interpreter's own torch calls inside a launch
  are not counted);
- triton: the Triton launches among them.
On a GPU the torch backend's attention (host-planned gathers, per-sequence loops) is not what runs, so compare the
triton row's kernels with vLLM's ~10 per layer, and the torch row with the transformers row.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

if not torch.cuda.is_available():  # before cbbench.kernels is imported: Triton reads it when kernels are decorated
    os.environ.setdefault("TRITON_INTERPRET", "1")

from refengine.layers.attention import AttentionMetadata  # noqa: E402
from refengine.models.decoder import CausalLM  # noqa: E402
from refengine.models.model_config import ModelConfig  # noqa: E402

LAYER_RANGE = "cbbench::decoder_layer"
ATTENTION_RANGE = "cbbench::attention"  # the KV store and the attention itself (the backend's two calls)
TRITON_RANGE = "cbbench::triton::"  # + the kernel's name
# aten ops that launch no kernel: views, allocations, and conversions that return their input (a conversion that
# copies has an aten::copy_ under it, which is counted)
NO_KERNEL = frozenset(
    "aten::" + op
    for op in (
        "view", "_unsafe_view", "reshape", "slice", "select", "narrow", "as_strided", "t", "transpose", "permute",
        "expand", "unsqueeze", "squeeze", "split", "split_with_sizes", "chunk", "unbind", "alias", "detach",
        "lift_fresh", "empty", "empty_like", "empty_strided", "resize_", "to", "contiguous", "numpy_T", "view_as",
        "result_type", "is_nonzero", "item", "_local_scalar_dense", "resolve_conj", "resolve_neg", "_reshape_alias",
        "expand_as", "detach_", "as_strided_", "dropout",  # (dropout in eval mode returns its input)
    )
)  # fmt: skip
# ops that compute although aten ops run under them (on the CPU, addmm copies the bias into its output first)
COMPUTE = frozenset(
    "aten::" + op for op in ("addmm", "mm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu")
)
BLOCK_SIZE = 16
PREFILL_LEN = 24  # the first step: one prompt, caching KV for the decodes of the profiled step
CHUNK_LEN = 8  # the profiled step: a prefill chunk of this many tokens beside NUM_DECODES decodes
NUM_DECODES = 3


@dataclass(frozen=True)
class LaunchCount:
    """The launches of one forward, in total and per decoder layer (see the module docstring)."""

    path: str
    num_layers: int
    torch_ops: int
    kernels: int
    triton: int
    layer_torch_ops: int  # inside the decoder layers, all of them
    layer_kernels: int
    layer_triton: int
    layer_attention_kernels: int  # of layer_kernels, those of the KV store and the attention

    def per_layer(self, field: str) -> float:
        return float(getattr(self, f"layer_{field}")) / self.num_layers


@contextmanager
def _layer_ranges(model: torch.nn.Module) -> Iterator[None]:
    """A profiler range around every `*DecoderLayer` forward (refengine's and transformers' alike)."""
    open_ranges: list[ExitStack] = []

    def pre(module: torch.nn.Module, args: Any) -> None:
        stack = ExitStack()
        stack.enter_context(torch.profiler.record_function(LAYER_RANGE))
        open_ranges.append(stack)

    def post(module: torch.nn.Module, args: Any, out: Any) -> None:
        open_ranges.pop().close()

    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    handles = [h for m in layers for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _function_ranges(targets: list[tuple[Any, str]], name: str) -> Iterator[None]:
    """A profiler range `name` around every call of each (module, function name), while inside."""
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr in targets]

    def ranged(fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with torch.profiler.record_function(name):
                return fn(*args, **kwargs)

        return wrapper

    try:
        for owner, attr, fn in saved:
            setattr(owner, attr, ranged(fn))
        yield
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


@contextmanager
def _triton_ranges() -> Iterator[None]:
    """A profiler range around every Triton launch (compiled or interpreted), named after its kernel."""
    import triton.runtime.interpreter as interpreter
    import triton.runtime.jit as jit

    classes = (jit.JITFunction, interpreter.InterpretedFunction)
    saved = [cls.__dict__["run"] for cls in classes]

    def ranged(run: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with torch.profiler.record_function(TRITON_RANGE + self.fn.__name__):
                return run(self, *args, **kwargs)

        return wrapper

    try:
        for cls, run in zip(classes, saved):
            cls.run = ranged(run)
        yield
    finally:
        for cls, run in zip(classes, saved):
            cls.run = run


def _count(events: Any, path: str, num_layers: int) -> LaunchCount:
    """Classify the profiler's events: every aten op and Triton range, each attributed to a decoder layer or not."""
    totals = {"torch_ops": 0, "kernels": 0, "triton": 0}
    layer = dict(totals)
    attention_kernels = 0
    for e in events:
        ancestors = []
        p = e.cpu_parent
        while p is not None:
            ancestors.append(p.name)
            p = p.cpu_parent
        if any(a.startswith(TRITON_RANGE) for a in ancestors):
            continue  # the interpreter's own torch calls inside a launch
        kinds = []
        if e.name.startswith(TRITON_RANGE):
            kinds = ["kernels", "triton"]
        elif e.name.startswith("aten::"):
            if not any(a.startswith("aten::") for a in ancestors):
                kinds.append("torch_ops")
            leaf = not any(c.name.startswith("aten::") and c.name not in NO_KERNEL for c in e.cpu_children)
            if e.name in COMPUTE or (leaf and e.name not in NO_KERNEL):
                kinds.append("kernels")
        for k in kinds:
            totals[k] += 1
            if LAYER_RANGE in ancestors:
                layer[k] += 1
                attention_kernels += k == "kernels" and ATTENTION_RANGE in ancestors
    return LaunchCount(
        path,
        num_layers,
        **totals,
        **{f"layer_{k}": v for k, v in layer.items()},
        layer_attention_kernels=attention_kernels,
    )  # (names as the fields)


def _profile(
    fn: Any, model: torch.nn.Module, path: str, num_layers: int, triton: bool, attention: list[tuple[Any, str]]
) -> LaunchCount:
    with ExitStack() as stack:
        stack.enter_context(_layer_ranges(model))
        stack.enter_context(_function_ranges(attention, ATTENTION_RANGE))
        if triton:
            stack.enter_context(_triton_ranges())
        prof = stack.enter_context(torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]))
        with torch.inference_mode():
            fn()
    return _count(prof.events(), path, num_layers)


def _meta(
    seqs: list[tuple[int, int]], block_tables: list[list[int]], device: torch.device
) -> tuple[torch.Tensor, AttentionMetadata]:
    """seqs: (tokens already cached, new tokens) per sequence, with their block tables -> positions, metadata."""
    positions: list[int] = []
    slots: list[int] = []
    qsl, seq_lens = [0], []
    for (start, n), table in zip(seqs, block_tables):
        for pos in range(start, start + n):
            positions.append(pos)
            slots.append(table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
        qsl.append(qsl[-1] + n)
        seq_lens.append(start + n)
    width = max(len(t) for t in block_tables)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32, device=device),
        max_query_len=max(n for _, n in seqs),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
    )
    return torch.tensor(positions, dtype=torch.int64, device=device), meta


def count_refengine(config: ModelConfig, backend: str, *, seed: int = 0) -> tuple[LaunchCount, CausalLM]:
    """One mixed step of refengine's model (attention backend `backend`) under the profiler; returns its count and
    the model (for the transformers twin)."""
    import refengine.layers.attention as attention_layer
    from refengine.models.loader import build_random_model

    # the backend's functions, wrapped before the model is built (its backend holds the functions it was built with)
    attention: list[tuple[Any, str]] = [
        (attention_layer, "reshape_and_cache_ref"),
        (attention_layer, "unified_attention_cpu"),
    ]
    if backend == "triton":
        import cbbench.kernels.triton_reshape_and_cache as rc
        import cbbench.kernels.triton_unified_attention as ua

        attention = [(rc, "reshape_and_cache"), (ua, "unified_attention")]
    # the triton path on a GPU when there is one (compiled kernels need CUDA tensors), else in the interpreter
    device = torch.device("cuda" if backend == "triton" and torch.cuda.is_available() else "cpu")
    with _function_ranges(attention, ATTENTION_RANGE):
        model = build_random_model(config, seed=seed, attention_backend=backend, device=device)
    blocks_per_seq = -(-(PREFILL_LEN + 1) // BLOCK_SIZE)
    num_seqs = 1 + NUM_DECODES
    shape = (num_seqs * blocks_per_seq + 1, BLOCK_SIZE, config.num_key_value_heads, config.head_dim)
    dtype = model.lm_head.weight.dtype
    kv_caches = [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in model.model.layers
    ]
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(num_seqs)]
    gen = torch.Generator().manual_seed(seed)

    def inputs(seqs: list[tuple[int, int]], seq_tables: list[list[int]]) -> tuple[Any, ...]:
        positions, meta = _meta(seqs, seq_tables, device)
        ids = torch.randint(0, config.vocab_size, (positions.shape[0],), generator=gen).to(device)
        return ids, positions, kv_caches, meta

    with torch.inference_mode():  # the decodes' contexts: NUM_DECODES prompts of PREFILL_LEN
        model(*inputs([(0, PREFILL_LEN)] * NUM_DECODES, tables[1:]))
    step = inputs([(0, CHUNK_LEN)] + [(PREFILL_LEN, 1)] * NUM_DECODES, tables)
    interpreted = backend == "triton" and device.type == "cpu"
    path = f"refengine {backend}" + (" (interpreted)" if interpreted else "")
    count = _profile(lambda: model(*step), model, path, config.num_hidden_layers, backend == "triton", [])
    return count, model


def count_transformers(model: CausalLM, config: ModelConfig) -> LaunchCount:
    """The transformers twin of `model` (same weights, eager attention): one forward of a CHUNK_LEN prompt."""
    from refengine.models.hf_twin import to_hf_model

    hf = to_hf_model(model, config)
    ids = torch.randint(0, config.vocab_size, (1, CHUNK_LEN), generator=torch.Generator().manual_seed(0))
    ids = ids.to(model.lm_head.weight.device)
    # transformers looks its attention function up in the model's module at every call
    attention = [(sys.modules[type(hf.model.layers[0].self_attn).__module__], "eager_attention_forward")]
    return _profile(lambda: hf(ids), hf, "transformers (eager)", config.num_hidden_layers, False, attention)


def measure(model: str, triton_model: str | None) -> list[LaunchCount]:
    """The three counts: refengine torch on `model`, refengine triton on `triton_model` (None: skipped), and the
    transformers twin of the torch one."""
    from refengine.models.presets import load_model_config

    config = load_model_config(model)
    torch_count, lm = count_refengine(config, "torch")
    counts = [torch_count, count_transformers(lm, config)]
    del lm
    if triton_model is not None:
        counts.insert(1, count_refengine(load_model_config(triton_model), "triton")[0])
    return counts


def _outside(c: LaunchCount) -> float:
    return c.per_layer("kernels") - c.per_layer("attention_kernels")


def format_table(counts: list[LaunchCount]) -> str:
    head = f"{'path':<30} {'layers':>6} {'torch ops/layer':>16} {'kernels/layer':>14} {'of them attention':>18}"
    head += f" {'Triton/layer':>13} {'torch ops/fwd':>14} {'kernels/fwd':>12}"
    lines = [head]
    for c in counts:
        lines.append(
            f"{c.path:<30} {c.num_layers:>6} {c.per_layer('torch_ops'):>16.1f} {c.per_layer('kernels'):>14.1f}"
            f" {c.per_layer('attention_kernels'):>18.1f} {c.per_layer('triton'):>13.1f} {c.torch_ops:>14}"
            f" {c.kernels:>12}"
        )
    by_path = {c.path.split(" (")[0]: c for c in counts}
    ref, hf = by_path.get("refengine torch"), by_path.get("transformers")
    tri = by_path.get("refengine triton")
    if ref and hf:
        lines.append(
            "transformers / refengine torch, kernels per layer outside attention (the torch attention backend plans"
            f" on the host): {_outside(hf) / _outside(ref):.2f}x"
        )
    if tri and hf:
        lines.append(
            f"transformers / refengine triton, kernels per layer: {hf.per_layer('kernels') / tri.per_layer('kernels'):.2f}x"
            f" ({tri.per_layer('kernels'):.0f} launches, {tri.per_layer('triton'):.0f} of them Triton);"
            f" outside attention: {_outside(hf) / _outside(tri):.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.launches", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen2", help="preset for the torch path and the transformers twin")
    ap.add_argument(
        "--triton-model",
        default="tiny-qwen2",
        help="preset for the triton path ('none' skips it; on a CPU it runs in Triton's interpreter: keep it tiny)",
    )
    a = ap.parse_args(argv)
    counts = measure(a.model, None if a.triton_model == "none" else a.triton_model)
    print(f"one eager forward: a prefill chunk of {CHUNK_LEN} tokens beside {NUM_DECODES} decodes (transformers:")
    print(f"one prompt of {CHUNK_LEN}); torch {torch.__version__}, counted by torch.profiler")
    print(format_table(counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
