"""The probes of both front ends against a readiness given by the test: REST codes and bodies (answered while the
app drains, never counted as requests in flight) and grpc.health.v1 statuses."""

import asyncio
import json

import grpc
import pytest
from grpc_health.v1 import health_pb2

from mindspore_serving.frontends.api_groups import Access
from mindspore_serving.frontends.health import HealthServicer
from mindspore_serving.frontends.restful_server import RestfulApp, build_docs_app
from mindspore_serving.master.readiness import SERVING, STOPPING, PlannedWorker, readiness
from mindspore_serving.master.worker_registry import WorkerRecord

ADD = PlannedWorker(key="add/v0/device0", servable_name="add", running=True, starts=2)


def state(phase=SERVING, registered=True, not_ready=""):
    records = (
        [
            WorkerRecord(
                key=ADD.key,
                pid=9,
                address="unix:x",
                servable_name="add",
                version_number=1,
                batch_size=1,
                methods={},
                not_ready=not_ready,
            )
        ]
        if registered
        else []
    )
    return readiness(phase, [ADD], records)


def get(app, path, client=("127.0.0.1", 1), headers=()):
    """(status, JSON body) of `GET path` through the ASGI app."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": list(headers),
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": client,
        "http_version": "1.1",
        "root_path": "",
        "asgi": {"version": "3.0"},
    }
    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body)


def app_with(current):
    return RestfulApp(dispatcher=None, max_bytes=1 << 20, fallback=build_docs_app(readiness=lambda: current[0]))


def test_rest_probes_follow_readiness_and_say_why():
    current = [state()]
    app = app_with(current)
    assert get(app, "/health") == (200, {"status": "ok"})
    assert get(app, "/v2/health/live") == (200, {"live": True})
    assert get(app, "/v2/health/ready") == (200, {"ready": True})
    status, body = get(app, "/ready")
    assert status == 200 and body["ready"] and body["servables"]["add"]["state"] == "ready"
    assert get(app, "/v2/models/add/ready") == (200, {"name": "add", "ready": True})
    assert get(app, "/v2/models/add/versions/1/ready") == (200, {"name": "add", "ready": True})
    assert get(app, "/v2/models/add/versions/2/ready") == (
        400,
        {"error": "model add version 2 is not ready: no worker serves it (ready versions: 1)"},
    )
    assert get(app, "/v2/models/nope/ready") == (404, {"error": "model nope is not found"})

    current[0] = state(registered=False)  # the worker died and restarts
    status, body = get(app, "/ready")
    assert status == 503 and not body["ready"] and body["live"]
    assert body["reason"] == f"servable add is restarting ({ADD.key}: died; not registered again yet)"
    assert get(app, "/v2/health/ready") == (400, {"error": body["reason"]})
    assert get(app, "/v2/models/add/ready") == (
        400,
        {"error": f"model add is not ready: restarting ({ADD.key}: died; not registered again yet)"},
    )
    assert get(app, "/health") == (200, {"status": "ok"})


def test_probes_are_answered_while_draining_and_not_counted():
    current = [state(STOPPING)]
    app = app_with(current)
    app.drain.accepting = False
    assert get(app, "/health") == (200, {"status": "ok"})
    status, body = get(app, "/ready")
    assert status == 503 and body["phase"] == STOPPING and body["reason"] == "the server is stopping"
    assert get(app, "/v2/health/live") == (200, {"live": True})
    assert get(app, "/v2/health/ready")[0] == 400
    assert not app.drain.running()
    assert get(app, "/v1/models")[0] == 503  # every other route is refused


class _Context:
    def __init__(self):
        self.aborted = None

    async def abort(self, code, details):
        self.aborted = (code, details)
        raise grpc.RpcError(details)


@pytest.mark.parametrize(
    "current, expected",
    [
        (state(), {"": "SERVING", "mindspore.serving.proto.MSService": "SERVING", "add": "SERVING"}),
        (
            state(not_ready="the agents of add are restarting"),
            {"": "NOT_SERVING", "mindspore.serving.proto.MSService": "NOT_SERVING", "add": "NOT_SERVING"},
        ),
        (
            state(STOPPING),
            {"": "NOT_SERVING", "mindspore.serving.proto.MSService": "NOT_SERVING", "add": "NOT_SERVING"},
        ),
    ],
)
def test_grpc_health_statuses_follow_readiness(current, expected):
    servicer = HealthServicer(lambda: current)
    name = health_pb2.HealthCheckResponse.ServingStatus.Name

    async def scenario():
        checks = {
            service: name((await servicer.Check(health_pb2.HealthCheckRequest(service=service), _Context())).status)
            for service in expected
        }
        listed = await servicer.List(health_pb2.HealthListRequest(), _Context())
        context = _Context()
        with pytest.raises(grpc.RpcError):
            await servicer.Check(health_pb2.HealthCheckRequest(service="nope"), context)
        watch = servicer.Watch(health_pb2.HealthCheckRequest(service="nope"), _Context())
        first = await watch.__anext__()
        servicer.close()
        rest = [reply async for reply in watch]
        return checks, {k: name(v.status) for k, v in listed.statuses.items()}, context.aborted, first, rest

    checks, listed, aborted, first, rest = asyncio.run(scenario())
    assert checks == expected and listed == expected
    assert aborted[0] is grpc.StatusCode.NOT_FOUND
    assert name(first.status) == "SERVICE_UNKNOWN" and rest == []


def test_ready_shows_worker_details_to_operators_only():
    app = app_with([state()])
    _, local = get(app, "/ready")  # from loopback, with no API key set: an operator
    assert local["servables"]["add"]["workers"][0]["pid"] == 9
    remote_app = RestfulApp(dispatcher=None, max_bytes=1 << 20, fallback=build_docs_app(readiness=state))
    status, remote = get(remote_app, "/ready", client=("10.1.2.3", 5))
    assert status == 200 and remote["servables"]["add"] == {"ready": True, "state": "ready", "versions": [1]}
    keyed = RestfulApp(dispatcher=None, max_bytes=1 << 20, fallback=build_docs_app(readiness=state, access=Access("k")))
    assert "workers" not in get(keyed, "/ready")[1]["servables"]["add"]  # loopback is not enough with a key
    status, body = get(keyed, "/ready", headers=[(b"authorization", b"Bearer k")])
    assert body["servables"]["add"]["workers"][0]["pid"] == 9
