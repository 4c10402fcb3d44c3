"""The worker's LLM session service against a fake master: commands from a queue, a fake engine runtime whose
outputs the test hands to the session as the engine loop would, and the replies read with deadlines."""

import queue
import threading
from types import SimpleNamespace

import pytest

from mindspore_serving.common import errors
from mindspore_serving.ipc import llm_session
from mindspore_serving.llm.engine import EncodedPrompt, RequestMetrics, RequestOutput
from mindspore_serving.llm.generation_defaults import GenerationDefaults
from mindspore_serving.llm.request import FinishReason
from mindspore_serving.llm.sampling_params import SamplingParams
from mindspore_serving.proto import llm_worker_pb2 as pb
from mindspore_serving.worker.llm.prompts import Prompter
from mindspore_serving.worker.llm.session_service import LlmWorkerServicer

DEADLINE_S = 5.0
EOS = 2


class FakeStream:
    def __init__(self, tag):
        self.tag = tag
        self.aborted = threading.Event()

    def abort(self):
        self.aborted.set()


class FakeTokenizer:
    """One id per character (its code point), BOS (1) first with the special tokens."""

    special_ids = frozenset({EOS})
    special_tokens = {"bos_token": "<s>", "eos_token": "</s>"}
    chat_template = None
    vocab_size = 1000

    @staticmethod
    def encode(text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)

    @staticmethod
    def id_to_token(token_id):
        return chr(token_id)


class FakeRuntime:
    """Records what the session submits; `refuse` makes the next submit raise, as a full engine does; `steps`
    stands for the engine's completed steps."""

    def __init__(self, chat_template="<{messages}>", chat_message="{role}:{content};", generation_defaults=None):
        self.tokenizer = FakeTokenizer()
        self.spec = SimpleNamespace(name="tiny")
        self.generation_defaults = generation_defaults or GenerationDefaults()
        model = SimpleNamespace(chat_template=chat_template, chat_message=chat_message)
        self.prompter = Prompter(self.tokenizer, model, max_prompt_chars=200)
        self.submitted = queue.Queue()
        self.refuse = None
        self.steps = 0

    def submit(self, prompt, params, request_id=None, sink=None, tag=None):
        if self.refuse is not None:
            raise self.refuse
        stream = FakeStream(tag)
        self.submitted.put((prompt, params, request_id, sink, stream))
        return stream

    def engine_steps(self):
        return self.steps


class FakeContext:
    def __init__(self):
        self.callbacks = []

    def peer(self):
        return "fake-master"

    def add_callback(self, callback):
        self.callbacks.append(callback)


class FakeMaster:
    """Writes commands into a Session and collects its replies on a thread of its own."""

    def __init__(self, runtime, **options):
        self.servicer = LlmWorkerServicer(runtime, **options)
        self.context = FakeContext()
        self.commands = queue.Queue()
        self.replies = queue.Queue()
        self.ended = threading.Event()
        threading.Thread(target=self._collect, daemon=True).start()

    def _commands(self):
        while True:
            command = self.commands.get()
            if command is None:
                return
            yield command

    def _collect(self):
        for reply in self.servicer.Session(self._commands(), self.context):
            self.replies.put(reply)
        self.ended.set()

    def send(self, command):
        self.commands.put(command)

    def reply(self) -> pb.SessionBatch:
        return self.replies.get(timeout=DEADLINE_S)

    def leave(self):
        self.commands.put(None)


def output(new_ids, texts, finished=False, reason=None, token_ids=None, error=None, metrics=None):
    return RequestOutput(
        request_id="r",
        prompt="Hi",
        prompt_token_ids=[5, 6, 7],
        new_token_ids=list(new_ids),
        new_text="".join(texts),
        token_ids=list(token_ids or new_ids),
        text="".join(texts),
        finished=finished,
        finish_reason=reason,
        new_token_texts=list(texts),
        new_logprobs=[-0.5] * len(new_ids),
        metrics=metrics,
        error=error,
    )


