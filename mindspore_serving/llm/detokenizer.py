"""Incremental detokenization with stop strings.

Decoding one token at a time is wrong for byte-level tokenizers (a character split over two tokens
decodes to U+FFFD) and for tokenizers whose word pieces render differently at the start of a string.
So each update decodes a short window of tokens twice, `[prefix_offset, read_offset)` (already
emitted) and `[prefix_offset, end)`, and emits the difference; while the longer text ends in U+FFFD
nothing is emitted and the offsets stay put, so half a character never reaches the client.

Stop strings are searched in the whole output text around the newly added part, so a stop string split
across tokens is found. The output is cut before it (or after it with include_stop_str_in_output).
While stop strings are active, the last len(longest stop) - 1 characters are held back from the stream,
since they may turn out to begin a stop string; `flush()` releases them when the request finishes.
"""

from collections.abc import Sequence
from dataclasses import dataclass

# Prompt tokens decoded with the first output tokens, so the first word piece renders as mid-text.
INITIAL_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


@dataclass
class DetokenizerUpdate:
    new_text: str
    """Text safe to stream now."""
    stop_string: str | None = None
    """The stop string found by this update (the request must finish with reason "stop")."""


def make_decode(tokenizer, skip_special_tokens: bool):
    """A `decode(ids) -> str` over a `tokenizers.Tokenizer`, a Hugging Face tokenizer, or any object
    with `decode(ids)`; skip_special_tokens is passed when the tokenizer takes it."""
    try:
        tokenizer.decode([], skip_special_tokens=skip_special_tokens)
    except TypeError:
        return tokenizer.decode
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Turns one request's output tokens into text, a few tokens at a time."""

    def __init__(
        self,
        tokenizer,
        prompt_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        decode=None,
    ) -> None:
        self._decode = decode or make_decode(tokenizer, skip_special_tokens)
        context = list(prompt_token_ids[-INITIAL_CONTEXT_TOKENS:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._stop = tuple(stop)
        self._include_stop = include_stop_str_in_output
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self.output_text = ""
        """All output text so far (cut at a stop string once one is found)."""
        self._emitted = 0
        self.stop_string: str | None = None

    @property
    def finished(self) -> bool:
        return self.stop_string is not None

    def update(self, new_token_ids: Sequence[int]) -> DetokenizerUpdate:
        """Adds tokens; returns the text that can be streamed now and the stop string if one completed."""
        if self.stop_string is not None:
            return DetokenizerUpdate("")
        self._ids.extend(new_token_ids)
        before = len(self.output_text)
        self.output_text += self._decode_new()
        if self._stop and len(self.output_text) > before:
            self._find_stop(before)
        if self.stop_string is not None:
            return DetokenizerUpdate(self._take(len(self.output_text)), self.stop_string)
        return DetokenizerUpdate(self._take(len(self.output_text) - self._holdback))

    def flush(self) -> str:
        """Everything not streamed yet, including held-back text and a trailing incomplete character
        (as U+FFFD); call it once the request has finished."""
        if self.stop_string is None:
            before = len(self.output_text)
            self.output_text += self._decode_new(final=True)
            if self._stop and len(self.output_text) > before:
                self._find_stop(before)
        return self._take(len(self.output_text))

    def _decode_new(self, final: bool = False) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or (full_text.endswith(_REPLACEMENT_CHAR) and not final):
            return ""  # nothing new yet, or a character still incomplete
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]

    def _find_stop(self, new_from: int) -> None:
        # A stop string ending in the new text may start up to len(stop) - 1 characters before it.
        search_from = max(0, new_from - max(len(s) for s in self._stop) + 1)
        best = None
        for stop in self._stop:
            index = self.output_text.find(stop, search_from)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        if best is not None:
            index, stop = best
            self.stop_string = stop
            self.output_text = self.output_text[: index + len(stop) if self._include_stop else index]

    def _take(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        text = self.output_text[self._emitted : upto]
        self._emitted = upto
        return text
