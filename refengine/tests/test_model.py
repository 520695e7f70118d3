"""The decoder over the paged cache against transformers, and against itself under chunking and batching.

CPU, float32, toy shapes (tiny-qwen2's 151936-row embedding is the largest tensor).
"""

from __future__ import annotations

import json

import pytest
import torch

from refengine.models.hf_twin import to_hf_model
from refengine.models.loader import _draw, load_model
from refengine.models.model_config import ModelConfig, RopeScaling
from refengine.models.presets import PRESETS, load_tokenizer
from refengine.tests._paged import PagedSequences
from refengine.tokenizer import NoTokenizer, QwenTokenizer

# float32 logits are O(1). The same arithmetic in a different order (GEMM blocking picked by the row count,
# einsum vs matmul in attention) moves them by ~1e-6 over 4 layers; 1e-4 leaves room for other BLAS builds
# while still catching any real error (a wrong position, mask or block is off by 1e-2 or more).
# On torch 2.13 CPU with HF's "eager" attention the agreement is in fact bitwise.
LOGITS_ATOL = 1e-4


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=LOGITS_ATOL, rtol=0)


def _prompt(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-llama"])
def preset(request):
    model, config = load_model(request.param)
    return model, config


@torch.no_grad()
def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0].float()  # [T, vocab]


def test_prefill_matches_hf(preset):
    model, config = preset
    ids = _prompt(24, config.vocab_size, seed=1)
    ours = PagedSequences(config, num_blocks=8, block_size=16).forward(model, [(0, ids)])
    _close(ours, _hf_logits(to_hf_model(model, config), ids))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compute_logits_into_a_buffer(dtype):
    """The runner's reused logits buffer: the same float32 values as a fresh result, written into `out`."""
    model, config = load_model("tiny-qwen2", dtype=dtype)
    hidden = torch.randn(5, config.hidden_size, generator=torch.Generator().manual_seed(3)).to(
        model.lm_head.weight.dtype
    )
    out = torch.full((5, config.vocab_size), float("nan"))
    got = model.compute_logits(hidden, out=out)
    assert got.data_ptr() == out.data_ptr() and got.dtype == torch.float32
    assert torch.equal(got, model.compute_logits(hidden))


@pytest.mark.parametrize("block_size", [1, 7, 16])
def test_chunked_prefill_matches_one_prefill(preset, block_size):
    model, config = preset
    ids = _prompt(14, config.vocab_size, seed=2)
    whole = PagedSequences(config, num_blocks=4, block_size=16).forward(model, [(0, ids)])
    seqs = PagedSequences(config, num_blocks=64 // block_size + 8, block_size=block_size, seed=block_size)
    rows, start = [], 0
    for n in (5, 7, 1, 1):
        rows.append(seqs.forward(model, [(0, ids[start : start + n])]))
        start += n
    _close(torch.cat(rows), whole)


def test_mixed_prefill_and_decodes_match_separate(preset):
    """One step holding a decode, a prefill chunk and another decode == the same work done one by one."""
    model, config = preset
    a, b, c = (_prompt(n, config.vocab_size, seed=s) for n, s in ((12, 3), (6, 4), (9, 5)))
    steps = [
        [(1, b[:5]), (2, c[:8])],  # B and C prefill
        [(1, b[5:6]), (0, a[:7]), (2, c[8:9])],  # decode B, first chunk of A, decode C
        [(0, a[7:]), (2, c[:1])],  # A's last chunk (on top of cached KV) with a decode of C
    ]
    mixed = PagedSequences(config, num_blocks=32, block_size=4, seed=0)
    alone = PagedSequences(config, num_blocks=32, block_size=4, seed=1)
    for step in steps:
        together = mixed.forward(model, step)
        separately = torch.cat([alone.forward(model, [item]) for item in step])
        _close(together, separately)


def _random_hf(arch: str, tmp_path, shard: bool):
    import transformers

    common = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        eos_token_id=2,
        bos_token_id=1,
    )
    if arch == "Qwen2ForCausalLM":
        cfg = transformers.Qwen2Config(**common, rope_theta=1e6, tie_word_embeddings=True)
    elif arch == "LlamaForCausalLM":
        cfg = transformers.LlamaConfig(
            **common,
            tie_word_embeddings=False,
            rope_theta=5e5,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        )
    else:
        cfg = transformers.MistralConfig(**common, tie_word_embeddings=False, sliding_window=None)
    cfg.architectures = [arch]
    hf = getattr(transformers, arch)._from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():  # HF zero-initialises biases and ones norms: randomise so loading is tested
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    hf.save_pretrained(tmp_path, max_shard_size="100KB" if shard else "1GB")
    return hf


