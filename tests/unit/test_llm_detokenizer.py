"""Incremental detokenization: never half a UTF-8 character, stop strings across token boundaries; both ways of
decoding (DecodeStream for a `tokenizers.Tokenizer`, the window decode for any other tokenizer) give the same text."""

import os

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mindspore_serving.llm.detokenizer import IncrementalDetokenizer
from mindspore_serving.models.llama.tokenizer import TextTokenizer

TEXT = "héllo 你好 🙂 world, naïve café 日本語 the end"


class _PlainTokenizer:
    """A `tokenizers.Tokenizer` behind a plain object: the detokenizer takes its window decode path."""

    def __init__(self, tokenizer):
        self._inner = tokenizer

    def __getattr__(self, name):
        return getattr(self._inner, name)


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE trained on English only, so non-ASCII characters fall apart into byte tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
        show_progress=False,
    )
    tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog. the end. " * 20], trainer)
    return tok


@pytest.fixture(params=["decode_stream", "window"])
def tokenizer(request, bpe):
    """The BPE as itself (DecodeStream) and behind a plain object (the window decode): every test runs on both."""
    return bpe if request.param == "decode_stream" else _PlainTokenizer(bpe)


def stream(detok, ids, chunk=1):
    """Feeds ids `chunk` at a time; returns the deltas and the stop string (if any)."""
    deltas, stop = [], None
    for i in range(0, len(ids), chunk):
        update = detok.update(ids[i : i + chunk])
        deltas.append(update.new_text)
        if update.stop_string is not None:
            stop = update.stop_string
            break
    deltas.append(detok.flush())
    return deltas, stop


def test_characters_split_over_tokens_are_held_back(tokenizer):
    ids = tokenizer.encode(TEXT).ids
    assert any(tokenizer.decode([i]) == "\ufffd" for i in ids)  # the test is about something
    for chunk in (1, 2, 3):
        deltas, stop = stream(IncrementalDetokenizer(tokenizer), ids, chunk)
        assert stop is None
        assert not any("\ufffd" in d for d in deltas)
        assert "".join(deltas) == TEXT


def test_each_delta_is_a_whole_character_as_soon_as_complete(tokenizer):
    ids = tokenizer.encode("你").ids
    assert len(ids) == 3
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.update([i]).new_text for i in ids] == ["", "", "你"]


def test_prompt_tokens_give_context_but_no_text(tokenizer):
    prompt = tokenizer.encode("hello").ids
    ids = tokenizer.encode(" world").ids
    deltas, _ = stream(IncrementalDetokenizer(tokenizer, prompt_token_ids=prompt), ids)
    assert "".join(deltas) == " world"


def test_stop_string_inside_one_token(tokenizer):
    ids = tokenizer.encode("hello world, the end").ids
    detok = IncrementalDetokenizer(tokenizer, stop=["world"])
    deltas, stop = stream(detok, ids)
    assert stop == "world"
    assert "".join(deltas) == "hello " == detok.output_text


@pytest.mark.parametrize(
    "stop_string, expected",
    [
        ("你好", "héllo "),  # bytes of two characters over six tokens
        ("lo 你", "hél"),  # ASCII and multi-byte tokens together
        ("world, na", "héllo 你好 🙂 "),
    ],
)
def test_stop_string_across_tokens(tokenizer, stop_string, expected):
    ids = tokenizer.encode(TEXT).ids
    detok = IncrementalDetokenizer(tokenizer, stop=[stop_string])
    deltas, stop = stream(detok, ids)
    assert stop == stop_string
    assert "".join(deltas) == expected


def test_text_that_may_start_a_stop_string_is_held_back(tokenizer):
    ids = tokenizer.encode("the quick brown fox").ids
    detok = IncrementalDetokenizer(tokenizer, stop=["fox jumps"])
    streamed = ""
    for i in ids:
        streamed += detok.update([i]).new_text
        assert len(detok.output_text) - len(streamed) <= len("fox jumps") - 1
    assert streamed == "the quick b"  # the last 8 characters may begin "fox jumps"
    assert streamed + detok.flush() == "the quick brown fox"


