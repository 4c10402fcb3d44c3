"""The LLM routes on a FastAPI app of their own over a fake backend: the fixtures of the LLM HTTP unit tests
(import them into a test module to use them)."""

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from mindspore_serving.frontends.llm import build_llm_router
from mindspore_serving.frontends.llm.testing import FakeLlmBackend


@pytest.fixture(name="backend")
def backend_fixture():
    return FakeLlmBackend()


@pytest.fixture(name="client")
def client_fixture(backend):
    app = FastAPI()
    app.include_router(build_llm_router(backend))
    with TestClient(app) as client:
        yield client
