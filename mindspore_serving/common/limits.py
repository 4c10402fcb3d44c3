"""What one client may hold of a front end: request sizes, read times, connections, concurrent calls.

    limit                 default     flag (serving_server.py)   exceeded
    llm_payload_bytes     2,000,000   --llm_payload_limit        413 in the route's shape (TGI's --payload-limit)
    read_timeout          10 s        --read_timeout             the connection is closed: its request head, or
                                                                 its body, stalled that long (slowloris)
    max_connections       2048        --max_connections          429 / overloaded in the route's shape
    max_concurrent_rpcs   2048        --max_concurrent_rpcs      gRPC RESOURCE_EXHAUSTED (gRPC's own text)
    max_streams_per_conn  512         (grpc.max_concurrent_streams: the rest wait for a free stream)
    max_watch_streams     1000        --max_watch_streams        grpc.health.v1 Watch: RESOURCE_EXHAUSTED
    idle_timeout          100 s       --idle_timeout             a keep-alive connection without a request (REST)
                                                                 or an open call (gRPC) that long is closed

The classic and KServe routes and every gRPC message keep `max_msg_mb_size` (the servers' own argument, 100 MiB
as in MindSpore Serving). The master holds one Limits for the servers it starts, and hands it to its front-end
processes inside their ServerConfig.
"""

import dataclasses

from mindspore_serving.common.check_type import check_int
from mindspore_serving.proto import frontend_pb2


@dataclasses.dataclass(frozen=True)
class Limits:
    llm_payload_bytes: int = 2_000_000
    read_timeout: float = 10.0
    max_connections: int = 2048
    max_concurrent_rpcs: int = 2048
    max_streams_per_conn: int = 512
    max_watch_streams: int = 1000
    idle_timeout: float = 100.0

    def __post_init__(self) -> None:
        check_int("llm_payload_bytes", self.llm_payload_bytes, 1)
        check_int("max_connections", self.max_connections, 1)
        check_int("max_concurrent_rpcs", self.max_concurrent_rpcs, 1)
        check_int("max_streams_per_conn", self.max_streams_per_conn, 1)
        check_int("max_watch_streams", self.max_watch_streams, 0)
        for name in ("read_timeout", "idle_timeout"):
            timeout = getattr(self, name)
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
                raise RuntimeError(
                    f"Parameter '{name}' should be a number of seconds in (0, 3600], but actually {timeout!r}"
                )

    def to_proto(self) -> frontend_pb2.Limits:
        return frontend_pb2.Limits(**dataclasses.asdict(self))

    @classmethod
    def from_proto(cls, message: frontend_pb2.Limits) -> "Limits":
        return cls(**{field.name: getattr(message, field.name) for field in dataclasses.fields(cls)})


def payload_too_large(size_or_none: int | None, limit: int, what: str, flag: str) -> str:
    """The text of a 413: the body's size when known, the limit, and the setting that raises it."""
    size = "" if size_or_none is None else f" ({size_or_none} bytes)"
    return f"the request body{size} is larger than the {what} limit of {limit} bytes ({flag})"
