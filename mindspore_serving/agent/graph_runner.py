"""GraphRunner: the engine's ModelRunner (llm/model_io.py) over exported paged-attention MindIR graphs.

The graphs are those written by `mindspore_serving.models.llama.export` (see its manifest.json and
models/llama/model.py for the input list). This runner

* loads every graph of the manifest with `mindspore.load` + `nn.GraphCell`, one GraphCell per shape bucket
  (graphs are exported with static shapes, so a loaded graph is only ever called with the shapes it was
  exported with: docs/llm/bundled-model.md);
* owns the KV caches, 2 * num_layers MindSpore Tensors of [num_blocks, block_size, num_kv_heads, head_dim],
  allocated once and updated in place by the graphs (no copy per step);
* loads the weights once (agent/graph_weights.py) and passes the same Tensors to every graph after the caches: the
  graphs hold no weights (manifest format 2), so the process holds each weight once whatever the number of graphs
  (format 1 graphs, which embed their own copy, are still run, without weight inputs);
* warms each graph up once, with inputs that only touch the scratch block 0;
* in `run(seqs)` sends the one-token rows to the smallest decode bucket that fits and the others to prefill
  buckets (length bucket = smallest that holds the row, batch bucket = smallest that holds the group), splits
  batches larger than the largest bucket into several calls, and computes prompts longer than the largest length
  bucket in chunks over successive calls (each chunk attends to the ones before through the cache);
* when the export has mixed graphs (decode rows + prefill rows in one call) and a step has both kinds of rows,
  computes the decode rows and the longest prefill rows that fit a mixed bucket in one mixed call: a step that
  admits prompts then costs one graph call instead of two or more;
* computes a sequence that asks for every token's logits (`SeqStep.all_logits`: prompt logprobs) in the score
  graphs (`score_b1_l{L}`: one row, the logits of every position), one call per chunk of at most the largest
  score length, and returns a `StepLogits`. The score graphs are loaded on first use, not at start-up: an agent
  that never scores holds none of their working memory (which, like any compiled graph's, stays for the graph's
  life: about that of a prefill graph of the same length, plus its [L, vocab] logits), and the first scored
  request waits for the load (a compile of seconds on a large model). An export without score graphs (older
  exports, `export.score_len_buckets: []`) serves everything else; `score_refusal()` says why it cannot score;
* when the export has verify graphs (`verify_b{B}_l{k+1}`, `export.spec_tokens` k > 0: `spec_tokens`, else 0),
  loads and warms them at start and computes there the sequences with `all_logits` of at most k + 1 tokens
  (speculative decoding: a row's last token and its proposed ones), batched (smallest verify bucket that holds the
  group, split past the largest), with the step's one-token decode rows in the same call (their logits are position
  0's): a speculative step is one graph call when its rows fit the largest verify bucket. When they do not, the
  decode rows fill the verify calls' padding rows and the rest go to decode graphs. A step with verify rows runs its
  prefill rows in prefill graphs (never mixed ones), and longer `all_logits` rows in the score graphs.

block_size and MAXB (= max_seq_len // block_size) are fixed by the export. num_blocks is chosen here when the
graphs were exported with a dynamic cache dimension (the exporter's default, manifest "num_blocks": null);
otherwise it must equal the exported number.
"""

import bisect
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from mindspore_serving.agent.graph_weights import load_graph_weights
from mindspore_serving.llm.model_io import (
    SCRATCH_BLOCK,
    MultiStepRunner,
    PromptScorer,
    SeqStep,
    StepLogits,
    run_greedy_steps,
    slot_of,
)
from mindspore_serving.llm.sampler import greedy_with_logprobs
from mindspore_serving.models.llama.manifest import EMBEDDED_WEIGHTS_VERSION, MANIFEST, MANIFEST_VERSION

SUPPORTED_MANIFEST_VERSIONS = (EMBEDDED_WEIGHTS_VERSION, MANIFEST_VERSION)