def deliver(sink, stream, item):
    """What the engine loop does with a step's output."""
    sink.put(stream, item)
    sink.flush()


@pytest.fixture
def master():
    runtime = FakeRuntime()
    fake = FakeMaster(runtime)
    fake.runtime = runtime
    yield fake
    fake.leave()
    assert fake.ended.wait(DEADLINE_S)


def start(master, stream_id=1, params=SamplingParams(max_new_tokens=3, temperature=0), **request):
    master.send(llm_session.generate_command(stream_id, "req-1", params, **request))
    return master.runtime.submitted.get(timeout=DEADLINE_S)


def test_a_generation_sends_its_tokens_then_its_final_event(master):
    prompt, params, request_id, sink, stream = start(master, prompt="Hi")
    assert (prompt, params, request_id) == ("Hi", SamplingParams(max_new_tokens=3, temperature=0.0), "req-1")

    deliver(sink, stream, output([11, 12], ["a", "b"]))
    batch = master.reply()
    assert [s.stream_id for s in batch.streams] == [1]
    tokens = [llm_session.read_event(e) for e in batch.streams[0].events]
    assert [(t.token_id, t.text, t.logprob, t.special, t.index) for t in tokens] == [
        (11, "a", -0.5, False, 0),
        (12, "b", -0.5, False, 1),
    ]

    metrics = RequestMetrics(
        arrival_time=10.0,
        first_scheduled_time=10.5,
        first_token_time=11.0,
        last_token_time=12.0,
        finished_time=12.5,
        num_preemptions=0,
        num_cached_tokens=0,
    )
    deliver(
        sink,
        stream,
        output([EOS], [""], finished=True, reason=FinishReason.EOS, token_ids=[11, 12, EOS], metrics=metrics),
    )
    events = [llm_session.read_event(e) for e in master.reply().streams[0].events]
    token, final = events
    assert (token.token_id, token.special, token.index) == (EOS, True, 2)
    assert (
        final.text,
        final.token_ids,
        final.finish_reason,
        final.prompt_tokens,
        final.completion_tokens,
        final.prompt,
    ) == ("", [11, 12, EOS], "eos", 3, 3, "Hi")
    assert (
        final.timing.queue_time,
        final.timing.time_to_first_token,
        final.timing.inter_token_latency,
        final.timing.e2e_latency,
    ) == (0.5, 1.0, 0.5, 2.5)


def test_chat_messages_become_the_prompt_through_the_template(master):
    messages = [SimpleNamespace(role="user", content="hello"), SimpleNamespace(role="bot", content="hi")]
    prompt, *_ = start(master, messages=messages)
    assert prompt == EncodedPrompt("<user:hello;bot:hi;>", [1] + [ord(c) for c in "<user:hello;bot:hi;>"])


@pytest.mark.parametrize(
    "refusal,kind",
    [
        (errors.Overloaded("Model is overloaded: full"), pb.ERROR_KIND_OVERLOADED),
        (errors.InvalidInputs("prompt is empty"), pb.ERROR_KIND_VALIDATION),
        (errors.WorkerUnavailable("the LLM engine is stopped"), pb.ERROR_KIND_UNAVAILABLE),
    ],
)
def test_a_refused_submit_is_an_error_event_of_its_kind(master, refusal, kind):
    master.runtime.refuse = refusal
    master.send(llm_session.generate_command(4, "req-4", SamplingParams(), prompt="Hi"))
    (events,) = master.reply().streams
    assert events.stream_id == 4
    assert [(e.error.kind, e.error.message) for e in events.events] == [(kind, refusal.message)]


