"""The decoding engine that `cbbench bench-step` times: an LLMEngine with N requests past their prefill, and the stub
model that stands in for its forward pass (perf/bench/step.py does the measuring and the printing).

What a GPU would hide is taken out: the stub model's forward returns zeros of the right shape at once and its
compute_logits returns a fixed, pseudo-random argmax pattern, so that the step's own host work is what is left.

Logits width. The stub's logits row is STUB_VOCAB wide instead of the model's 151936: on a CPU an argmax over
256 x 151936 floats is ~40M elements of arithmetic (tens of ms here) that a GPU does in microseconds, and it would
swamp the host work being measured. The sampled ids therefore lie in [0, STUB_VOCAB): real Qwen BPE tokens (byte
tokens and common merges), so the detokenizer sees realistic text, including UTF-8 characters split across tokens.

While timed, the stub also stands in for the sampler's kernels (`StubModel.sample`: the ids it made the argmax of;
every request is greedy with nothing masked, so that is exactly what `refengine.worker.model_runner.sample` returns) and
its logits are a placeholder; perf/bench/step.py's docstring says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # (step.py imports this module: the clock's type only, no import cycle at run time)
    from cbbench.perf.bench.step import _DeviceClock
    from refengine import LLMEngine
    from refengine.engine.detokenizer import IncrementalDetokenizer
    from refengine.request import Request
    from refengine.sample.sampler import SamplingMetadata

PROMPT_LEN = 32
STUB_VOCAB = 2048  # see the module docstring: real BPE ids, narrow enough that the argmax is not the benchmark
_PATTERN_LEN = 997  # a prime, so request r at step k (id = pattern[(7 r + k) % len]) never repeats in lockstep
_MAX_MODEL_LEN = 4096


class StubModel(torch.nn.Module):
    """Stands in for CausalLM: forward -> zeros [T, hidden]; compute_logits -> one-hot rows of a fixed pattern."""

    def __init__(self, hidden_size: int, vocab: int = STUB_VOCAB, seed: int = 0) -> None:
        super().__init__()
        self.hidden_size, self.vocab = hidden_size, vocab
        gen = torch.Generator().manual_seed(seed)
        # mostly merges (ids >= 256), with some raw byte tokens, which split multi-byte UTF-8 characters
        self.pattern = torch.randint(0, vocab, (_PATTERN_LEN,), generator=gen)
        self.num_calls = 0  # compute_logits calls: one per step that samples
        self.one_hot = True  # compute_logits makes real one-hot logits; False: a placeholder (with `sample`)
        self.last_ids: torch.Tensor | None = None  # [n] the argmax of the last logits

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: Any, attn_metadata: Any
    ) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], self.hidden_size, device=input_ids.device)  # [T, hidden]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        n = hidden.shape[0]
        rows = torch.arange(n)
        ids = self.pattern[(7 * rows + self.num_calls) % _PATTERN_LEN]
        self.num_calls += 1
        self.last_ids = ids = ids.to(hidden.device)
        if not self.one_hot:
            return hidden[:, :1]  # [n, 1] placeholder: `sample` knows the answer
        logits = torch.zeros(n, self.vocab, device=hidden.device)  # [n, vocab] float32
        logits[rows.to(hidden.device), ids] = 1.0
        return logits

    def sample(self, logits: torch.Tensor, md: SamplingMetadata, generator: torch.Generator | None) -> torch.Tensor:
        """Stands in for refengine.worker.model_runner.sample on the stub's logits: the greedy argmax, known already."""
        if not md.all_greedy or md.banned_rows is not None:
            raise RuntimeError("StubModel.sample stands in for greedy sampling with nothing masked only")
        if self.last_ids is None:  # the engine samples only after compute_logits: never None here
            raise RuntimeError("StubModel.sample called before compute_logits")
        return self.last_ids