@dataclass
class _Piece:
    """Tokens of one sequence computed in one graph call (a whole query or one chunk of it)."""

    row: int  # index into the `seqs` passed to run()
    tokens: Sequence[int]
    start_pos: int
    block_table: Sequence[int]
    last: bool  # its logits are the sequence's result
    offset: int = 0  # where its tokens start in the sequence's query (chunks)


@dataclass
class _Bucket:
    """One loaded graph and its preallocated input buffers."""

    phase: str
    batch: int
    length: int
    graph: nn.GraphCell
    input_ids: np.ndarray = field(init=False)
    positions: np.ndarray = field(init=False)
    block_tables: np.ndarray = field(init=False)
    slot_mapping: np.ndarray = field(init=False)
    query_lens: np.ndarray = field(init=False)
    max_blocks: int = 0

    def __post_init__(self):
        b, length = self.batch, self.length
        self.input_ids = np.zeros((b, length), np.int32)
        self.positions = np.zeros((b, length), np.int32)
        self.block_tables = np.zeros((b, self.max_blocks), np.int32)
        self.slot_mapping = np.zeros((b * length,), np.int32)
        self.query_lens = np.ones((b,), np.int32)

    def reset(self, block_size: int):
        """Every row padding (one token, scratch slot 0); returns ids, positions, block tables, slots, query lens."""
        self.input_ids.fill(0)
        self.positions.fill(0)
        self.block_tables.fill(SCRATCH_BLOCK)
        self.slot_mapping.fill(SCRATCH_BLOCK * block_size)
        self.query_lens.fill(1)
        return self.input_ids, self.positions, self.block_tables, self.slot_mapping, self.query_lens

    def run(self, pieces: list[_Piece], state: Sequence[Tensor], block_size: int) -> np.ndarray:
        """Logits [len(pieces), vocab]; rows past len(pieces) are padding (one token, scratch slot 0). `state`: the
        inputs after the step's (the caches, then the weights)."""
        ids, pos, tables, slots, qlens = self.reset(block_size)
        length = self.length
        for r, piece in enumerate(pieces):
            n, start, table = len(piece.tokens), piece.start_pos, piece.block_table
            ids[r, :n] = piece.tokens
            pos[r, :n] = np.arange(start, start + n, dtype=np.int32)
            tables[r, : len(table)] = table
            slots[r * length : r * length + n] = [slot_of(table, p, block_size) for p in range(start, start + n)]
            qlens[r] = n
        out = self.graph(Tensor(ids), Tensor(pos), Tensor(tables), Tensor(slots), Tensor(qlens), *state)
        return out.asnumpy()[: len(pieces)]


@dataclass
class _MixedBucket:
    """A mixed graph (`batch` decode rows + `rows` prefill rows of `length` tokens) and its input buffers."""

    batch: int
    rows: int
    length: int
    graph: nn.GraphCell
    max_blocks: int = 0

    def __post_init__(self):
        b, r, length = self.batch, self.rows, self.length
        self.decode_ids = np.zeros((b, 1), np.int32)
        self.decode_positions = np.zeros((b, 1), np.int32)
        self.decode_tables = np.zeros((b, self.max_blocks), np.int32)
        self.prefill_ids = np.zeros((r, length), np.int32)
        self.prefill_positions = np.zeros((r, length), np.int32)
        self.prefill_tables = np.zeros((r, self.max_blocks), np.int32)
        self.slot_mapping = np.zeros((b + r * length,), np.int32)
        self.prefill_lens = np.ones((r,), np.int32)

    def run(self, decode: list[_Piece], prefill: list[_Piece], state: Sequence[Tensor], block_size: int) -> np.ndarray:
        """Logits [batch + rows, vocab]: the decode rows, then the prefill rows (padding past the pieces given);
        `state` as for `_Bucket.run`."""
        b, length = self.batch, self.length
        for buffer in (self.decode_ids, self.decode_positions, self.prefill_ids, self.prefill_positions):
            buffer.fill(0)
        self.decode_tables.fill(SCRATCH_BLOCK)
        self.prefill_tables.fill(SCRATCH_BLOCK)
        self.slot_mapping.fill(SCRATCH_BLOCK * block_size)
        self.prefill_lens.fill(1)
        for r, piece in enumerate(decode):
            self.decode_ids[r, 0] = piece.tokens[0]
            self.decode_positions[r, 0] = piece.start_pos
            self.decode_tables[r, : len(piece.block_table)] = piece.block_table
            self.slot_mapping[r] = slot_of(piece.block_table, piece.start_pos, block_size)
        for r, piece in enumerate(prefill):
            n, start, table = len(piece.tokens), piece.start_pos, piece.block_table
            self.prefill_ids[r, :n] = piece.tokens
            self.prefill_positions[r, :n] = np.arange(start, start + n, dtype=np.int32)
            self.prefill_tables[r, : len(table)] = table
            first = b + r * length
            self.slot_mapping[first : first + n] = [slot_of(table, p, block_size) for p in range(start, start + n)]
            self.prefill_lens[r] = n
        out = self.graph(
            Tensor(self.decode_ids),
            Tensor(self.decode_positions),
            Tensor(self.decode_tables),
            Tensor(self.prefill_ids),
            Tensor(self.prefill_positions),
            Tensor(self.prefill_tables),
            Tensor(self.slot_mapping),
            Tensor(self.prefill_lens),
            *state,
        )
        return out.asnumpy()