@pytest.mark.parametrize(
    "failure,kind,message",
    [
        (ValueError("prompt is too long"), pb.ERROR_KIND_VALIDATION, "prompt is too long"),
        (RuntimeError("agent lost"), pb.ERROR_KIND_GENERATION, "agent lost"),
        (errors.SystemError_("LLM engine failed: boom"), pb.ERROR_KIND_GENERATION, "LLM engine failed: boom"),
    ],
)
def test_an_engine_failure_is_an_error_event_of_its_kind(master, failure, kind, message):
    _, _, _, sink, stream = start(master, prompt="Hi")
    deliver(sink, stream, failure)
    events = master.reply().streams[0].events
    assert [(e.error.kind, e.error.message) for e in events] == [(kind, message)]


def test_a_request_the_model_failed_ends_with_a_generation_error(master):
    _, _, _, sink, stream = start(master, prompt="Hi")
    deliver(sink, stream, output([], [], finished=True, reason=FinishReason.ERROR, error="the step failed"))
    events = master.reply().streams[0].events
    assert [(e.error.kind, e.error.message) for e in events] == [(pb.ERROR_KIND_GENERATION, "the step failed")]


def test_an_abort_command_aborts_the_running_request(master):
    *_, stream = start(master, stream_id=7, prompt="Hi")
    master.send(llm_session.abort_command(7))
    assert stream.aborted.wait(DEADLINE_S)


def test_a_master_that_goes_away_aborts_what_runs_and_ends_the_replies(master):
    *_, stream = start(master, prompt="Hi")
    master.leave()
    assert stream.aborted.wait(DEADLINE_S)
    assert master.ended.wait(DEADLINE_S)


def test_ending_the_sessions_waits_for_running_requests(master):
    _, _, _, sink, stream = start(master, prompt="Hi")
    ender = threading.Thread(target=master.servicer.end_sessions, args=(DEADLINE_S,))
    ender.start()
    deliver(sink, stream, output([EOS], [""], finished=True, reason=FinishReason.EOS))
    assert master.reply().streams[0].events[-1].WhichOneof("event") == "final"
    assert master.ended.wait(DEADLINE_S)
    ender.join(DEADLINE_S)
    assert not stream.aborted.is_set()


def test_a_session_whose_requests_wait_sends_an_empty_batch_while_the_engine_steps_and_only_then():
    runtime = FakeRuntime()
    fake = FakeMaster(runtime, progress_interval=0.02)
    fake.runtime = runtime

    def quiet():
        with pytest.raises(queue.Empty):
            fake.replies.get(timeout=0.2)  # 10 intervals
        return True

    try:
        runtime.steps += 5
        assert quiet()  # no request in this session: the engine's steps are none of its master's business
        _, _, _, sink, stream = start(fake, prompt="Hi")
        runtime.steps += 1
        assert fake.reply() == llm_session.progress_batch()  # the request waits, the engine steps
        assert quiet()  # the engine is stuck: no heartbeat
        runtime.steps += 3
        assert fake.reply() == llm_session.progress_batch()
        deliver(sink, stream, output([EOS], [""], finished=True, reason=FinishReason.EOS))
        assert fake.reply().streams[0].events[-1].WhichOneof("event") == "final"
        runtime.steps += 1
        assert quiet()  # done: nothing left to wait for
    finally:
        fake.leave()
    assert fake.ended.wait(DEADLINE_S)


JINJA = (
    "{% for m in messages %}{% if m.role == 'bot' and loop.first %}{{ raise_exception('start with the user') }}"
    "{% endif %}{{ bos_token if loop.first }}[{{ m.role }}]{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}[bot]{% endif %}"
)


def jinja_master(generation_defaults=None):
    runtime = FakeRuntime(chat_template=JINJA, chat_message=None, generation_defaults=generation_defaults)
    fake = FakeMaster(runtime)
    fake.runtime = runtime
    return fake


def test_a_jinja_chat_is_tokenized_without_the_tokenizers_special_tokens():
    fake = jinja_master()
    try:
        prompt, *_ = start(fake, messages=[SimpleNamespace(role="user", content="hi")])
        assert prompt == EncodedPrompt("<s>[user]hi[bot]", [ord(c) for c in "<s>[user]hi[bot]"])
    finally:
        fake.leave()