class FullRedecodeDetokenizer:
    """What the engine did before its detokenizer became incremental, for `--detokenizer full-redecode`'s
    before/after comparison: every step decodes the whole output again (O(output length) per step), then keeps
    the new text past what it had (less a trailing U+FFFD: a character still split)."""

    # __new__ returns the detokenizer itself (a subclass made here, where refengine is imported), not an instance of
    # this class: mypy requires a subclass of cls from __new__
    def __new__(cls, tokenizer: Any, request: Request) -> IncrementalDetokenizer:  # type: ignore[misc]
        from refengine.engine.detokenizer import IncrementalDetokenizer

        class _Full(IncrementalDetokenizer):
            def update(self) -> str | None:
                if self.stopped_by is not None or self.tokenizer is None:
                    return None
                text = self.tokenizer.decode(self.request.output_token_ids)
                text = text[:-1] if text.endswith("\ufffd") else text
                self._num_decoded = self.request.num_output_tokens
                new_text = text[self.num_chars :]
                return self._append(new_text, check_stops=True) if new_text else None

        return _Full(tokenizer, request)


DETOKENIZERS = ("incremental", "full-redecode")
OUTPUT_KINDS = ("delta", "cumulative", "final_only")  # SamplingParams.output_kind, by RequestOutputKind's names


def make_decoding_engine(
    num_running: int,
    max_steps: int,
    *,
    model: str = "tiny-qwen2",
    device: str = "cpu",
    stub: bool = True,
    vocab: int = STUB_VOCAB,
    stop: list[str] | None = None,
    detokenizer: str = "incremental",
    output_kind: str = "delta",
    clock: _DeviceClock | None = None,
) -> tuple[LLMEngine, StubModel | None]:
    """An LLMEngine with `num_running` requests past their prefill, each with room for `max_steps` more decode
    steps, and (`stub`) the stub model in place of the real one; returns (engine, stub model or None). `clock`
    becomes the engine's sampler, so that it can time it (and stand in for it with the stub's)."""
    from refengine import LLMEngine, SamplingParams
    from refengine.models.presets import load_model_config
    from refengine.sampling_params import RequestOutputKind

    if detokenizer not in DETOKENIZERS:
        raise ValueError(f"detokenizer must be one of {DETOKENIZERS}, got {detokenizer!r}")
    if output_kind not in OUTPUT_KINDS:
        raise ValueError(f"output_kind must be one of {OUTPUT_KINDS}, got {output_kind!r}")
    block_size = 16
    per_req = -(-(PROMPT_LEN + max_steps + 4) // block_size)
    stub_model = StubModel(load_model_config(model).hidden_size, vocab) if stub else None
    seams = {
        "model_impl": stub_model,
        "sampler": clock.sample if clock is not None else None,
        "detokenizer_factory": FullRedecodeDetokenizer if detokenizer == "full-redecode" else None,
    }
    engine = LLMEngine(
        model,
        device=device,
        max_num_seqs=num_running,
        block_size=block_size,
        num_gpu_blocks=num_running * per_req + 1,
        max_model_len=_MAX_MODEL_LEN,
        max_num_batched_tokens=max(8192, num_running * PROMPT_LEN),
        enable_prefix_caching=False,
        **{k: v for k, v in seams.items() if v is not None},
    )
    if clock is not None:
        clock.stub = stub_model
    params = SamplingParams(
        max_tokens=max_steps + 2,
        temperature=0.0,
        ignore_eos=True,
        stop=stop,
        output_kind=RequestOutputKind[output_kind.upper()],
    )
    for i in range(num_running):
        engine.add_request(f"r{i}", [1000 + i] + [100 + (i + j) % 5000 for j in range(PROMPT_LEN - 1)], params)
    engine.step()  # the whole batch prefills in one step and samples its first token
    running = len(engine.scheduler.running)
    if running != num_running:
        raise RuntimeError(f"bench-step: expected {num_running} running requests after prefill, got {running}")
    return engine, stub_model