class GraphRunner(MultiStepRunner, PromptScorer):
    """ModelRunner over the graphs of an export directory (see the module docstring).

    Args:
        manifest_dir: folder with manifest.json and the .mindir files of `models.llama.export`.
        num_blocks: KV-cache blocks to allocate, block 0 being the scratch block (so >= 2).
        block_size: optional check against the exported block size (it cannot be changed here).
        warmup: run every graph once at load time (compiles it), so the first real step is fast.
        tensor_parallel: (size, rank) this process runs as; checked against the export's. A rank of a
            tensor-parallel export must run in a cluster of that size (its graphs all-reduce), and every rank must
            make the same graph calls in the same order: the calls depend only on the steps, which every rank gets.
    """

    def __init__(
        self,
        manifest_dir: str,
        num_blocks: int,
        block_size: int | None = None,
        warmup: bool = True,
        tensor_parallel: tuple[int, int] | None = None,
    ):
        path = os.path.join(manifest_dir, MANIFEST)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path} not found: export the model first "
                "(python -m mindspore_serving.models.llama.export --config ... --out DIR)"
            )
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        version = manifest.get("format_version")
        if version not in SUPPORTED_MANIFEST_VERSIONS:
            raise ValueError(
                f"{path}: manifest format_version {version!r} is not supported "
                f"(supported: {SUPPORTED_MANIFEST_VERSIONS}); re-export the model"
            )
        self.manifest = manifest
        exported = manifest.get("tensor_parallel", {"size": 1, "rank": 0})
        self.tensor_parallel = (int(exported["size"]), int(exported["rank"]))
        if tensor_parallel is not None and tuple(tensor_parallel) != self.tensor_parallel:
            raise ValueError(
                f"{path}: the graphs are rank {self.tensor_parallel[1]} of a {self.tensor_parallel[0]}-way "
                f"tensor-parallel export, this process runs rank {tensor_parallel[1]} of "
                f"{tensor_parallel[0]}; list the rank directories in order in model.graphs and set "
                f"model.tensor_parallel to the export's"
            )
        self.block_size = int(manifest["block_size"])
        if block_size is not None and block_size != self.block_size:
            raise ValueError(
                f"block_size={block_size} differs from the exported block_size={self.block_size}; "
                "it is fixed at export: re-export or use the exported value"
            )
        fixed = manifest.get("num_blocks")
        if fixed is not None and num_blocks != fixed:
            raise ValueError(
                f"num_blocks={num_blocks} differs from the {fixed} fixed in the exported graphs; use "
                f"{fixed} or re-export with export.num_blocks unset (dynamic)"
            )
        if num_blocks < 2:
            raise ValueError(f"num_blocks={num_blocks} must be >= 2 (block 0 is the scratch block)")
        self.num_blocks = num_blocks
        self.max_seq_len = int(manifest["max_seq_len"])
        self.vocab_size = int(manifest["vocab_size"])
        self.max_blocks_per_seq = int(manifest["max_blocks_per_seq"])
        cache = manifest["cache"]
        self.cache_shape = (num_blocks, self.block_size, cache["num_kv_heads"], cache["head_dim"])
        self.num_layers = int(cache["num_layers"])
        self.weights: list[Tensor] = load_graph_weights(manifest_dir, manifest)
        self.kv_caches: list[Tensor] = []
        self.state: tuple[Tensor, ...] = ()  # every graph's inputs after the step's: the caches, then the weights
        self.reset_kv_caches()

        self.decode_buckets: dict[int, _Bucket] = {}
        self.prefill_buckets: dict[tuple[int, int], _Bucket] = {}
        self.score_buckets: dict[int, _Bucket] = {}  # by length, loaded on first use (see the module docstring)
        self._score_files: dict[int, str] = {}
        self._manifest_dir = manifest_dir
        self.mixed_buckets: dict[tuple[int, int, int], _MixedBucket] = {}  # (decode rows, prefill rows, length)
        self.verify_buckets: dict[int, _Bucket] = {}  # by batch; every one of length spec_tokens + 1
        for g in manifest["graphs"]:
            if g["phase"] == "score":
                self._score_files[g["length"]] = g["file"]
                continue
            cell = nn.GraphCell(ms.load(os.path.join(manifest_dir, g["file"])))
            if g["phase"] == "mixed":
                key = (g["batch"], g.get("rows", 1), g["length"])
                self.mixed_buckets[key] = _MixedBucket(*key, cell, max_blocks=self.max_blocks_per_seq)
                continue
            bucket = _Bucket(g["phase"], g["batch"], g["length"], cell, max_blocks=self.max_blocks_per_seq)
            if g["phase"] == "decode":
                self.decode_buckets[g["batch"]] = bucket
            elif g["phase"] == "verify":
                self.verify_buckets[g["batch"]] = bucket
            else:
                self.prefill_buckets[(g["batch"], g["length"])] = bucket
        if not self.decode_buckets or not self.prefill_buckets:
            raise ValueError(f"{path}: needs at least one decode and one prefill graph")
        self.decode_batches = sorted(self.decode_buckets)
        self.prefill_batches = sorted({b for b, _ in self.prefill_buckets})
        self.prefill_lengths = sorted({length for _, length in self.prefill_buckets})
        for b in self.prefill_batches:
            for length in self.prefill_lengths:
                if (b, length) not in self.prefill_buckets:
                    raise ValueError(
                        f"{path}: prefill buckets must be a full batch x length grid; prefill_b{b}_l{length} is missing"
                    )
        self.score_lengths = sorted(self._score_files)
        self.mixed_batches = sorted({b for b, _, _ in self.mixed_buckets})
        self.mixed_rows = sorted({r for _, r, _ in self.mixed_buckets})
        self.mixed_lengths = sorted({length for _, _, length in self.mixed_buckets})
        if len(self.mixed_buckets) != len(self.mixed_batches) * len(self.mixed_rows) * len(self.mixed_lengths):
            raise ValueError(f"{path}: mixed buckets must be a full decode rows x prefill rows x length grid")
        self.verify_batches = sorted(self.verify_buckets)
        verify_lengths = {bucket.length for bucket in self.verify_buckets.values()}
        if len(verify_lengths) > 1:
            raise ValueError(
                f"{path}: verify graphs of several lengths {sorted(verify_lengths)}; one per batch, "
                f"of spec_tokens + 1 tokens"
            )
        # the most proposed tokens a verified row may carry (its query: 1 + this many); 0: no verify graphs
        self.spec_tokens = verify_lengths.pop() - 1 if verify_lengths else 0
        self.calls = 0  # graph calls so far (tests and metrics)
        self.mixed_calls = 0  # of which mixed decode + prefill calls
        self.verify_calls = 0  # of which verify calls (speculative decoding)
        if warmup:
            for bucket in (
                list(self.decode_buckets.values())
                + list(self.prefill_buckets.values())
                + list(self.verify_buckets.values())
            ):
                bucket.run([], self.state, self.block_size)
            for mixed in self.mixed_buckets.values():
                mixed.run([], [], self.state, self.block_size)

    # --- the ModelRunner protocol -------------------------------------------------------------------------

    def score_refusal(self) -> str | None:
        if self.score_lengths:
            return None
        return (
            f"the graphs of {self._manifest_dir} have no score graphs (exported before them, or with "
            f"export.score_len_buckets empty): export them again to get prompt logprobs"
        )

    def run(self, seqs: list[SeqStep]):
        """Logits [len(seqs), vocab_size] (float32) of the last token of each sequence; a StepLogits when a
        sequence asks for all its logits."""
        out = np.empty((len(seqs), self.vocab_size), np.float32)
        decode, prefill, verify = [], [], []
        scored = {}
        for i, seq in enumerate(seqs):
            self._check(i, seq)
            if seq.all_logits:
                scored[i] = np.empty((seq.query_len, self.vocab_size), np.float32)
                if seq.query_len <= self.spec_tokens + 1 and self.verify_buckets:
                    verify.append(_Piece(i, seq.token_ids, seq.start_pos, seq.block_table, True))
            elif seq.query_len == 1:
                decode.append(_Piece(i, seq.token_ids, seq.start_pos, seq.block_table, True))
            else:
                prefill.append((i, seq))
        if len(scored) > len(verify) and not self.score_lengths:  # refused before any graph runs or writes the cache
            raise ValueError(self.score_refusal())
        if verify:
            self._run_verify(verify, decode, out, scored)
            fused = {piece.row for piece in verify}
        else:
            fused = self._run_mixed(decode, prefill, out)
            if not fused:
                self._run_decode(decode, out)
        # Prompts longer than the largest length bucket go in chunks, chunk k of every prompt in round k.
        rounds: list[list[_Piece]] = []
        for i, seq in enumerate(seqs):
            if i in fused or (seq.query_len == 1 and i not in scored):
                continue
            max_len = self.score_lengths[-1] if i in scored else self.prefill_lengths[-1]
            for k, begin in enumerate(range(0, seq.query_len, max_len)):
                if k == len(rounds):
                    rounds.append([])
                end = min(begin + max_len, seq.query_len)
                rounds[k].append(
                    _Piece(
                        i, seq.token_ids[begin:end], seq.start_pos + begin, seq.block_table, end == seq.query_len, begin
                    )
                )
        for pieces in rounds:
            self._run_decode([p for p in pieces if len(p.tokens) == 1 and p.row not in scored], out)
            self._run_prefill([p for p in pieces if len(p.tokens) > 1 and p.row not in scored], out)
            for piece in (p for p in pieces if p.row in scored):
                self._run_score(piece, out, scored[piece.row])
        return StepLogits(out, scored) if scored else out

    def run_greedy(self, seqs: list[SeqStep], num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Multi-step greedy decoding (model_io.run_greedy_steps): `num_steps` calls of one decode bucket back to
        back, its block tables filled once, each step's argmax fed into the next. Prompts in `seqs` are computed
        by a first `run` (a mixed call with the decode rows when the buckets allow), the rest as decode rows."""
        if any(seq.all_logits for seq in seqs):
            raise ValueError("a greedy round cannot return every token's logits (SeqStep.all_logits)")
        if not seqs or len(seqs) > self.decode_batches[-1] or num_steps == 1:
            return run_greedy_steps(self, seqs, num_steps)
        if any(seq.query_len != 1 for seq in seqs):
            first, first_logprobs = greedy_with_logprobs(self.run(seqs))
            rest, rest_logprobs = self.run_greedy(
                [SeqStep([int(token)], seq.context_len, seq.block_table) for token, seq in zip(first, seqs)],
                num_steps - 1,
            )
            return (
                np.concatenate([np.asarray(first, np.int64)[:, None], rest], axis=1),
                np.concatenate([np.asarray(first_logprobs, np.float32)[:, None], rest_logprobs], axis=1),
            )
        for i, seq in enumerate(seqs):  # the last step writes position start_pos + num_steps - 1
            self._check(i, SeqStep([0] * num_steps, seq.start_pos, seq.block_table))
        bucket = self.decode_buckets[self.decode_batches[bisect.bisect_left(self.decode_batches, len(seqs))]]
        n, size = len(seqs), self.block_size
        ids, pos, tables, slots, qlens = bucket.reset(size)
        for r, seq in enumerate(seqs):
            tables[r, : len(seq.block_table)] = seq.block_table
        tokens = np.zeros((n, num_steps), np.int64)
        logprobs = np.zeros((n, num_steps), np.float32)
        ids[:n, 0] = [seq.token_ids[0] for seq in seqs]
        for step in range(num_steps):
            for r, seq in enumerate(seqs):
                pos[r, 0] = seq.start_pos + step
                slots[r] = slot_of(seq.block_table, seq.start_pos + step, size)
            logits = bucket.graph(
                Tensor(ids), Tensor(pos), Tensor(tables), Tensor(slots), Tensor(qlens), *self.state
            ).asnumpy()[:n]
            self.calls += 1
            tokens[:, step], logprobs[:, step] = greedy_with_logprobs(logits)
            ids[:n, 0] = tokens[:, step]
        return tokens, logprobs

    def reset_kv_caches(self):
        """Fresh zeroed caches: key_cache_i, value_cache_i for each layer i (the graphs' input order)."""
        self.kv_caches = [Tensor(np.zeros(self.cache_shape, np.float32)) for _ in range(2 * self.num_layers)]
        self.state = tuple(self.kv_caches) + tuple(self.weights)

    # --- internals ---------------------------------------------------------------------------------------

    def _check(self, i: int, seq: SeqStep):
        if seq.query_len < 1:
            raise ValueError(f"seqs[{i}] has no tokens to compute")
        if seq.start_pos < 0 or seq.context_len > self.max_seq_len:
            raise ValueError(
                f"seqs[{i}] spans positions [{seq.start_pos}, {seq.context_len}), beyond the graphs' "
                f"max_seq_len={self.max_seq_len}"
            )
        needed = -(-seq.context_len // self.block_size)
        if not needed <= len(seq.block_table) <= self.max_blocks_per_seq:
            raise ValueError(
                f"seqs[{i}] has {len(seq.block_table)} blocks; it needs {needed} (context "
                f"{seq.context_len}, block_size {self.block_size}) and at most "
                f"{self.max_blocks_per_seq}"
            )

    def _call(self, bucket: _Bucket, pieces: list[_Piece], out: np.ndarray):
        logits = bucket.run(pieces, self.state, self.block_size)
        self.calls += 1
        for piece, row in zip(pieces, logits):
            if piece.last:
                out[piece.row] = row

    def _run_mixed(self, decode: list[_Piece], prefill: list[tuple[int, SeqStep]], out: np.ndarray) -> set[int]:
        """Computes the decode rows and the longest prefill rows that fit a mixed bucket in one mixed call when
        the buckets allow; returns the indices (in `seqs`) of the prefill rows it computed (empty: it ran
        nothing, the decode rows included)."""
        if not self.mixed_buckets or not decode or not prefill or len(decode) > self.mixed_batches[-1]:
            return set()
        longest = self.mixed_lengths[-1]
        fitting = sorted(((seq.query_len, i, seq) for i, seq in prefill if seq.query_len <= longest), reverse=True)
        # the longest prompts first: the most prefill work saved from separate calls
        chosen = fitting[: self.mixed_rows[-1]]
        if not chosen:
            return set()
        batch = self.mixed_batches[bisect.bisect_left(self.mixed_batches, len(decode))]
        rows = self.mixed_rows[bisect.bisect_left(self.mixed_rows, len(chosen))]
        length = self.mixed_lengths[bisect.bisect_left(self.mixed_lengths, chosen[0][0])]
        pieces = [_Piece(i, seq.token_ids, seq.start_pos, seq.block_table, True) for _, i, seq in chosen]
        logits = self.mixed_buckets[(batch, rows, length)].run(decode, pieces, self.state, self.block_size)
        self.calls += 1
        self.mixed_calls += 1
        for r, piece in enumerate(decode):
            out[piece.row] = logits[r]
        for r, piece in enumerate(pieces):
            out[piece.row] = logits[batch + r]
        return {piece.row for piece in pieces}

    def _run_verify(self, verify: list[_Piece], decode: list[_Piece], out: np.ndarray, every: dict[int, np.ndarray]):
        """The verify rows (all_logits, at most spec_tokens + 1 tokens) and the one-token decode rows: one verify
        call when they all fit the largest verify bucket; else the verify rows in calls of the largest bucket (the
        last in the smallest that holds it), the decode rows in those calls' padding rows, and the rest of them in
        decode graphs. A verify row's logits of every position go into `every[row]`, its last into `out`; a decode
        row's (position 0's) into `out`."""
        largest = self.verify_batches[-1]
        if len(verify) + len(decode) <= largest:
            groups, rest = [verify + decode], []
        else:
            groups = [verify[begin : begin + largest] for begin in range(0, len(verify), largest)]
            rest = list(decode)
            for group in groups:
                room = self.verify_batches[bisect.bisect_left(self.verify_batches, len(group))] - len(group)
                group += rest[:room]
                del rest[:room]
        for group in groups:
            bucket = self.verify_buckets[self.verify_batches[bisect.bisect_left(self.verify_batches, len(group))]]
            logits = bucket.run(group, self.state, self.block_size)
            self.calls += 1
            self.verify_calls += 1
            for piece, row in zip(group, logits):
                n = len(piece.tokens)
                if piece.row in every:
                    every[piece.row][:] = row[:n]
                out[piece.row] = row[n - 1]
        self._run_decode(rest, out)

    def _run_score(self, piece: _Piece, out: np.ndarray, every: np.ndarray):
        """One chunk of a scored sequence in the smallest score graph that holds it: its logits of every position
        into `every` (rows piece.offset...), the last one into `out` when the chunk ends the sequence."""
        n = len(piece.tokens)
        logits = self._score_bucket(n).run([piece], self.state, self.block_size)[0, :n]
        self.calls += 1
        every[piece.offset : piece.offset + n] = logits
        if piece.last:
            out[piece.row] = logits[-1]

    def _score_bucket(self, num_tokens: int) -> _Bucket:
        length = self.score_lengths[bisect.bisect_left(self.score_lengths, num_tokens)]
        bucket = self.score_buckets.get(length)
        if bucket is None:
            cell = nn.GraphCell(ms.load(os.path.join(self._manifest_dir, self._score_files[length])))
            bucket = _Bucket("score", 1, length, cell, max_blocks=self.max_blocks_per_seq)
            self.score_buckets[length] = bucket
        return bucket

    def _run_decode(self, pieces: list[_Piece], out: np.ndarray):
        largest = self.decode_batches[-1]
        for begin in range(0, len(pieces), largest):
            group = pieces[begin : begin + largest]
            batch = self.decode_batches[bisect.bisect_left(self.decode_batches, len(group))]
            self._call(self.decode_buckets[batch], group, out)

    def _run_prefill(self, pieces: list[_Piece], out: np.ndarray):
        by_length: dict[int, list[_Piece]] = {}
        for piece in pieces:
            length = self.prefill_lengths[bisect.bisect_left(self.prefill_lengths, len(piece.tokens))]
            by_length.setdefault(length, []).append(piece)
        largest = self.prefill_batches[-1]
        for length in sorted(by_length):
            group_all = by_length[length]
            for begin in range(0, len(group_all), largest):
                group = group_all[begin : begin + largest]
                batch = self.prefill_batches[bisect.bisect_left(self.prefill_batches, len(group))]
                self._call(self.prefill_buckets[(batch, length)], group, out)
