"""Structured output (llguidance) in the LLM engine, over the Qwen2 fixture's real 512-token tokenizer and a fake
runner with hash-derived random logits: grammars compile or are refused with a reason, every output of many
sampled requests follows its grammar, a greedy request's output does not depend on its batch, a grammar that
allows nothing ends its request with reason "grammar", and the masks of a step are computed while it runs.
"""

import json
import os
import re

import numpy as np
import pytest
from tokenizers import Tokenizer

from mindspore_serving.agent.testing import AheadRunner
from mindspore_serving.llm import step_executor as step_executor_module
from mindspore_serving.llm.config import SchedulerConfig
from mindspore_serving.llm.engine import LLMEngine
from mindspore_serving.llm.errors import InvalidRequestError
from mindspore_serving.llm.request import FinishReason
from mindspore_serving.llm.sampler import Sampler
from mindspore_serving.llm.sampling_params import SamplingParams, StructuredOutput
from mindspore_serving.llm.structured_output import BitmaskComputer, GrammarCompiler, allowed_tokens
from mindspore_serving.llm.testing import FakeModelRunner
from mindspore_serving.models.llama.tokenizer import TextTokenizer

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "hf", "qwen2")
VOCAB = 512
EOS = 511
BS = 4

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "ok", "color", "n"],
    "additionalProperties": False,
}


def check_schema_output(text: str) -> None:
    """The output of SCHEMA: a JSON object with exactly its keys, each of its type and range."""
    value = json.loads(text)
    assert text == json.dumps(value, ensure_ascii=False, separators=(",", ":")), "JSON is generated compact"
    assert set(value) == {"name", "ok", "color", "n"}, text
    assert isinstance(value["name"], str) and len(value["name"]) <= 6, text
    assert isinstance(value["ok"], bool), text
    assert value["color"] in ("red", "green", "blue"), text
    assert isinstance(value["n"], int) and not isinstance(value["n"], bool) and 0 <= value["n"] <= 99, text


@pytest.fixture(scope="module")
def tokenizer():
    return TextTokenizer.from_file(FIXTURE)


def make_engine(tokenizer, num_blocks=1024, max_num_seqs=64, eos=EOS, ahead=False, runner=None, **overrides):
    runner = runner or (AheadRunner if ahead else FakeModelRunner)(
        num_blocks=num_blocks, block_size=BS, max_seq_len=256, vocab_size=VOCAB
    )
    config = SchedulerConfig.for_runner(
        runner, max_num_seqs=max_num_seqs, max_num_batched_tokens=512, async_scheduling=ahead, **overrides
    )
    return LLMEngine(runner, tokenizer, config, eos_token_id=eos, seed=0)


def params(kind, value="", **kwargs):
    kwargs.setdefault("max_new_tokens", 120)
    return SamplingParams(structured_output=StructuredOutput(kind, value), **kwargs)


# --- compiling ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, value, message",
    [
        ("regex", "[a-", 'structured output: invalid regex "[a-": regex parse error: unclosed character class'),
        ("json", '{"type": "bogus"}', "structured output: invalid JSON schema: Invalid type: bogus"),
        ("json", '{"type": "array", "uniqueItems": true}', 'invalid JSON schema: Unimplemented keys: ["uniqueItems"]'),
        ("json", '{"properties": {"a": {"$ref": "#/nope"}}}', "invalid JSON schema: Pointer '/nope' does not exist"),
        ("grammar", "start: foo", 'structured output: invalid grammar: at 1(8): unknown name: "foo"'),
        ("grammar", "root ::= item\n", "structured output: invalid GBNF grammar: Rule 'item' not found"),
    ],
)
def test_a_structured_output_that_does_not_compile_is_refused_naming_the_problem(tokenizer, kind, value, message):
    engine = make_engine(tokenizer)
    with pytest.raises(InvalidRequestError) as caught:
        engine.add_request("hi", params(kind, value))
    assert message in str(caught.value)
    assert not engine.has_unfinished() and engine.num_unfinished == 0
    engine.add_request("hi", params("regex", "ab"))  # the engine goes on serving
    (out,) = [o for o in _run(engine) if o.finished]
    assert out.text == "ab" and out.finish_reason is FinishReason.EOS