@pytest.mark.parametrize(
    "arch,shard", [("Qwen2ForCausalLM", False), ("LlamaForCausalLM", True), ("MistralForCausalLM", False)]
)
def test_hf_folder_loads_with_same_logits(tmp_path, arch, shard):
    hf = _random_hf(arch, tmp_path, shard)
    assert (tmp_path / "model.safetensors.index.json").exists() == shard
    model, config = load_model(str(tmp_path))
    assert config.architecture == arch and config.tie_word_embeddings == (arch == "Qwen2ForCausalLM")
    ids = _prompt(20, config.vocab_size, seed=6)
    ours = PagedSequences(config, num_blocks=8, block_size=4).forward(model, [(0, ids)])
    _close(ours, _hf_logits(hf, ids))


def test_preset_weights_are_seeded():
    torch.manual_seed(123)  # global RNG state must not matter
    m0, config = load_model("tiny-qwen2", seed=0)
    torch.manual_seed(456)
    m0b, _ = load_model("tiny-qwen2", seed=0)
    m1, _ = load_model("tiny-qwen2", seed=1)
    s0, s0b, s1 = (dict(m.checkpoint_weights()) for m in (m0, m0b, m1))
    for name, w in s0.items():
        assert torch.equal(w, s0b[name]), name
        assert name.endswith("norm.weight") or not torch.equal(w, s1[name]), name
        # drawn per checkpoint name, merged projections too: the weights do not depend on how they are stored
        assert torch.equal(w, _draw(name, w.shape, seed=0)), name
    assert m0.lm_head.weight is m0.model.embed_tokens.weight  # tied
    assert abs(s0["model.layers.0.mlp.up_proj.weight"].std().item() - 0.02) < 1e-3
    bf16, _ = load_model("tiny-qwen2", seed=0, dtype="bfloat16")
    assert bf16.lm_head.weight is bf16.model.embed_tokens.weight
    for name, w in bf16.checkpoint_weights():
        assert torch.equal(w, s0[name].to(torch.bfloat16)), name


def test_the_test_suites_preset_is_tiny_qwen2_with_a_small_vocabulary():
    """tiny-qwen2-8k (the engine tests' model) differs from tiny-qwen2 only in its vocabulary and where Qwen's EOS
    ids fold to; its text goes through the Qwen BPE with every id folded into range."""
    base, small = PRESETS["tiny-qwen2"], PRESETS["tiny-qwen2-8k"]
    assert small.vocab_size == 8192 < base.vocab_size
    assert small.replace(vocab_size=base.vocab_size, eos_token_id=base.eos_token_id) == base
    tok = load_tokenizer("tiny-qwen2-8k")
    assert tok.encode("<|im_end|>") == [small.eos_token_ids[0]] and tok.eos_token_id == small.eos_token_ids[0]
    ids = tok.encode("Hello world, and a word from far up the vocabulary: Schwarzschild")
    assert (
        all(0 <= i < small.vocab_size for i in ids)
        and max(load_tokenizer("tiny-qwen2").encode("Schwarzschild")) >= 8192
    )


def test_bad_model_names_raise(tmp_path):
    with pytest.raises(ValueError, match="no-such-model.*tiny-qwen2"):
        load_model("no-such-model")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_model(str(tmp_path))
    cfg = dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        rope_scaling={"rope_type": "yarn", "factor": 4.0},
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="yarn"):
        load_model(str(tmp_path))
    with pytest.raises(ValueError, match="num_key_value_heads"):
        PRESETS["tiny-qwen2"].replace(num_key_value_heads=3)
    with pytest.raises(ValueError, match="rope_type"):
        RopeScaling(
            factor=2.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8,
            rope_type="linear",
        )


def test_tokenizers(tmp_path):
    tok = load_tokenizer("tiny-qwen2")
    assert isinstance(tok, QwenTokenizer) and tok.eos_token_id == 151645
    ids = tok.encode("Hello, paged world!")
    assert tok.decode(ids) == "Hello, paged world!"
    assert tok.decode(ids + [151645, 151900]) == "Hello, paged world!"  # special and padding ids drop
    assert max(load_tokenizer("llama-3.1-8b").encode("<|im_end|>")) < PRESETS["llama-3.1-8b"].vocab_size
    cfg = dict(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=151936,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        eos_token_id=151643,
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert isinstance(load_tokenizer(str(tmp_path)), QwenTokenizer)  # no tokenizer.json, Qwen vocabulary
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "vocab_size": 1000, "eos_token_id": 2}))
    none = load_tokenizer(str(tmp_path))
    assert isinstance(none, NoTokenizer) and none.decode([1, 2]) == ""
    with pytest.raises(ValueError, match="token ids"):
        none.encode("text")


def test_config_validation_names_field():
    base = PRESETS["tiny-llama"]
    for field, value in [
        ("hidden_size", 0),
        ("head_dim", 63),
        ("eos_token_id", base.vocab_size),
        ("architecture", "GPT2"),
        ("rms_norm_eps", 0.0),
    ]:
        with pytest.raises(ValueError, match=field):
            base.replace(**{field: value})
    assert ModelConfig(**{**base.__dict__, "eos_token_id": [1, 2]}).eos_token_ids == (1, 2)
    hash(base)  # frozen and hashable (the eos list became a tuple)
