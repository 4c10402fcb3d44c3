"""TGI's own client (`text-generation`, installed in .venv-clients by `make`: it pins huggingface-hub < 1, which the
server's virtualenv has outgrown) against the LLM routes. Run by tests/e2e/test_llm_http_clients.py, which sets the
fake backend's behaviour before each check:

    python tgi_checks.py URL CHECK

Prints `PASS <check>`, and exits non-zero at the first failure.
"""

import sys

from text_generation import Client
from text_generation.errors import GenerationError, OverloadedError, ValidationError
from text_generation.types import FinishReason


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def expect_raises(error, match, call):
    try:
        call()
    except error as exc:
        expect(match in str(exc), f"{error.__name__} without {match!r}: {exc}")
    else:
        raise AssertionError(f"{error.__name__} was not raised")


def generate(client):
    response = client.generate("Hi there", max_new_tokens=3, seed=5)
    expect(response.generated_text == "Hello, world", response.generated_text)
    expect(response.details.finish_reason == FinishReason.Length, response.details.finish_reason)
    expect(response.details.generated_tokens == 3, response.details.generated_tokens)
    expect([t.text for t in response.details.tokens] == ["Hello", ",", " world"], response.details.tokens)

    events = list(client.generate_stream("Hi there", stop_sequences=[" world"]))
    expect("".join(e.token.text for e in events if not e.token.special) == "Hello,", events)
    expect(events[-1].generated_text == "Hello,", events[-1])
    expect(events[-1].details.finish_reason == FinishReason.StopSequence, events[-1].details)
    expect(all(e.generated_text is None for e in events[:-1]), events)


def validation_error(client):
    expect_raises(ValidationError, "`typical_p` is not supported", lambda: client.generate("Hi", typical_p=0.5))


def overloaded(client):
    expect_raises(OverloadedError, "Model is overloaded", lambda: client.generate("Hi"))
    expect_raises(OverloadedError, "", lambda: list(client.generate_stream("Hi")))


def generation_error(client):
    expect_raises(GenerationError, "device lost", lambda: list(client.generate_stream("Hi")))


CHECKS = {f.__name__: f for f in (generate, validation_error, overloaded, generation_error)}

if __name__ == "__main__":
    url, check = sys.argv[1:]
    CHECKS[check](Client(url, timeout=30))
    print(f"PASS {check}")