def test_structured_output_needs_a_tokenizer_from_tokenizer_json(tokenizer):
    engine = make_engine(None)
    with pytest.raises(InvalidRequestError, match="structured output needs the model's tokenizer"):
        engine.add_request(None, params("regex", "ab"), prompt_token_ids=[5, 6])
    assert not engine.has_unfinished()
    plain = make_engine(Tokenizer.from_file(os.path.join(FIXTURE, "tokenizer.json")))  # not wrapped: served too
    request_id = plain.add_request("q", params("regex", "ab"))
    assert _finals(plain)[request_id].text == "ab"
    with pytest.raises(InvalidRequestError, match="needs a Hugging Face tokenizer .* a CharTokenizer"):
        GrammarCompiler.for_tokenizer(CharTokenizer(), VOCAB, [EOS])


class CharTokenizer:
    """A tokenizer that is not a tokenizers one."""

    def encode(self, text):
        return [ord(c) % VOCAB for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_compiled_grammars_are_cached_by_their_text(tokenizer):
    compiler = GrammarCompiler.for_tokenizer(tokenizer, VOCAB, [EOS], cache_size=2)
    spec = StructuredOutput("json", json.dumps(SCHEMA))
    first, second = compiler.new_matcher(spec), compiler.new_matcher(StructuredOutput("json", json.dumps(SCHEMA)))
    assert (compiler.hits, compiler.misses) == (1, 1)
    assert first.matcher is not second.matcher  # each request gets its own state
    assert first.advance(tokenizer.encode('{"name"')) and first.num_consumed > 0 and second.num_consumed == 0
    compiler.new_matcher(StructuredOutput("regex", "a"))
    compiler.new_matcher(StructuredOutput("regex", "b"))  # the schema, least recently used, leaves the cache
    compiler.new_matcher(spec)
    assert (compiler.hits, compiler.misses) == (1, 4)


def test_a_grammar_state_is_fed_each_token_once_and_names_a_refused_one(tokenizer):
    compiler = GrammarCompiler.for_tokenizer(tokenizer, VOCAB, [EOS])
    state = compiler.new_matcher(StructuredOutput("regex", "abc"))
    ids = tokenizer.encode("ab")
    assert state.advance(ids[:1]) and state.advance(ids) and state.advance(ids)  # a recompute feeds nothing twice
    assert state.num_consumed == len(ids) and not state.is_stopped
    fork = state.fork()
    assert not state.advance(ids + tokenizer.encode("x"))
    assert "doesn't satisfy the grammar" in state.error and "<state>" not in state.error
    assert fork.advance(ids + tokenizer.encode("c")) and fork.is_stopped  # the fork kept its own state


def test_bitmasks_leave_unconstrained_rows_open_and_close_dead_ones(tokenizer):
    compiler = GrammarCompiler.for_tokenizer(tokenizer, VOCAB, [EOS])
    done = compiler.new_matcher(StructuredOutput("regex", "ab"))
    done.advance(tokenizer.encode("ab"))
    dead = compiler.new_matcher(StructuredOutput("regex", "ab"))
    dead.advance(tokenizer.encode("x"))
    fresh = compiler.new_matcher(StructuredOutput("choice", '["yes", "no"]'))
    computer = BitmaskComputer(VOCAB, num_threads=2)
    masks = computer.start([None, done, dead, fresh]).result()
    assert masks.dtype == np.int32 and masks.shape == (4, VOCAB // 32)
    assert (masks[0] == -1).all() and (masks[2] == 0).all()
    assert allowed_tokens(masks[1], VOCAB).tolist() == [EOS]  # a complete grammar allows only the end
    texts = {tokenizer.decode([int(t)]) for t in allowed_tokens(masks[3], VOCAB)}
    assert texts and all("yes".startswith(t) or "no".startswith(t) for t in texts)
    assert (computer.compute([None, done, dead, fresh]) == masks).all()
    computer.close()


# --- generating --------------------------------------------------------------------------------
def _run(engine):
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    return outputs


def _finals(engine):
    return {o.request_id: o for o in _run(engine) if o.finished}


@pytest.mark.parametrize("ahead", [False, True], ids=["single-step", "async"])
def test_fifty_sampled_json_requests_in_one_batch_all_follow_the_schema(tokenizer, ahead):
    engine = make_engine(tokenizer, ahead=ahead, num_scheduler_steps=4)
    schema = StructuredOutput("json", json.dumps(SCHEMA))
    ids = [
        engine.add_request(
            f"item {i}:", SamplingParams(max_new_tokens=150, temperature=1.0, seed=i, structured_output=schema)
        )
        for i in range(50)
    ]
    plain = engine.add_request("free text", SamplingParams(max_new_tokens=20, temperature=0, ignore_eos=True))
    finals = _finals(engine)
    for request_id in ids:
        assert finals[request_id].finish_reason is FinishReason.EOS, finals[request_id]
        check_schema_output(finals[request_id].text)
    assert len({finals[i].text for i in ids}) > 40  # sampled, not all alike
    assert len(finals[plain].token_ids) == 20


def test_json_object_regex_choice_and_grammars_are_followed(tokenizer):
    engine = make_engine(tokenizer)
    cases = {
        "object": (
            params("json_object", max_new_tokens=200, temperature=0.7, seed=1),
            lambda text: isinstance(json.loads(text), dict),
        ),
        "regex": (
            params("regex", r"[a-z]{3}-[0-9]{2}", temperature=1.0, seed=2),
            lambda text: re.fullmatch(r"[a-z]{3}-[0-9]{2}", text),
        ),
        "choice": (
            params("choice", json.dumps(["yes", "no", 'say "maybe"\n']), temperature=1.0, seed=3),
            lambda text: text in ("yes", "no", 'say "maybe"\n'),
        ),
        "lark": (
            params("grammar", 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,2}/', temperature=1.0, seed=4),
            lambda text: re.fullmatch(r"\([0-9]{1,2}(,[0-9]{1,2})*\)", text),
        ),
        "gbnf": (
            params("grammar", 'root ::= "ab" digit\ndigit ::= [0-9]', temperature=1.0, seed=5),
            lambda text: re.fullmatch(r"ab[0-9]", text),
        ),
    }
    ids = {name: engine.add_request("go", p) for name, (p, _) in cases.items()}
    finals = _finals(engine)
    for name, (_, check) in cases.items():
        out = finals[ids[name]]
        assert out.finish_reason is FinishReason.EOS and check(out.text), (name, out.text)


@pytest.mark.parametrize("ahead", [False, True], ids=["multi-step", "async"])
def test_a_greedy_structured_request_gets_the_same_tokens_alone_and_among_others(tokenizer, ahead):
    schema = StructuredOutput("json", json.dumps(SCHEMA))
    greedy = SamplingParams(max_new_tokens=150, temperature=0, structured_output=schema)
    alone = make_engine(tokenizer, num_scheduler_steps=4)  # a greedy grammar is never the runner's to follow
    (expected,) = alone.generate(["record:"], greedy)
    check_schema_output(expected.text)
    crowded = make_engine(tokenizer, max_num_seqs=16, ahead=ahead, num_scheduler_steps=4)
    others = [
        crowded.add_request(
            f"other {i}",
            SamplingParams(max_new_tokens=40, temperature=1.0, seed=i, structured_output=schema if i % 2 else None),
        )
        for i in range(12)
    ]
    crowded.step()
    target = crowded.add_request("record:", greedy)  # joins a batch already decoding
    finals = _finals(crowded)
    assert finals[target].token_ids == expected.token_ids and len(finals) == len(others) + 1


def test_plain_greedy_rows_beside_a_structured_one_keep_the_runner_s_tokens(tokenizer):
    """Async scheduling on an agent-like runner: a step holding a structured row and plain greedy rows is a mixed
    step, which brings back the structured row's logits only; every request gets the tokens it gets alone."""
    schema = StructuredOutput("json", json.dumps(SCHEMA))
    structured = SamplingParams(max_new_tokens=60, temperature=0, structured_output=schema)
    plain = SamplingParams(max_new_tokens=30, temperature=0, ignore_eos=True)
    prompts = [f"other {i}" for i in range(4)]
    (expected,) = make_engine(tokenizer).generate(["record:"], structured)
    expected_plain = [o.token_ids for o in make_engine(tokenizer).generate(prompts, plain)]
    engine = make_engine(tokenizer, ahead=True, num_scheduler_steps=4)
    others = [engine.add_request(prompt, plain) for prompt in prompts]
    engine.step()
    target = engine.add_request("record:", structured)
    target_seq = engine.core.scheduler.get_request(target).seq_id
    finals = _finals(engine)
    assert finals[target].token_ids == expected.token_ids
    assert [finals[request_id].token_ids for request_id in others] == expected_plain
    deferred = engine.core.runner.deferred
    mixed = [(seqs, rows) for (seqs, _, _, _), rows in zip(deferred.submissions, deferred.logits_rows) if rows]
    assert mixed and all([seqs[i].seq_id for i in rows] == [target_seq] for seqs, rows in mixed)


def test_preempted_structured_requests_recompute_without_feeding_their_grammar_twice(tokenizer):
    engine = make_engine(tokenizer, num_blocks=72, max_num_seqs=16)  # too few blocks: preemptions
    schema = StructuredOutput("json", json.dumps(SCHEMA))
    ids = [
        engine.add_request(
            f"row {i}", SamplingParams(max_new_tokens=150, temperature=1.0, seed=i, structured_output=schema)
        )
        for i in range(16)
    ]
    finals = _finals(engine)
    assert engine.core.scheduler.num_preemptions > 0
    for request_id in ids:
        check_schema_output(finals[request_id].text)


def test_a_completed_grammar_ends_the_request_even_when_its_eos_cannot(tokenizer):
    engine = make_engine(tokenizer)
    ignoring = engine.add_request("q", params("choice", '["yes", "no"]', temperature=1.0, seed=0, ignore_eos=True))
    finals = _finals(engine)
    assert finals[ignoring].finish_reason is FinishReason.STOP and finals[ignoring].text in ("yes", "no")
    no_eos = make_engine(tokenizer, eos=None)  # the engine knows no end-of-sequence id
    request_id = no_eos.add_request("q", params("regex", "[0-9]{2}", temperature=1.0, seed=0))
    out = _finals(no_eos)[request_id]
    assert out.finish_reason is FinishReason.STOP and re.fullmatch("[0-9]{2}", out.text)


def test_a_grammar_that_allows_no_token_ends_its_request_with_reason_grammar(tokenizer):
    engine = make_engine(tokenizer)
    yes = tokenizer.encode("yes")
    dead = engine.add_request("q", params("choice", '["yes"]', allowed_token_ids=[t + 1 for t in yes]))
    fine = engine.add_request("q", params("choice", '["no"]'))
    finals = _finals(engine)
    assert finals[dead].finish_reason is FinishReason.GRAMMAR and finals[dead].token_ids == []
    assert finals[dead].error is None  # not a failure: the request ends
    assert finals[fine].finish_reason is FinishReason.EOS and finals[fine].text == "no"


class MaskBlindSampler(Sampler):
    """Samples as if there were no grammar (the grammar then refuses a token)."""

    def sample_requests(self, logits, requests, bitmasks=None):
        return super().sample_requests(logits, requests)


def test_a_token_the_grammar_refuses_ends_the_request_with_reason_grammar_and_why(tokenizer):
    engine = make_engine(tokenizer)
    engine.core.executor.sampler = MaskBlindSampler(0)
    request_id = engine.add_request("q", params("regex", "[0-9]+", temperature=0))
    request = engine.core.get_request(request_id)
    (out,) = _finals(engine).values()
    assert out.finish_reason is FinishReason.GRAMMAR and len(out.token_ids) == 1
    assert request.error.startswith("structured output: Parser Error: token")


class RecordingRunner(FakeModelRunner):
    """Notes, at each `run`, how many mask computations had been started (BitmaskComputer.start calls)."""

    def __init__(self, started, **kwargs):
        super().__init__(**kwargs)
        self.started = started
        self.seen = []

    def run(self, seqs):
        self.seen.append(len(self.started))
        return super().run(seqs)


@pytest.mark.parametrize("ahead", [False, True], ids=["single-step", "async"])
def test_the_masks_of_a_step_are_started_before_the_model_runs_it(tokenizer, monkeypatch, ahead):
    started = []
    original = step_executor_module.BitmaskComputer.start

    def start(self, rows, drafts=None):
        future = original(self, rows, drafts)
        started.append(future)
        return future

    monkeypatch.setattr(step_executor_module.BitmaskComputer, "start", start)
    cls = type("AheadRecordingRunner", (RecordingRunner, AheadRunner), {}) if ahead else RecordingRunner
    runner = cls(started, num_blocks=256, block_size=BS, max_seq_len=256, vocab_size=VOCAB)
    engine = make_engine(tokenizer, ahead=ahead, runner=runner)
    engine.add_request("a", params("regex", "[a-z]{4}", temperature=0))
    engine.add_request("b", SamplingParams(max_new_tokens=1, temperature=0))
    _run(engine)
    assert started and runner.seen == list(range(1, len(started) + 1))  # one mask start before each step's run


def test_each_choice_of_a_structured_request_follows_the_grammar_on_its_own(tokenizer):
    engine = make_engine(tokenizer)
    engine.add_request(
        "q",
        SamplingParams(
            n=4,
            max_new_tokens=150,
            temperature=1.0,
            seed=3,
            structured_output=StructuredOutput("json", json.dumps(SCHEMA)),
        ),
    )
    finals = [o for o in _run(engine) if o.finished]
    assert sorted(o.index for o in finals) == [0, 1, 2, 3]
    for out in finals:
        assert out.finish_reason is FinishReason.EOS
        check_schema_output(out.text)
    assert len({o.text for o in finals}) > 1