def test_a_template_refusal_is_a_validation_error_with_its_message():
    fake = jinja_master()
    try:
        fake.send(
            llm_session.generate_command(
                2, "req-2", SamplingParams(), messages=[SimpleNamespace(role="bot", content="hi")]
            )
        )
        (events,) = fake.reply().streams
        assert [(e.error.kind, e.error.message) for e in events.events] == [
            (pb.ERROR_KIND_VALIDATION, "start with the user")
        ]
    finally:
        fake.leave()


def test_the_models_defaults_fill_what_the_request_left_unset():
    fake = jinja_master(GenerationDefaults.from_config({"temperature": 0.6, "top_p": 0.9, "top_k": 20}))
    try:
        _, params, *_ = start(fake, params=SamplingParams(max_new_tokens=3), prompt="Hi")
        assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k) == (3, 0.6, 0.9, 20)
        # what a request sets wins, also when it is the engine's own default
        fake.send(
            llm_session.generate_command(
                3, "req-3", SamplingParams(temperature=1.0, top_k=0), prompt="Hi", explicit=("temperature", "top_k")
            )
        )
        _, params, *_ = fake.runtime.submitted.get(timeout=DEADLINE_S)
        assert (params.temperature, params.top_p, params.top_k) == (1.0, 0.9, 0)
    finally:
        fake.leave()


def test_tokenize_and_detokenize_answer_with_the_workers_tokenizer_and_template():
    fake = jinja_master()
    try:
        chat = llm_session.TokenizeRequest("tiny", messages=[{"role": "user", "content": "hi"}], return_token_strs=True)
        tokenized = llm_session.read_tokenize_reply(
            fake.servicer.Tokenize(llm_session.tokenize_request(chat), None), return_token_strs=True
        )
        assert (tokenized.prompt, tokenized.token_ids) == ("<s>[user]hi[bot]", [ord(c) for c in "<s>[user]hi[bot]"])
        assert "".join(tokenized.token_strs) == "<s>[user]hi[bot]"
        plain = llm_session.TokenizeRequest("tiny", prompt="ab")
        reply = fake.servicer.Tokenize(llm_session.tokenize_request(plain), None)
        assert llm_session.read_tokenize_reply(reply).token_ids == [1, 97, 98]
        refused = llm_session.TokenizeRequest("tiny", messages=[{"role": "bot", "content": "hi"}])
        with pytest.raises(errors.InvalidInputs, match="^start with the user$"):
            llm_session.read_tokenize_reply(fake.servicer.Tokenize(llm_session.tokenize_request(refused), None))
        text = fake.servicer.Detokenize(llm_session.detokenize_request([104, 105]), None)
        assert llm_session.read_detokenize_reply(text) == "hi"
        with pytest.raises(errors.InvalidInputs, match=r"token id 5000 is not in this model's vocabulary \[0, 1000\)"):
            llm_session.read_detokenize_reply(fake.servicer.Detokenize(llm_session.detokenize_request([5000]), None))
    finally:
        fake.leave()


def choice_output(
    index, new_ids, finished=False, num_choices=2, cumulative_logprob=0.0, error=None, tops=None, **fields
):
    return RequestOutput(
        request_id="r",
        prompt="Hi",
        prompt_token_ids=[5, 6, 7],
        new_token_ids=list(new_ids),
        new_text="",
        token_ids=list(new_ids),
        text="",
        finished=finished,
        finish_reason=FinishReason.LENGTH if finished else None,
        new_token_texts=[chr(i) for i in new_ids],
        new_logprobs=[-0.5] * len(new_ids),
        new_top_logprobs=tops or [],
        error=error,
        index=index,
        num_choices=num_choices,
        cumulative_logprob=cumulative_logprob,
        **fields,
    )


def session_of(master):
    (session,) = master.servicer._sessions  # pylint: disable=protected-access
    return session


def events_of(batch):
    return [llm_session.read_event(e) for s in batch.streams for e in s.events]


