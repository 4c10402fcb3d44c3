"""Structured output: which tokens a request's grammar lets come next (llguidance).

* `GrammarCompiler`, one per engine, built from the engine's tokenizer at the first structured request: compiles a
  `StructuredOutput` (JSON schema, any JSON object, regex, choice, Lark or GBNF grammar) into an llguidance
  matcher, refusing a bad one with an `InvalidRequestError` that names the problem; compiled grammars are kept by
  their text (a bounded LRU), so a schema sent by many requests is compiled once and copied.
* `GrammarState`, one per request (`Request.grammar`): its matcher, fed each output token of the request exactly
  once (a preempted request recomputes its tokens, but its grammar state is not fed them again).
* `BitmaskComputer`: the allowed-token bitmasks of a step's rows, computed on llguidance's threads (they release
  the GIL) while the model computes that step; the sampler applies them to the logits. A row verifying proposed
  tokens (speculative decoding) gets a mask per position, each as if the proposed tokens before it were generated.

A bitmask row is int32 [ceil(vocab / 32)]: bit j of word w allows token 32 * w + j; an unconstrained row is all
ones (-1). Once the grammar is complete the mask allows only the end-of-sequence tokens, so the request ends
with reason "eos" as usual.
"""

import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

import llguidance
import numpy as np
from llguidance.gbnf_to_lark import gbnf_to_lark, is_lark_syntax
from llguidance.numpy import fill_next_token_bitmask_par, fill_next_token_bitmask_par_with_draft_tokens

from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.sampling_params import StructuredOutput

if TYPE_CHECKING:  # the type of the JSON compiler's options is only in llguidance's stubs
    from llguidance._lib import JsonCompileOptions

DEFAULT_CACHE_SIZE = 128
"""Compiled grammars kept by their text."""

ANY_JSON_OBJECT_SCHEMA = '{"type": "object"}'
JSON_OPTIONS: "JsonCompileOptions" = {"whitespace_flexible": False}
"""JSON is generated compact (no whitespace between tokens of the document; strings keep theirs): with flexible
whitespace a sampled model can pad a document with newlines and spaces until max_tokens cuts it, a known failure of
structured output. A schema's own "x-guidance" options still apply."""

_POSITION = re.compile(r"^at \d+\(\d+\): ")


_Split = tuple[list[tuple[llguidance.LLMatcher, int]], list[int]]
"""The rows of a step that have a live matcher (matcher, row), and those whose grammar already failed."""


def bitmask_width(vocab_size: int) -> int:
    """int32 words of one row's bitmask."""
    return (vocab_size + 31) // 32


def tokenizer_json(tokenizer: object) -> str:
    """The tokenizer.json text of a `tokenizers.Tokenizer`, or of a wrapper holding one as `.tokenizer` (the
    models' TextTokenizer). Raises InvalidRequestError for a tokenizer of another kind."""
    for candidate in (tokenizer, getattr(tokenizer, "tokenizer", None)):
        to_str = getattr(candidate, "to_str", None)
        if callable(to_str):
            text: str = to_str()
            return text
    raise InvalidRequestError(
        f"structured output needs a Hugging Face tokenizer (tokenizer.json); this model's "
        f"tokenizer is a {type(tokenizer).__name__}"
    )


def _condensed(error: str, keep_position: bool) -> str:
    """llguidance's error text on one line: its first line and its 'error:' lines (a regex parser's reason),
    without the matcher's state dump; the 'at line(column)' prefix only where it points into the user's text."""
    lines = error.split("<state>")[0].strip().splitlines()
    if not lines:
        return "unknown error"
    first = lines[0].strip()
    if not keep_position:
        first = _POSITION.sub("", first)
    reasons = [line.strip()[len("error:") :].strip() for line in lines[1:] if line.strip().startswith("error:")]
    return ": ".join([first.rstrip(":")] + reasons)


