"""The LLM worker <-> agent boundary (agent.proto): start-up events on a pipe, then Step messages over gRPC
(SeqStep lists in, logits or greedy tokens out; the sequences with all_logits also get every token's logits, a
StepLogits; a mixed step gets greedy tokens and the logits of some rows, and its rows verifying proposed tokens every
position's logits or greedy tokens, a MixedStep). AGENT_PROTOCOL_VERSION guards both."""

import hmac
import os
import struct
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from mindspore_serving.llm.model_io import MixedStep, SeqStep, StepLogits, StepResult, split_logits
from mindspore_serving.proto import agent_pb2

AGENT_PROTOCOL_VERSION = 8
MAX_AGENT_MSG_BYTES = 512 * 1024 * 1024
SECRET_METADATA = "ms-serving-agent-secret"  # Step calls: the agent group's secret
SECRET_ENV = "MS_SERVING_AGENT_SECRET"  # the secret of agents started by start_agent.py, and of their worker


def secret_matches(expected: str, given: str) -> bool:
    """Whether `given` is the agent group's secret (any is, when the group has none); constant time."""
    return not expected or hmac.compare_digest(expected.encode(), (given or "").encode())


AGENT_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_AGENT_MSG_BYTES),
    ("grpc.max_receive_message_length", MAX_AGENT_MSG_BYTES),
]


class StepEncoder:
    """The worker's side of the Step messages. A sequence the engine names (`SeqStep.seq_id` >= 0) has its block
    table sent once; later steps carry only the block ids appended since (vLLM sends a request's data once and
    then its per-step change), and the agents keep the tables in step order (`StepDecoder`). The tables kept
    are the `max_tables` sequences used last; one pushed out is released in the same message, so both sides
    always keep the same ones."""

    def __init__(self, max_tables: int = 1024) -> None:
        self.max_tables = max_tables
        self._tables: OrderedDict[int, list[int]] = OrderedDict()  # seq_id -> table as the agents keep it
        self._reset = False

    def reset(self) -> None:
        """Forgets every table, here and (with the next message) in the agents: after a failed step, whose
        table updates an agent may not have made."""
        self._tables.clear()
        self._reset = True

    def encode(
        self,
        step_id: int,
        seqs: Sequence[SeqStep],
        greedy_steps: int = 0,
        after_step_id: int = 0,
        prev_rows: Sequence[int] = (),
        logits_rows: Sequence[int] = (),
    ) -> "agent_pb2.StepRequest":
        request = agent_pb2.StepRequest(
            step_id=step_id, greedy_steps=greedy_steps, after_step_id=after_step_id, reset_tables=self._reset
        )
        self._reset = False
        request.prev_rows.extend(prev_rows)
        request.logits_rows.extend(logits_rows)
        request.query_lens.extend(len(seq.token_ids) for seq in seqs)
        request.start_pos.extend(seq.start_pos for seq in seqs)
        request.seq_ids.extend(seq.seq_id for seq in seqs)
        request.all_logits_rows.extend(i for i, seq in enumerate(seqs) if seq.all_logits)
        starts = [self._table_start(seq) for seq in seqs]
        if any(starts):
            request.table_starts.extend(starts)
        request.block_table_lens.extend(len(seq.block_table) - start for seq, start in zip(seqs, starts))
        for seq, start in zip(seqs, starts):
            request.token_ids.extend(seq.token_ids)
            request.block_tables.extend(seq.block_table[start:])
        while len(self._tables) > self.max_tables:
            request.released_seq_ids.append(self._tables.popitem(last=False)[0])
        return request

    def _table_start(self, seq: SeqStep) -> int:
        """Where the ids sent for `seq` start: after the table the agents keep when `seq` extends it, else 0."""
        if seq.seq_id < 0:
            return 0
        kept = self._tables.pop(seq.seq_id, None)
        self._tables[seq.seq_id] = list(seq.block_table)  # the newest at the end: pushed out last
        if kept is not None and len(kept) <= len(seq.block_table) and seq.block_table[: len(kept)] == kept:
            return len(kept)
        return 0


