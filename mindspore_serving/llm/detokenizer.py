"""Incremental detokenization with stop strings.

Decoding one token at a time is wrong for byte-level tokenizers (a character split over two tokens
decodes to U+FFFD) and for tokenizers whose word pieces render differently at the start of a string.
So each update decodes a short window of tokens twice, `[prefix_offset, read_offset)` (already
emitted) and `[prefix_offset, end)`, and emits the difference; while the longer text ends in U+FFFD
nothing is emitted and the offsets stay put, so half a character never reaches the client.

For a `tokenizers.Tokenizer` (or a wrapper that keeps one as `.tokenizer` and decodes as it does, such as
models/llama/tokenizer.py's TextTokenizer) the same algorithm runs natively: `tokenizers.decoders.DecodeStream`,
one call per token instead of two Python-side decodes of a window. Its state is one request's: a choice forked off
a request (n / best_of) gets a detokenizer of its own from the prompt (it has no output tokens when it forks), and a
preempted request recomputes its KV cache, not its text, so no detokenizer state is ever copied or replayed. What
DecodeStream cannot give, the text of tokens still held back at `flush()` and a stream that fails, comes from the
window decode over the same tokens.

Stop strings are searched in the whole output text around the newly added part, so a stop string split
across tokens is found. The output is cut before it (or after it with include_stop_str_in_output).
While stop strings are active, the last len(longest stop) - 1 characters are held back from the stream,
since they may turn out to begin a stop string; `flush()` releases them when the request finishes.
"""

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Prompt tokens decoded with the first output tokens, so the first word piece renders as mid-text.
INITIAL_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"

Decode = Callable[[Sequence[int]], str]
"""A tokenizer's decode: token ids -> text."""


@dataclass(slots=True)
class DetokenizerUpdate:
    new_text: str
    """Text safe to stream now."""
    stop_string: str | None = None
    """The stop string found by this update (the request must finish with reason "stop")."""


def make_decode(tokenizer: Any, skip_special_tokens: bool) -> Decode:
    """A `decode(ids) -> str` over a `tokenizers.Tokenizer`, a Hugging Face tokenizer, or any object
    with `decode(ids)`; skip_special_tokens is passed when the tokenizer takes it."""
    try:
        tokenizer.decode([], skip_special_tokens=skip_special_tokens)
    except TypeError:
        decode: Decode = tokenizer.decode
        return decode
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def native_tokenizer(tokenizer: object) -> Any:
    """The `tokenizers.Tokenizer` that decodes for `tokenizer`: itself, or the one a wrapper keeps as `.tokenizer`
    (whose decode must be that tokenizer's); None for any other tokenizer.

    `tokenizers` is looked up, not imported: a process that has not imported it holds none of its tokenizers, and the
    processes that only import this package for its types (the master, the front ends) need not load it."""
    tokenizers = sys.modules.get("tokenizers")
    if tokenizers is None:
        return None
    if isinstance(tokenizer, tokenizers.Tokenizer):
        return tokenizer
    inner = getattr(tokenizer, "tokenizer", None)
    return inner if isinstance(inner, tokenizers.Tokenizer) else None


class IncrementalDetokenizer:
    """Turns one request's output tokens into text, a few tokens at a time."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        decode: Decode | None = None,
    ) -> None:
        self._decode = decode or make_decode(tokenizer, skip_special_tokens)
        context = list(prompt_token_ids[-INITIAL_CONTEXT_TOKENS:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)  # the tokens before it have given their text
        self._native = None if decode is not None else native_tokenizer(tokenizer)
        self._stream = None
        if self._native is not None:
            self._stream = sys.modules["tokenizers"].decoders.DecodeStream(context, skip_special_tokens)
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
        new_text = self._decode_new(new_token_ids)
        if not new_text:  # nothing new: nothing more may be released either
            return DetokenizerUpdate("")
        before = len(self.output_text)
        self.output_text += new_text
        if self._stop:
            self._find_stop(before)
            if self.stop_string is not None:
                return DetokenizerUpdate(self._take(len(self.output_text)), self.stop_string)
        return DetokenizerUpdate(self._take(len(self.output_text) - self._holdback))

    def flush(self) -> str:
        """Everything not streamed yet, including held-back text and a trailing incomplete character
        (as U+FFFD); call it once the request has finished."""
        if self.stop_string is None:
            before = len(self.output_text)
            if self._stream is None:
                self.output_text += self._decode_window(final=True)
            elif self._read_offset < len(self._ids):  # tokens DecodeStream still holds: an incomplete character
                self._prefix_offset = max(0, self._read_offset - INITIAL_CONTEXT_TOKENS)
                self.output_text += self._decode_window(final=True)
            if self._stop and len(self.output_text) > before:
                self._find_stop(before)
        return self._take(len(self.output_text))

    def _decode_new(self, new_token_ids: Sequence[int]) -> str:
        """The text that `new_token_ids` complete ("" while a character is incomplete)."""
        self._ids.extend(new_token_ids)
        if self._stream is None:
            return self._decode_window()
        try:
            text: str | None
            if len(new_token_ids) == 1:
                text = self._stream.step(self._native, new_token_ids[0])
            else:
                text = self._stream.step(self._native, list(new_token_ids))
        except Exception:  # e.g. its prefix check failing: the window decode takes over
            self._stream = None
            self._prefix_offset = max(0, self._read_offset - INITIAL_CONTEXT_TOKENS)
            return self._decode_window()
        if text is None:
            return ""
        self._read_offset = len(self._ids)  # the window decode starts a few tokens before it (flush, failure)
        return text

    def _decode_window(self, final: bool = False) -> str:
        """Decodes the window twice (module docstring); `final` also gives an incomplete trailing character."""
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
