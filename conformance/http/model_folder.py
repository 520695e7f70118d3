"""A tiny Hugging Face model folder made here, offline: a random Qwen2 (seeded) written by `save_pretrained`, and a
byte-level BPE tokenizer trained on a seeded synthetic corpus, saved with a ChatML chat template as
`tokenizer.json` + `tokenizer_config.json`. Any server that loads local folders can serve it (transformers serve,
vLLM, `cbbench serve --model FOLDER`). Tokenizer vocabulary = model vocabulary, so every sampled id decodes."""

from __future__ import annotations

import random
import string
from pathlib import Path

VOCAB_SIZE = 4096  # > the largest token id the HTTP suite sends as a prompt (2632)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time in a land far away there lived a king.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Tell me about the weather today, tomorrow and next week.",
    "Hello there, are you still there?",
]


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(30_000)]
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    return lines + _SENTENCES * 50 + [" ".join(string.punctuation + string.digits)] * 10


def make_tokenizer(seed: int = 0):
    """A `transformers.PreTrainedTokenizerFast` of exactly VOCAB_SIZE ids, the special tokens last-but-never-split."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"the BPE trainer stopped at {tok.get_vocab_size()} ids, not {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    return fast


def make_model_folder(path: Path, seed: int = 0) -> Path:
    """Write the folder (config.json, model.safetensors, generation_config.json, tokenizer files) and return it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(seed)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        use_sliding_window=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
