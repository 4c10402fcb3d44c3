"""Incremental detokenization: never half a UTF-8 character, stop strings across token boundaries."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mindspore_serving.llm.detokenizer import IncrementalDetokenizer

TEXT = "héllo 你好 🙂 world, naïve café 日本語 the end"


@pytest.fixture(scope="module")
def tokenizer():
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
