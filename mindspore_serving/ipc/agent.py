"""The LLM worker <-> agent boundary (agent.proto): start-up events on a pipe, then Step messages over gRPC
(SeqStep lists in, logits or greedy tokens out). AGENT_PROTOCOL_VERSION guards both."""
import os
import struct
from typing import List, Optional, Sequence

import numpy as np

from mindspore_serving.llm.model_io import SeqStep
from mindspore_serving.proto import agent_pb2

AGENT_PROTOCOL_VERSION = 3
MAX_AGENT_MSG_BYTES = 512 * 1024 * 1024
AGENT_CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_AGENT_MSG_BYTES),
                         ("grpc.max_receive_message_length", MAX_AGENT_MSG_BYTES)]


def encode_step(step_id: int, seqs: Sequence[SeqStep], greedy_steps: int = 0, after_step_id: int = 0,
                prev_rows: Sequence[int] = ()) -> "agent_pb2.StepRequest":
    request = agent_pb2.StepRequest(step_id=step_id, greedy_steps=greedy_steps, after_step_id=after_step_id)
    request.prev_rows.extend(prev_rows)
    request.query_lens.extend(len(seq.token_ids) for seq in seqs)
    request.start_pos.extend(seq.start_pos for seq in seqs)
    request.block_table_lens.extend(len(seq.block_table) for seq in seqs)
    for seq in seqs:
        request.token_ids.extend(seq.token_ids)
        request.block_tables.extend(seq.block_table)
    return request


def decode_step(request: "agent_pb2.StepRequest") -> List[SeqStep]:
    tokens = list(request.token_ids)
    tables = list(request.block_tables)
    seqs, token_at, table_at = [], 0, 0
    for query_len, start_pos, table_len in zip(request.query_lens, request.start_pos, request.block_table_lens):
        seqs.append(SeqStep(tokens[token_at:token_at + query_len], start_pos, tables[table_at:table_at + table_len]))
        token_at += query_len
        table_at += table_len
    return seqs


def encode_logits(step_id: int, logits: np.ndarray) -> "agent_pb2.StepReply":
    logits = np.ascontiguousarray(logits, dtype="<f4")
    return agent_pb2.StepReply(step_id=step_id, rows=logits.shape[0], vocab_size=logits.shape[1],
                               logits=logits.tobytes())


def decode_logits(reply: "agent_pb2.StepReply") -> np.ndarray:
    if reply.error:
        raise RuntimeError(f"agent step {reply.step_id} failed: {reply.error}")
    return np.frombuffer(reply.logits, dtype="<f4").reshape(reply.rows, reply.vocab_size)


def encode_greedy(step_id: int, tokens: np.ndarray, logprobs: np.ndarray) -> "agent_pb2.StepReply":
    reply = agent_pb2.StepReply(step_id=step_id, rows=tokens.shape[0])
    reply.tokens.extend(tokens.reshape(-1).tolist())
    reply.logprobs.extend(logprobs.reshape(-1).tolist())
    return reply


def decode_greedy(reply: "agent_pb2.StepReply", num_steps: int):
    """(tokens int64 [rows, num_steps], logprobs float32 [rows, num_steps]) of a multi-step greedy reply."""
    if reply.error:
        raise RuntimeError(f"agent step {reply.step_id} failed: {reply.error}")
    tokens = np.asarray(reply.tokens, dtype=np.int64).reshape(reply.rows, num_steps)
    return tokens, np.asarray(reply.logprobs, dtype=np.float32).reshape(reply.rows, num_steps)


_FRAME = struct.Struct("<I")


def write_startup_event(fd: int, rank: int, ready_pid: Optional[int] = None, failed_reason: Optional[str] = None):
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

    def __init__(self):
        self._buffer = b""

    def feed(self, data: bytes) -> List["agent_pb2.AgentStartupEvent"]:
        self._buffer += data
        events = []
        while len(self._buffer) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(self._buffer)
            if len(self._buffer) < _FRAME.size + size:
                break
            event = agent_pb2.AgentStartupEvent.FromString(self._buffer[_FRAME.size:_FRAME.size + size])
            self._buffer = self._buffer[_FRAME.size + size:]
            if event.protocol_version != AGENT_PROTOCOL_VERSION:
                raise RuntimeError(f"agent rank {event.rank} speaks protocol {event.protocol_version}, this worker "
                                   f"{AGENT_PROTOCOL_VERSION}")
            events.append(event)
        return events
