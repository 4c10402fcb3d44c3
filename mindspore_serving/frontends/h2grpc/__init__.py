"""gRPC over HTTP/2 on asyncio, written for the public gRPC port's hot path.

grpcio's aio server spends 230-290 us of CPU on every unary call before the servicer runs (its EventEngine,
poller and event-loop threads hand each call over), more than MindSpore Serving's whole C++ master. This server
speaks HTTP/2 itself on the front end's event loop: frames are cut and built here (frames.py), header blocks go
through the `hpack` library, and each call runs the same grpc method handlers the grpcio server would run
(`add_generic_rpc_handlers`), with a context that offers what our servicers use (context.py). One event-loop wake-up
reads a call and, with the reply ready, one write sends it.

    frames.py    HTTP/2 framing: frame header, settings, flow-control arithmetic (pure)
    wire.py      gRPC on HTTP/2: message prefix, grpc-timeout, status trailers, metadata (pure)
    context.py   the servicer context of one call
    connection.py  one HTTP/2 connection (asyncio.Protocol): streams, flow control, calls
    server.py    the listening server: ports, TLS, limits, graceful stop
"""

from mindspore_serving.frontends.h2grpc.server import Server, ssl_context

__all__ = ["Server", "ssl_context"]
