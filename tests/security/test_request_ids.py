"""Request ids: every reply carries `x-request-id` (HTTP header, gRPC trailing metadata), the client's own when it
sent a usable one, a new one otherwise; errors included, so a client's failure can be found in the front end's
log, whose lines about the call end with `[request <id>]`."""

import re

import grpc
import requests
from secured_server import ADD_BODY, AUTH, KEY, TRIES

from mindspore_serving.proto import ms_service_pb2, ms_service_pb2_grpc

NEW_ID = re.compile(r"[0-9a-f]{32}\Z")


def test_rest_replies_carry_the_clients_id_or_a_new_one(server):
    _, url = server
    for _ in range(TRIES // 2):  # both front ends
        reply = requests.post(
            url + "/model/add:add_common", json=ADD_BODY, timeout=30, headers={**AUTH, "x-request-id": "client-42"}
        )
        assert reply.status_code == 200 and "instances" in reply.json() and reply.headers["x-request-id"] == "client-42"
        refused = requests.post(url + "/v1/completions", json={}, timeout=30, headers={"x-request-id": "c:7"})
        assert refused.status_code == 401 and refused.headers["x-request-id"] == "c:7"
    made = [
        requests.get(url + "/v2", headers={**AUTH, **given}, timeout=30).headers["x-request-id"]
        for given in ({}, {}, {"x-request-id": "has space"}, {"x-request-id": "x" * 129})
    ]
    assert all(NEW_ID.match(made_id) for made_id in made) and len(set(made)) == len(made)


def test_grpc_replies_carry_the_id_in_trailing_metadata(server):
    grpc_addr, _ = server
    with grpc.insecure_channel(grpc_addr) as channel:
        stub = ms_service_pb2_grpc.MSServiceStub(channel)
        request = ms_service_pb2.PredictRequest()
        request.servable_spec.name, request.servable_spec.method_name = "no_such_servable", "m"
        metadata = (("authorization", f"Bearer {KEY}"), ("x-request-id", "grpc-7"))
        try:
            _, call = stub.Predict.with_call(request, metadata=metadata, timeout=30)
            trailing = call.trailing_metadata()
        except grpc.RpcError as err:  # a refusal ends the call with a status: the id is still there
            trailing = err.trailing_metadata()
        assert ("x-request-id", "grpc-7") in tuple(trailing)
        _, call = stub.Predict.with_call(request, metadata=metadata[:1], timeout=30)
        assert NEW_ID.match(dict(call.trailing_metadata())["x-request-id"])