class GrammarState:
    """One request's grammar: an llguidance matcher and how many output tokens it has consumed."""

    def __init__(self, matcher: "llguidance.LLMatcher", eos_token_ids: frozenset[int]) -> None:
        self.matcher = matcher
        self.eos_token_ids = eos_token_ids
        """The tokens the grammar allows once it is complete (the engine's EOS ids, else the tokenizer's)."""
        self.num_consumed = 0
        self.error: str | None = None
        """Why the grammar refused a token (set when `accept` returns False)."""

    def advance(self, output_token_ids: Sequence[int]) -> bool:
        """Feeds the request's output tokens it has not consumed yet (those from `num_consumed` on): a token is
        never fed twice (a preempted request recomputes its tokens; a forked choice carries its parent's state).
        False, with `error` set, when the grammar refuses one (and from then on)."""
        if self.error is not None:
            return False
        if len(output_token_ids) < self.num_consumed:  # tokens taken back: forget them
            self.matcher.rollback(self.num_consumed - len(output_token_ids))
            self.num_consumed = len(output_token_ids)
        for token_id in output_token_ids[self.num_consumed :]:
            if not self.matcher.consume_token(int(token_id)):
                self.error = _condensed(self.matcher.get_error() or f"token {token_id} is not allowed", True)
                return False
            self.num_consumed += 1
        return True

    @property
    def is_stopped(self) -> bool:
        """The grammar is complete: nothing but an end-of-sequence token may follow."""
        return self.matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        """The output so far is a complete match (more may follow, if the grammar allows it)."""
        return self.matcher.is_accepting()

    def fork(self) -> "GrammarState":
        """An independent copy in the same state (another choice of the same request)."""
        state = GrammarState(self.matcher.deep_copy(), self.eos_token_ids)
        state.num_consumed = self.num_consumed
        return state


class GrammarCompiler:
    """Compiles StructuredOutputs for one tokenizer and vocabulary; keeps the last `cache_size` grammars."""

    def __init__(
        self,
        tokenizer_json_text: str,
        vocab_size: int,
        eos_token_ids: Iterable[int] = (),
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        eos = sorted(int(t) for t in eos_token_ids)
        try:
            self.tokenizer = llguidance.LLTokenizer(tokenizer_json_text, n_vocab=int(vocab_size), eos_token=eos or None)
        except Exception as err:  # the Rust library raises ValueError or a bare Exception on a tokenizer it refuses
            raise InvalidRequestError(
                f"structured output is not available with this model's tokenizer: {err}"
            ) from None
        self.vocab_size = int(vocab_size)
        self.eos_token_ids = frozenset(int(t) for t in self.tokenizer.eos_tokens)
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @classmethod
    def for_tokenizer(
        cls, tokenizer: object, vocab_size: int, eos_token_ids: Iterable[int] = (), cache_size: int = DEFAULT_CACHE_SIZE
    ) -> "GrammarCompiler":
        """From the engine's tokenizer (see `tokenizer_json`)."""
        return cls(tokenizer_json(tokenizer), vocab_size, eos_token_ids, cache_size)

    def new_matcher(self, spec: StructuredOutput) -> GrammarState:
        """A fresh grammar state for one request. Raises InvalidRequestError when `spec` does not compile."""
        return GrammarState(self.compile(spec).deep_copy(), self.eos_token_ids)

    def compile(self, spec: StructuredOutput) -> "llguidance.LLMatcher":
        """The cached matcher of `spec` in its initial state (copy it before use: see `new_matcher`)."""
        key = (spec.type, spec.value)
        template = self._cache.get(key)
        if template is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return template
        self.misses += 1
        template = llguidance.LLMatcher(self.tokenizer, grammar_text(spec), log_level=0)
        if template.is_error():
            raise InvalidRequestError(_compile_error(spec, template.get_error()))
        self._cache[key] = template
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return template


_WHAT = {
    "json": "invalid JSON schema",
    "json_object": "JSON object",
    "regex": "invalid regex",
    "choice": "invalid choice",
    "grammar": "invalid grammar",
}


def _compile_error(spec: StructuredOutput, error: str) -> str:
    """'structured output: invalid <what>: <llguidance's reason>'."""
    what = _WHAT[spec.type]
    reason = _condensed(error, keep_position=spec.type == "grammar").replace(" (in regex)", "")
    return f"structured output: {reason}" if reason.startswith(what) else f"structured output: {what}: {reason}"


def grammar_text(spec: StructuredOutput) -> str:
    """The llguidance grammar of a StructuredOutput (not yet checked: LLMatcher does that). Raises
    InvalidRequestError for what fails before llguidance sees it (JSON that is not a schema, bad GBNF)."""
    kind, value = spec.type, spec.value
    if kind in ("json", "json_object"):
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(
                value if kind == "json" else ANY_JSON_OBJECT_SCHEMA, defaults=JSON_OPTIONS
            )
        except ValueError as err:
            raise InvalidRequestError(f"structured output: invalid JSON schema: {err}") from None
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(value)
    if kind == "choice":
        # NOTE: a JSON string literal is a Lark string literal (llguidance's own choice grammar is built so)
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(value)))
    if "::=" in value and not is_lark_syntax(value):
        try:
            value = gbnf_to_lark(value)
        except Exception as err:  # the converter raises its GbnfToLarkError or a bare Exception (unknown rule)
            raise InvalidRequestError(f"structured output: invalid GBNF grammar: {err}") from None
    return llguidance.LLMatcher.grammar_from_lark(value)