class StepDecoder:
    """The agent's side: rebuilds each sequence's whole block table from the ids sent and the tables kept.
    Messages must be decoded in step order (the agent runs steps in that order)."""

    def __init__(self) -> None:
        self._tables: dict[int, list[int]] = {}

    def decode(self, request: "agent_pb2.StepRequest") -> list[SeqStep]:
        if request.reset_tables:
            self._tables.clear()
        for seq_id in request.released_seq_ids:
            self._tables.pop(seq_id, None)
        tokens = list(request.token_ids)
        ids = list(request.block_tables)
        count = len(request.query_lens)
        seq_ids = list(request.seq_ids) or [-1] * count
        starts = list(request.table_starts) or [0] * count
        every = set(request.all_logits_rows)
        seqs: list[SeqStep] = []
        token_at, table_at = 0, 0
        for query_len, start_pos, sent, seq_id, start in zip(
            request.query_lens, request.start_pos, request.block_table_lens, seq_ids, starts
        ):
            table = ids[table_at : table_at + sent]
            if start:
                kept = self._tables.get(seq_id)
                if kept is None or len(kept) < start:
                    raise RuntimeError(
                        f"step {request.step_id}: sequence {seq_id} continues a table of {start} "
                        f"blocks that this agent does not hold "
                        f"({'none' if kept is None else len(kept)})"
                    )
                table = kept[:start] + table
            if seq_id >= 0:
                self._tables[seq_id] = table
            seqs.append(
                SeqStep(
                    tokens[token_at : token_at + query_len], start_pos, table, seq_id, all_logits=len(seqs) in every
                )
            )
            token_at += query_len
            table_at += sent
        return seqs


def encode_logits(step_id: int, result: StepResult) -> "agent_pb2.StepReply":
    """The reply of a step that returned logits [rows, vocab] or a StepLogits (with every token's logits of some
    sequences)."""
    logits, every = split_logits(result)
    logits = np.ascontiguousarray(logits, dtype="<f4")
    reply = agent_pb2.StepReply(
        step_id=step_id, rows=logits.shape[0], vocab_size=logits.shape[1], logits=logits.tobytes()
    )
    _encode_every(reply, every)
    return reply


def _encode_every(reply: "agent_pb2.StepReply", every: dict[int, np.ndarray]) -> None:
    if every:
        rows = sorted(every)
        reply.every_rows.extend(rows)
        reply.every_lens.extend(len(every[row]) for row in rows)
        reply.every_logits = b"".join(np.ascontiguousarray(every[row], dtype="<f4").tobytes() for row in rows)


def _decode_every(reply: "agent_pb2.StepReply") -> dict[int, np.ndarray]:
    if not reply.every_rows:
        return {}
    flat = np.frombuffer(reply.every_logits, dtype="<f4").reshape(-1, reply.vocab_size)
    every, at = {}, 0
    for row, length in zip(reply.every_rows, reply.every_lens):
        every[row] = flat[at : at + length]
        at += length
    return every


def decode_logits(reply: "agent_pb2.StepReply") -> StepResult:
    """What `encode_logits` was given: the logits [rows, vocab], or a StepLogits."""
    if reply.error:
        raise RuntimeError(f"agent step {reply.step_id} failed: {reply.error}")
    logits = np.frombuffer(reply.logits, dtype="<f4").reshape(reply.rows, reply.vocab_size)
    every = _decode_every(reply)
    return StepLogits(logits, every) if every else logits


def encode_greedy(step_id: int, tokens: np.ndarray, logprobs: np.ndarray) -> "agent_pb2.StepReply":
    reply = agent_pb2.StepReply(step_id=step_id, rows=tokens.shape[0])
    reply.tokens.extend(tokens.reshape(-1).tolist())
    reply.logprobs.extend(logprobs.reshape(-1).tolist())
    return reply