def test_include_stop_string_and_earliest_stop_wins(tokenizer):
    ids = tokenizer.encode("hello world, the quick brown fox").ids
    detok = IncrementalDetokenizer(tokenizer, stop=["quick", "the", "fox"], include_stop_str_in_output=True)
    deltas, stop = stream(detok, ids)
    assert stop == "the" and "".join(deltas) == "hello world, the"
    assert detok.update(tokenizer.encode(" more").ids).new_text == ""  # finished: nothing more


def test_special_tokens_are_skipped_unless_asked(tokenizer):
    eos = tokenizer.token_to_id("<eos>")
    ids = tokenizer.encode("the end").ids + [eos]
    assert "".join(stream(IncrementalDetokenizer(tokenizer), ids)[0]) == "the end"
    shown = "".join(stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=False), ids)[0])
    assert shown.endswith("<eos>")


def test_flush_releases_an_incomplete_character(tokenizer):
    ids = tokenizer.encode("ok 你").ids[:-1]
    detok = IncrementalDetokenizer(tokenizer)
    streamed = "".join(detok.update([i]).new_text for i in ids)
    assert streamed == "ok "
    assert detok.flush() == "\ufffd"


class CharTokenizer:
    """A tokenizer without skip_special_tokens: one character per id."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_any_object_with_decode_works():
    ids = [ord(c) for c in "abc<stop>def"]
    detok = IncrementalDetokenizer(CharTokenizer(), stop=["<stop>"])
    deltas, stop = stream(detok, ids)
    assert stop == "<stop>" and "".join(deltas) == "abc"


# ---- the DecodeStream path


HF_FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "hf")


def test_decode_stream_is_used_for_a_tokenizers_tokenizer_and_its_wrapper(bpe):
    assert IncrementalDetokenizer(bpe)._stream is not None
    wrapped = TextTokenizer.from_file(os.path.join(HF_FIXTURES, "qwen2", "tokenizer.json"))
    assert IncrementalDetokenizer(wrapped)._stream is not None
    assert IncrementalDetokenizer(_PlainTokenizer(bpe))._stream is None
    assert IncrementalDetokenizer(bpe, decode=bpe.decode)._stream is None  # a decode of its own is kept


@pytest.mark.parametrize("family", ["llama2_linear", "mistral", "llama3", "qwen2"])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_stream_gives_the_window_decodes_deltas(family, skip_special_tokens):
    """Byte fallback, Metaspace and byte-level BPEs: token by token, after a prompt, with a special token inside."""
    tok = Tokenizer.from_file(os.path.join(HF_FIXTURES, family, "tokenizer.json"))
    prompt = tok.encode("Once upon a time").ids
    special = sorted(tok.get_added_tokens_decoder())[0]
    ids = tok.encode(" there was", add_special_tokens=False).ids + [special]
    ids += tok.encode(" " + TEXT, add_special_tokens=False).ids
    deltas = {}
    for name, tokenizer in (("stream", tok), ("window", _PlainTokenizer(tok))):
        detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=skip_special_tokens)
        deltas[name] = [detok.update([i]).new_text for i in ids] + [detok.flush()]
    assert deltas["stream"] == deltas["window"]
    text, special_text = "".join(deltas["stream"]), tok.id_to_token(special)
    assert (special_text in text) != skip_special_tokens
    assert text.replace(special_text, "").endswith(TEXT)


class _BrokenStream:
    def step(self, tokenizer, token_id):
        raise RuntimeError("DecodeStream failed")


def test_a_failing_decode_stream_hands_over_to_the_window_decode(bpe):
    ids = bpe.encode(TEXT).ids
    detok = IncrementalDetokenizer(bpe)
    half = len(ids) // 2
    streamed = "".join(detok.update([i]).new_text for i in ids[:half])
    detok._stream = _BrokenStream()
    streamed += "".join(detok.update([i]).new_text for i in ids[half:]) + detok.flush()
    assert streamed == TEXT and detok._stream is None
