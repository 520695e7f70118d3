"""Incremental detokenisation and stop strings, O(new tokens) per step. Stop strings cut the text, never the ids.

The text of a request is always exactly `tokenizer.decode(output_token_ids)` (skip_special_tokens=True), built a
piece at a time by one of two streams:

- `_ByteStream`, for byte-level BPE tokenizers that expose their id -> bytes table (the Qwen BPE of the presets):
  each new id's bytes go through one incremental UTF-8 decoder, which holds back at most the 3 bytes of a
  character split across tokens, and gives exactly what decoding the concatenated bytes at once gives (the
  tokenizer's own decode is `b"".join(bytes).decode("utf-8", "replace")`). Constant work per token.
- `_WindowStream`, for any tokenizer with only `decode(ids)`: vLLM's prefix / read offsets
  (detokenize_incrementally). Each step decodes the short window `ids[prefix_offset:]` and the part of it already
  shown, `ids[prefix_offset:read_offset]`; the difference is the new text. The prefix gives the new tokens their
  left context (a SentencePiece "▁" renders as a space only after another token), and a window whose text ends
  in U+FFFD (an incomplete character) waits for the next token. The window holds the tokens since the last text
  that could be shown, plus those of that text: a few tokens, whatever the output length.

At the end (finished, aborted) whatever is still held back is flushed, so the text equals a full decode even when
it ends in an incomplete character. Stop strings are searched in the new text only (plus len(stop) - 1 characters
before it), as vLLM does; while a request runs, the last (longest stop - 1) characters are not returned, since
they may turn out to be the start of a stop string that must not be shown.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from typing import Any

from refengine.request import Request

_REPLACEMENT = "\ufffd"  # what a decode puts where bytes are not (yet) a whole UTF-8 character


_TEXT_TABLES: dict[int, tuple[Sequence[bytes], list[str | None]]] = {}  # id(bytes table) -> (table, texts)


def _text_table(table: Sequence[bytes]) -> list[str | None]:
    """Per id, its text when its bytes are whole UTF-8 characters on their own, else None: the text a decode
    step needs without running the decoder (most tokens). Built once per table (a process-wide singleton)."""
    entry = _TEXT_TABLES.get(id(table))
    if entry is None or entry[0] is not table:
        texts: list[str | None] = []
        for data in table:
            try:
                texts.append(data.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(None)
        entry = _TEXT_TABLES[id(table)] = (table, texts)  # (holding the table keeps its id unique)
    return entry[1]


class _ByteStream:
    """ids -> text through an id -> bytes table and incremental UTF-8 decoding (codecs' own C decoder with
    final=False: it stops before an incomplete character at the end, which waits here for the next bytes)."""

    def __init__(self, table: Sequence[bytes]) -> None:
        self._table = table
        self._texts = _text_table(table)
        self._pending = b""  # at most 3 bytes: the start of a character split across tokens

    def feed_one(self, i: int) -> str:
        """One id (a decode step). With nothing pending, a token of whole characters is a table lookup."""
        if not self._pending and 0 <= i < len(self._texts):
            text = self._texts[i]
            if text is not None:
                return text
        return self.feed((i,))

    def feed(self, ids: Sequence[int]) -> str:
        table, n = self._table, len(self._table)
        data = b"".join([table[i] if 0 <= i < n else b"" for i in ids])  # out of range: decodes to nothing
        if self._pending:
            data = self._pending + data
        text, used = codecs.utf_8_decode(data, "replace", False)
        self._pending = data[used:]
        return text

    def flush(self) -> str:
        text, self._pending = codecs.utf_8_decode(self._pending, "replace", True)[0], b""
        return text


class _WindowStream:
    """ids -> text through `decode` of a short window (vLLM's prefix_offset / read_offset)."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._window: list[int] = []  # ids[prefix_offset:]
        self._read = 0  # read_offset - prefix_offset: window[:_read] is text already given out
        self._prefix_text: str | None = ""  # decode(window[:_read]), None until needed again

    def feed(self, ids: Sequence[int]) -> str:
        self._window.extend(ids)
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._window[: self._read])
        text = self._decode(self._window)
        if len(text) <= len(self._prefix_text) or text.endswith(_REPLACEMENT):
            return ""  # nothing new yet, or a character still split: wait for the next token
        delta = text[len(self._prefix_text) :]
        # what was read becomes the new prefix: it gives the next tokens their left context
        del self._window[: self._read]
        self._read = len(self._window)
        self._prefix_text = None
        return delta

    def feed_one(self, i: int) -> str:
        return self.feed((i,))

    def flush(self) -> str:
        if not self._window[self._read :]:
            return ""
        prefix = self._prefix_text if self._prefix_text is not None else self._decode(self._window[: self._read])
        return self._decode(self._window)[len(prefix) :]


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, request: Request) -> None:  # Any: a duck-typed HF-style tokenizer or None
        self.tokenizer = tokenizer
        self.request = request
        self.stopped_by: str | None = None
        self._unsent = ""  # text decoded but not yet returned by take_delta()
        self._num_sent_chars = 0
        self._num_decoded = 0  # output tokens fed to the stream
        self._flushed = False
        sp = request.sampling_params
        self._min_tokens = sp.min_tokens  # stop strings are not looked for before min_tokens (vLLM)
        self._stops = list(sp.stop or [])
        self._hold = max(map(len, self._stops)) - 1 if self._stops else 0
        # stop string -> its place in the list (the first listed match wins, as in vLLM); last character -> the
        # distinct lengths of the stops ending in it: the search probes those at each new character, whatever the
        # number of stop strings (most characters end none)
        self._stop_rank = {stop: i for i, stop in reversed(list(enumerate(self._stops)))}
        by_last: dict[str, set[int]] = {}
        for stop in self._stops:
            by_last.setdefault(stop[-1], set()).add(len(stop))
        self._stop_lengths = {ch: sorted(lengths) for ch, lengths in by_last.items()}
        table = getattr(tokenizer, "token_bytes_table", lambda: None)()
        self._stream: _ByteStream | _WindowStream | None
        if tokenizer is None:
            self._stream = None
        elif table is not None:
            self._stream = _ByteStream(table)
        else:
            self._stream = _WindowStream(tokenizer.decode)

    @property
    def num_chars(self) -> int:
        """Characters of text so far (returned or held back)."""
        return self._num_sent_chars + len(self._unsent)

    def update(self) -> str | None:
        """Decode the tokens new since the last call; returns the stop string that ended the request, if one did."""
        ids = self.request.output_token_ids
        n, done = len(ids), self._num_decoded
        if n == done or self.stopped_by is not None or self._stream is None:
            return None
        if n == done + 1:  # (a decode step)
            new_text = self._stream.feed_one(ids[-1])
        else:
            new_text = self._stream.feed(ids[done:])
        self._num_decoded = n
        if not new_text:
            return None
        if not self._stops:  # the common case: nothing to search, nothing held back
            self._unsent += new_text
            return None
        return self._append(new_text, check_stops=n >= self._min_tokens)

    def _append(self, new_text: str, check_stops: bool) -> str | None:
        before = len(self._unsent)
        self._unsent += new_text
        if check_stops and self._stops:
            stop = self._first_listed_stop(before)
            if stop is not None:
                # the held-back tail keeps len(stop) - 1 characters before the new text: a stop can span the two
                idx = self._unsent.find(stop, max(0, before - len(stop) + 1))
                cut = idx + len(stop) if self.request.sampling_params.include_stop_str_in_output else idx
                self._unsent = self._unsent[:cut]
                self.stopped_by = stop
                return stop
        return None

    def _first_listed_stop(self, before: int) -> str | None:
        """The earliest-listed stop string that ends in the new text (from `before` on), or None: at each new
        character, one dict probe per length of the stops that end in it, so O(new text x longest stop) at worst,
        not O(the stop list)."""
        text, rank, by_last, best = self._unsent, self._stop_rank, self._stop_lengths, None
        for end in range(before + 1, len(text) + 1):
            for length in by_last.get(text[end - 1], ()):
                if length > end:
                    break
                i = rank.get(text[end - length : end])
                if i is not None and (best is None or i < best):
                    best = i
        return None if best is None else self._stops[best]

    def take_delta(self, finished: bool) -> str:
        """Text not yet returned; all of it when `finished` (after flushing what the stream still holds)."""
        if finished:
            if not self._flushed and self.stopped_by is None and self._stream is not None:
                self._unsent += self._stream.flush()  # an incomplete character at the very end, as decode gives it
            self._flushed = True
            end = len(self._unsent)
        elif not self._hold:
            delta, self._unsent = self._unsent, ""
            self._num_sent_chars += len(delta)
            return delta
        else:
            end = max(0, len(self._unsent) - self._hold)
        delta, self._unsent = self._unsent[:end], self._unsent[end:]
        self._num_sent_chars += len(delta)
        return delta
