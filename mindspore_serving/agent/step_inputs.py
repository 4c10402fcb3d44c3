"""How a step's sequences become the inputs of the step graphs (models/llama/step_graphs.py): pure numpy, no
MindSpore, so that it is tested on its own.

`plan_calls` splits a step into graph calls of at most `max_tokens` tokens: the one-token rows (decode rows) first,
then the multi-token rows (prompts, prompt chunks, verified proposals), the longest first, packed after them; a row
that does not fit the room left is cut, its next piece going first in the next call (the graph calls run in order,
so a piece attends to the ones before through the cache). The chunk rows of a call are padded to its longest for
attention, so a call also takes no more of them than PADDED_FACTOR * max_tokens padded tokens allow.

`call_inputs` lays one call out: the decode rows' tokens first, then the chunk rows' tokens packed, their positions
and cache slots, each group's context slots (every position of the row's context, padded to whole blocks with the
scratch slot), and the tokens whose logits the call returns.

A call of one kind of row (`CallInputs.kind`: "decode" or "chunk") runs the layer graph of that group alone: the
other group's inputs are one-element placeholders that the graph does not read, and it adds no token. A call of
both kinds ("both") runs the layer graph of both groups.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mindspore_serving.llm.model_io import SCRATCH_BLOCK, SeqStep

NO_LOGITS, LAST_LOGITS, EVERY_LOGITS = 0, 1, 2


@dataclass(frozen=True)
class Piece:
    """Tokens of one sequence computed in one graph call (a whole query or a piece of it)."""

    row: int
    """Index of the sequence in the step."""
    tokens: Sequence[int]
    start_pos: int
    block_table: Sequence[int]
    logits: int
    """NO_LOGITS, LAST_LOGITS (its last token's: it ends the sequence's query) or EVERY_LOGITS."""
    offset: int = 0
    """Tokens of the sequence's query before this piece."""


@dataclass
class CallInputs:
    """The int32 inputs of one step (step_graphs.py) and where its logits go."""

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    decode_slots: np.ndarray
    chunk_index: np.ndarray
    chunk_scatter: np.ndarray
    chunk_slots: np.ndarray
    logits_index: np.ndarray
    outputs: list[tuple[Piece, int]]
    """Each piece that returns logits and its first row in the call's logits (EVERY_LOGITS: len(tokens) rows)."""
    kind: str = "both"
    """The groups it computes: "decode" (one-token rows only), "chunk" (multi-token rows only) or "both" (e.g.
    decodes beside a prompt)."""

    @property
    def mixed(self) -> bool:
        return self.kind == "both"


PADDED_FACTOR = 2
"""The chunk rows of a call are padded to its longest piece for attention: at most PADDED_FACTOR * max_tokens
padded query tokens per call (a padded token costs attention only, not the projections)."""


def plan_calls(seqs: Sequence[SeqStep], max_tokens: int) -> list[list[Piece]]:
    """The graph calls of a step, each a list of pieces of at most `max_tokens` tokens in all, and of chunk rows
    whose padding to the longest of them (Bp x Lp) stays within PADDED_FACTOR * max_tokens (see the module
    docstring)."""
    for i, seq in enumerate(seqs):
        if seq.query_len < 1:
            raise ValueError(f"seqs[{i}] has no tokens to compute")
    plan = _Plan(max_tokens)
    for i, seq in enumerate(seqs):
        if seq.query_len == 1:
            plan.add_decode(Piece(i, seq.token_ids, seq.start_pos, seq.block_table, _wanted(seq, True)))
    # the longest first: the shorter rows that join a call then pad to what is there
    for i in sorted((i for i, seq in enumerate(seqs) if seq.query_len > 1), key=lambda i: -seqs[i].query_len):
        seq, begin = seqs[i], 0
        while begin < seq.query_len:
            take = plan.chunk_room(seq.query_len - begin)
            end = begin + take
            plan.add_chunk(
                Piece(
                    i,
                    seq.token_ids[begin:end],
                    seq.start_pos + begin,
                    seq.block_table,
                    _wanted(seq, end == seq.query_len),
                    begin,
                )
            )
            begin = end
    return plan.calls