def test_each_choice_numbers_its_tokens_and_ends_with_its_final_and_the_stream_ends_after_the_last(master):
    _, params, _, sink, stream = start(master, params=SamplingParams(max_new_tokens=2, n=2), prompt="Hi")
    assert params.num_choices == 2
    sink.put(stream, choice_output(0, [97]))
    sink.put(stream, choice_output(1, [98]))
    deliver(sink, stream, choice_output(1, [99], finished=True, cumulative_logprob=-1.0))
    tokens_and_final = events_of(master.reply())
    assert [(e.token_id, e.index, e.choice) for e in tokens_and_final[:3]] == [(97, 0, 0), (98, 0, 1), (99, 1, 1)]
    final = tokens_and_final[3]
    assert (final.choice, final.cumulative_logprob, final.completion_tokens) == (1, -1.0, 1)
    assert 1 in session_of(master)._live  # pylint: disable=protected-access
    deliver(sink, stream, choice_output(0, [100], finished=True, cumulative_logprob=-2.0))
    token, final = events_of(master.reply())
    assert (token.token_id, token.index, token.choice, final.choice, final.cumulative_logprob) == (100, 1, 0, 0, -2.0)
    assert 1 not in session_of(master)._live  # pylint: disable=protected-access


def test_top_logprobs_carry_each_alternative_s_own_text_with_special_tokens(master):
    def decode(ids, skip_special_tokens=True):
        return "".join("</s>" if i == EOS else chr(i) for i in ids if not (skip_special_tokens and i == EOS))

    master.runtime.tokenizer.decode = decode
    _, _, _, sink, stream = start(master, prompt="Hi")
    deliver(sink, stream, choice_output(0, [97], num_choices=1, tops=[[(97, -0.25), (EOS, -2.5)]]))
    (token,) = events_of(master.reply())
    assert [(t.token_id, t.text, t.logprob) for t in token.top_logprobs] == [(97, "a", -0.25), (EOS, "</s>", -2.5)]


def test_a_scored_prompt_comes_first_as_one_event(master):
    _, _, _, sink, stream = start(master, prompt="Hi")
    deliver(
        sink,
        stream,
        choice_output(
            0,
            [97],
            num_choices=1,
            prompt_logprobs=[None, -1.0, -2.0],
            prompt_top_logprobs=[[], [(6, -1.0), (65, -1.5)], [(66, -0.5)]],
        ),
    )
    scores, token = events_of(master.reply())
    assert isinstance(scores, llm_session.PromptEvent) and token.token_id == 97
    assert [(t.token_id, t.text, t.logprob) for t in scores.tokens] == [
        (5, "\x05", None),
        (6, "\x06", -1.0),
        (7, "\x07", -2.0),
    ]
    assert [[(t.token_id, t.text) for t in p.top_logprobs] for p in scores.tokens] == [
        [],
        [(6, "\x06"), (65, "A")],
        [(66, "B")],
    ]


def test_a_failed_choice_ends_the_stream_once_and_aborts_the_others(master):
    _, _, _, sink, stream = start(master, params=SamplingParams(n=3), prompt="Hi")
    deliver(sink, stream, choice_output(1, [], finished=True, error="the step failed", num_choices=3))
    (failure,) = master.reply().streams[0].events
    assert failure.error.message == "the step failed"
    assert stream.aborted.wait(DEADLINE_S)
    sink.put(stream, choice_output(0, [], finished=True, error="aborted", num_choices=3))
    deliver(sink, stream, choice_output(2, [], finished=True, num_choices=3))
    # nothing more goes out for that stream: the next reply is another stream's
    _, _, _, sink2, stream2 = start(master, stream_id=2, prompt="Hi")
    deliver(sink2, stream2, choice_output(0, [97], num_choices=1))
    assert [s.stream_id for s in master.reply().streams] == [2]
    assert 1 not in session_of(master)._live  # pylint: disable=protected-access