def default_mask_threads() -> int:
    """llguidance threads for a step's masks: half the CPUs, 1 to 8."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class BitmaskComputer:
    """Computes the allowed-token bitmasks of a step's rows in the background (`start`), or at once (`compute`)."""

    def __init__(self, vocab_size: int, num_threads: int | None = None) -> None:
        self.vocab_size = int(vocab_size)
        self.width = bitmask_width(self.vocab_size)
        self._executor = llguidance.LLExecutor(num_threads or default_mask_threads())
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")

    def start(
        self, rows: Sequence[GrammarState | None], drafts: dict[int, tuple[GrammarState, Sequence[int]]] | None = None
    ) -> Future:
        """A future of the int32 [len(rows), width] bitmasks of `rows`: None is an unconstrained row (all -1), a
        state with an error allows nothing (all 0). The states must not be fed tokens until it is done.
        With `drafts` (row -> (state, proposed tokens): rows verifying a draft, speculative decoding), the future's
        result is a `StepMasks` whose `drafts[row]` holds that row's masks at each of its 1 + len(draft) positions,
        as if the draft before each had been generated (the state is left as it was)."""
        if drafts:
            return self._pool.submit(self._fill_step, len(rows), self._split(rows), drafts)
        return self._pool.submit(self._fill, len(rows), *self._split(rows))

    def compute(self, rows: Sequence[GrammarState | None]) -> np.ndarray:
        """The bitmasks of `rows`, computed in the caller's thread."""
        return self._fill(len(rows), *self._split(rows))

    @staticmethod
    def _split(rows: Sequence[GrammarState | None]) -> "_Split":
        matchers = [(state.matcher, i) for i, state in enumerate(rows) if state is not None and state.error is None]
        dead = [i for i, state in enumerate(rows) if state is not None and state.error is not None]
        return matchers, dead

    def _fill(self, num_rows: int, matchers: list[tuple[llguidance.LLMatcher, int]], dead: list[int]) -> np.ndarray:
        bitmask = np.full((num_rows, self.width), -1, dtype=np.int32)
        if matchers:
            fill_next_token_bitmask_par(self._executor, matchers, bitmask)
        bitmask[dead] = 0
        return bitmask

    def _fill_step(
        self, num_rows: int, split: "_Split", drafts: dict[int, tuple[GrammarState, Sequence[int]]]
    ) -> "StepMasks":
        positions = {row: 1 + len(draft) for row, (_, draft) in drafts.items()}
        offsets, total = {}, 0
        for row, count in positions.items():
            offsets[row], total = total, total + count
        bitmask = np.full((max(total, 1), self.width), -1, dtype=np.int32)
        live = [
            (state.matcher, offsets[row], [int(t) for t in draft])
            for row, (state, draft) in drafts.items()
            if state.error is None
        ]
        if live:
            # past a proposed token the grammar refuses, the masks are left allowing all: never read, as the
            # refused token cannot be accepted
            fill_next_token_bitmask_par_with_draft_tokens(self._executor, live, bitmask)
        for row, (state, _) in drafts.items():
            if state.error is not None:
                bitmask[offsets[row] : offsets[row] + positions[row]] = 0
        return StepMasks(
            self._fill(num_rows, *split), {row: bitmask[offsets[row] : offsets[row] + positions[row]] for row in drafts}
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class StepMasks(NamedTuple):
    """The masks of a step with rows verifying drafts (BitmaskComputer.start with drafts)."""

    rows: np.ndarray
    """int32 [rows, width]: one per row of the step (what `start` gives without drafts)."""
    drafts: dict[int, np.ndarray]
    """row -> int32 [1 + len(draft), width]: a verifying row's mask at each of its positions."""


def allowed_tokens(bitmask_row: np.ndarray, vocab_size: int) -> np.ndarray:
    """The token ids one bitmask row allows (tests and diagnostics)."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask_row, dtype=np.int32).view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])