class _Plan:
    """The calls planned so far and what the last one has room for."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.calls: list[list[Piece]] = [[]]
        self.room, self.chunk_rows, self.longest = max_tokens, 0, 0

    def next_call(self) -> None:
        self.calls.append([])
        self.room, self.chunk_rows, self.longest = self.max_tokens, 0, 0

    def add_decode(self, piece: Piece) -> None:
        if self.room == 0:
            self.next_call()
        self.calls[-1].append(piece)
        self.room -= 1

    def chunk_room(self, wanted: int) -> int:
        """The tokens of a chunk row of `wanted` more tokens that the last call takes (a new call when it takes
        none); at least 1."""
        for _ in range(2):
            padded = (PADDED_FACTOR * self.max_tokens) // (self.chunk_rows + 1)
            take = min(wanted, self.room, padded)
            if take >= 1 and padded >= self.longest:
                return take
            self.next_call()
        return min(wanted, self.max_tokens)

    def add_chunk(self, piece: Piece) -> None:
        self.calls[-1].append(piece)
        self.room -= len(piece.tokens)
        self.chunk_rows += 1
        self.longest = max(self.longest, len(piece.tokens))


def _wanted(seq: SeqStep, ends_query: bool) -> int:
    if seq.all_logits:
        return EVERY_LOGITS
    return LAST_LOGITS if ends_query else NO_LOGITS


def slots_of(block_table: Sequence[int], begin: int, end: int, block_size: int) -> np.ndarray:
    """The cache slots of positions begin .. end-1 of a sequence with this block table."""
    positions = np.arange(begin, end, dtype=np.int64)
    table = np.asarray(block_table, dtype=np.int64)
    return (table[positions // block_size] * block_size + positions % block_size).astype(np.int32)


def _context_slots(pieces: Sequence[Piece], block_size: int, align: int) -> np.ndarray:
    """[rows, C]: the slot of every context position of each piece's row (C: the longest context, aligned)."""
    lengths = [p.start_pos + len(p.tokens) for p in pieces]
    width = -(-max(lengths) // align) * align
    out = np.full((len(pieces), width), SCRATCH_BLOCK * block_size, np.int32)
    for r, (piece, length) in enumerate(zip(pieces, lengths)):
        out[r, :length] = slots_of(piece.block_table, 0, length, block_size)
    return out


def call_inputs(pieces: Sequence[Piece], block_size: int, context_align: int | None = None) -> CallInputs:
    """The inputs of one graph call of `pieces` (see the module docstring). `context_align` (default: the block
    size) must divide the graphs' max_seq_len, so that an aligned context never exceeds it."""
    context_align = context_align or block_size
    decode = [p for p in pieces if len(p.tokens) == 1]
    chunks = [p for p in pieces if len(p.tokens) > 1]
    kind = "both" if decode and chunks else "decode" if decode else "chunk"
    lengths = [len(p.tokens) for p in chunks]
    longest = max(lengths, default=1)
    total = len(decode) + sum(lengths)
    ids = np.empty(total, np.int32)
    positions = np.empty(total, np.int32)
    slots = np.empty(total, np.int32)
    chunk_index = np.zeros((max(1, len(chunks)), longest), np.int32)  # without chunks: a placeholder
    chunk_scatter = np.zeros(max(1, total - len(decode)), np.int32)
    for r, piece in enumerate(decode):
        ids[r] = piece.tokens[0]
        positions[r] = piece.start_pos
        slots[r] = slots_of(piece.block_table, piece.start_pos, piece.start_pos + 1, block_size)[0]
    at = len(decode)
    for r, (piece, n) in enumerate(zip(chunks, lengths)):
        ids[at : at + n] = piece.tokens
        positions[at : at + n] = np.arange(piece.start_pos, piece.start_pos + n, dtype=np.int32)
        slots[at : at + n] = slots_of(piece.block_table, piece.start_pos, piece.start_pos + n, block_size)
        chunk_index[r, :n] = np.arange(at, at + n, dtype=np.int32)
        chunk_index[r, n:] = at + n - 1  # padding queries repeat the row's last token; their output is dropped
        chunk_scatter[at - len(decode) : at - len(decode) + n] = np.arange(r * longest, r * longest + n)
        at += n
    logits_index: list[int] = []
    outputs: list[tuple[Piece, int]] = []
    firsts = list(range(len(decode))) + (len(decode) + np.cumsum([0] + lengths[:-1])).tolist()
    for piece, first in zip(decode + chunks, firsts):
        if piece.logits == NO_LOGITS:
            continue
        outputs.append((piece, len(logits_index)))
        n = len(piece.tokens)
        logits_index.extend(range(first, first + n) if piece.logits == EVERY_LOGITS else [first + n - 1])
    if not logits_index:  # a call of pieces that all continue in the next call: one row, dropped
        logits_index = [0]
    placeholder = np.full((1, 1), SCRATCH_BLOCK * block_size, np.int32)
    return CallInputs(
        ids,
        positions,
        slots,
        _context_slots(decode, block_size, context_align) if decode else placeholder,
        chunk_index,
        chunk_scatter,
        _context_slots(chunks, block_size, context_align) if chunks else placeholder,
        np.asarray(logits_index, np.int32),
        outputs,
        kind,
    )
