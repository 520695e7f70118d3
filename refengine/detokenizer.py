"""Incremental detokenisation and stop strings. Stop strings cut the text, never the token ids."""
from __future__ import annotations

from refengine.request import Request


class IncrementalDetokenizer:
    def __init__(self, tokenizer, request: Request) -> None:
        self.tokenizer = tokenizer
        self.request = request
        self.text = ""
        self.sent = 0  # characters of `text` already returned by take_delta()
        self.stopped_by: str | None = None

    def update(self) -> str | None:
        """Re-decode after new tokens; returns the stop string that ended the request, if one did."""
        req = self.request
        sp = req.sampling_params
        if self.stopped_by is not None or self.tokenizer is None:
            return None
        prev_len = len(self.text)
        text = self.tokenizer.decode(req.output_token_ids)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the next token
            text = text[: len(text) - 1]
            text = text if len(text) >= prev_len else self.text
        self.text = text
        if sp.stop and req.num_output_tokens >= sp.min_tokens:
            for stop in sp.stop:
                start = max(0, prev_len - len(stop) + 1)
                idx = text.find(stop, start)
                if idx >= 0:
                    self.text = text[: idx + len(stop)] if sp.include_stop_str_in_output else text[:idx]
                    self.stopped_by = stop
                    return stop
        return None

    def take_delta(self, finished: bool) -> str:
        """Text not yet returned. While the request runs, the last (longest stop string - 1) characters are held
        back: they may turn out to be the start of a stop string that must not be shown."""
        end = len(self.text)
        if not finished and self.request.sampling_params.stop:
            end = max(self.sent, end - max(map(len, self.request.sampling_params.stop)) + 1)
        delta = self.text[self.sent : end]
        self.sent = end
        return delta