def decode_greedy(reply: "agent_pb2.StepReply", num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int64 [rows, num_steps], logprobs float32 [rows, num_steps]) of a multi-step greedy reply."""
    if reply.error:
        raise RuntimeError(f"agent step {reply.step_id} failed: {reply.error}")
    tokens = np.asarray(reply.tokens, dtype=np.int64).reshape(reply.rows, num_steps)
    return tokens, np.asarray(reply.logprobs, dtype=np.float32).reshape(reply.rows, num_steps)


def encode_mixed(step_id: int, step: MixedStep) -> "agent_pb2.StepReply":
    """The reply of a mixed step: its greedy tokens and logprobs as `encode_greedy`'s, the logits of its logits
    rows, and what its verifying rows need (every position's logits, or greedy tokens and logprobs)."""
    reply = encode_greedy(step_id, np.asarray(step.tokens), np.asarray(step.logprobs))
    logits = np.ascontiguousarray(step.logits, dtype="<f4")
    reply.vocab_size = logits.shape[1]
    reply.logits = logits.tobytes()
    _encode_every(reply, step.every)
    for row in sorted(step.verified):
        tokens, logprobs = step.verified[row]
        reply.verified_rows.append(row)
        reply.verified_lens.append(len(tokens))
        reply.verified_tokens.extend(np.asarray(tokens).tolist())
        reply.verified_logprobs.extend(np.asarray(logprobs).tolist())
    return reply


def decode_mixed(reply: "agent_pb2.StepReply", num_logits_rows: int) -> MixedStep:
    """What `encode_mixed` was given, for a step that asked for `num_logits_rows` rows' logits."""
    tokens, logprobs = decode_greedy(reply, 1)
    logits = np.frombuffer(reply.logits, dtype="<f4")
    if reply.vocab_size <= 0 or logits.size != num_logits_rows * reply.vocab_size:
        raise RuntimeError(
            f"agent step {reply.step_id} returned {logits.size} logits for {num_logits_rows} rows of "
            f"a vocabulary of {reply.vocab_size}"
        )
    verified, at = {}, 0
    all_tokens = np.asarray(reply.verified_tokens, dtype=np.int64)
    all_logprobs = np.asarray(reply.verified_logprobs, dtype=np.float32)
    for row, length in zip(reply.verified_rows, reply.verified_lens):
        verified[row] = (all_tokens[at : at + length], all_logprobs[at : at + length])
        at += length
    return MixedStep(
        tokens, logprobs, logits.reshape(num_logits_rows, reply.vocab_size), verified, _decode_every(reply)
    )


_FRAME = struct.Struct("<I")


def write_startup_event(fd: int, rank: int, ready_pid: int | None = None, failed_reason: str | None = None) -> None:
    """Writes one AgentStartupEvent, framed, to the pipe `fd` (the agent's side)."""
    event = agent_pb2.AgentStartupEvent(protocol_version=AGENT_PROTOCOL_VERSION, rank=rank)
    if failed_reason is not None:
        event.failed_reason = failed_reason
    else:
        event.ready_pid = ready_pid
    data = event.SerializeToString()
    os.write(fd, _FRAME.pack(len(data)) + data)


class StartupEventReader:
    """Collects the framed AgentStartupEvents that arrive, in pieces, on one pipe (the starter's side)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list["agent_pb2.AgentStartupEvent"]:
        self._buffer += data
        events = []
        while len(self._buffer) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(self._buffer)
            if len(self._buffer) < _FRAME.size + size:
                break
            event = agent_pb2.AgentStartupEvent.FromString(self._buffer[_FRAME.size : _FRAME.size + size])
            self._buffer = self._buffer[_FRAME.size + size :]
            if event.protocol_version != AGENT_PROTOCOL_VERSION:
                raise RuntimeError(
                    f"agent rank {event.rank} speaks protocol {event.protocol_version}, this worker "
                    f"{AGENT_PROTOCOL_VERSION}"
                )
            events.append(event)
        return events
