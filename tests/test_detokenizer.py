"""IncrementalDetokenizer with real byte-level BPE tokenizers: never a broken character, never
(part of) a stop string in the output, and the deltas always add up to the full decode."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localradix.engine.detokenizer import IncrementalDetokenizer

CORPUS = [
    "Hello world, this is a small corpus for a byte-level BPE tokenizer.",
    "The quick brown fox jumps over the lazy dog. STOP signs and stop words.",
    "Radix trees share prefixes; caches reuse them. Done! The end.",
] * 20
TEXTS = [
    "Hello 👋🏽 world! 日本語のテキスト and émojis 🎉🎉",
    "plain ascii text with a STOP inside it",
    "🧑‍🚀 astronaut family 👨‍👩‍👧‍👦 mixed with words",
]


class _HFAdapter:
    """The subset of localradix's Tokenizer that the detokenizer and these tests use."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.eos_token_ids = (backend.token_to_id("<eos>"),)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)


@functools.lru_cache(maxsize=1)
def small_bpe() -> _HFAdapter:
    """A tiny byte-level BPE trained here: emoji and CJK split into several byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
    )
    tok.train_from_iterator(CORPUS, trainer)
    return _HFAdapter(tok)


@functools.lru_cache(maxsize=1)
def bundled():
    try:
        from localradix.loader.tokenizer_choice import load_tokenizer

        return load_tokenizer(None)
    except Exception as exc:  # the loader or the bundled model may be absent
        pytest.skip(f"bundled tokenizer unavailable: {exc}")


@pytest.fixture(params=["small_bpe", "bundled"])
def tokenizer(request):
    return small_bpe() if request.param == "small_bpe" else bundled()


def engine_stop(tok, ids, stop=()):
    """What the engine does (sched/stop_check.py): end at the first id whose text completes a
    stop string, naming it -> (the ids it generated, the matched string or None)."""
    for n in range(1, len(ids) + 1):
        text = tok.decode(ids[:n])
        hit = next((s for s in stop if s and s in text), None)
        if hit is not None:
            return ids[:n], hit
    return ids, None


def stream(tok, ids, chunk=1, stop=()):
    """The deltas a client sees when the engine generates `ids` (stopping as it would)."""
    ids, matched = engine_stop(tok, ids, stop)
    detok = IncrementalDetokenizer(tok, stop=stop)
    last = ids[-chunk:] if ids else []
    head = ids[: len(ids) - len(last)]
    deltas = [detok.add(head[i : i + chunk]) for i in range(0, len(head), chunk)]
    deltas.append(detok.finish(last, matched))  # the last output comes with the finish
    return deltas


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_deltas_add_up_and_never_break_a_character(tokenizer, text, chunk):
    ids = tokenizer.encode(text)
    deltas = stream(tokenizer, ids, chunk)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_emoji_split_across_tokens_is_emitted_whole(tokenizer):
    ids = tokenizer.encode("🎉")
    assert len(ids) > 1, "the emoji must span several tokens for this test to mean anything"
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.add([i]) for i in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "🎉"


def test_stop_string_split_across_tokens_is_cut_and_never_shown(tokenizer):
    text = "The quick brown fox says STOP and then more text"
    ids, matched = engine_stop(tokenizer, tokenizer.encode(text), ["STOP"])
    assert matched == "STOP"
    detok = IncrementalDetokenizer(tokenizer, stop=["STOP"])
    shown = ""
    for i in ids[:-1]:
        shown += detok.add([i])
        assert "S" not in shown.removeprefix("The quick brown fox s"), shown
    shown += detok.finish(ids[-1:], "STOP")
    assert shown == "The quick brown fox says "


def test_possible_stop_prefix_is_held_then_released(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop=["STOP"])
    shown = detok.add(tokenizer.encode("a STO"))
    assert shown == "a "  # "STO" might start "STOP"
    shown += detok.add(tokenizer.encode("mp"))
    assert shown == "a STOmp"
    assert detok.finish() == ""


def test_a_prefix_still_held_at_the_end_is_shown_when_no_stop_string_ended_it(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop=["STOP"])
    assert detok.add(tokenizer.encode("a STO")) == "a "
    assert detok.finish() == "STO"  # (finish reason "length": nothing matched)


def test_earliest_of_several_stop_strings_wins(tokenizer):
    deltas = stream(tokenizer, tokenizer.encode("one two three four"), stop=("four", "two"))
    assert "".join(deltas) == "one "


def test_stop_string_in_the_last_chunk_is_cut(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop=[" world"])
    shown = detok.add(tokenizer.encode("hello there"))
    assert shown + detok.finish(tokenizer.encode(" world"), " world") == "hello there"


def test_the_text_after_the_stop_string_in_its_last_token_is_cut_too():
    tok = small_bpe()
    detok = IncrementalDetokenizer(tok, stop=["x"])
    assert detok.add(tok.encode("ab")) == "ab"
    assert detok.finish(tok.encode("xcd"), "x") == ""  # one output: "x" and what followed it
    assert detok.add(tok.encode("more")) == "" and detok.finish() == ""
    assert detok.output_text == "ab"


def test_the_detokenizer_trusts_the_engine_on_stop_strings():
    """It cuts where the engine's matched string starts and nowhere else: a stop string the
    engine did not end the request on is text (one owner of the decision)."""
    tok = small_bpe()
    detok = IncrementalDetokenizer(tok, stop=["x"])
    assert detok.add(tok.encode("axb")) == "axb"
    assert detok.finish(tok.encode("cd")) == "cd"


def test_special_tokens_skipped_or_kept():
    tok = small_bpe()
    ids = tok.encode("hi") + list(tok.eos_token_ids)
    assert "".join(stream(tok, ids)) == "hi"
    detok = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert detok.add(ids) + detok.finish() == "hi<eos>"


def test_garbage_bytes_are_not_held_forever():
    tok = small_bpe()
    lone = tok.encode("é")[-1:]  # a UTF-8 continuation byte on its own
    detok = IncrementalDetokenizer(tok)
    shown = "".join(detok.add(lone) for _ in range(40))
    assert shown.count("\ufffd") >= 30


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=40), chunk=st.integers(1, 4), stop=st.sampled_from(["", "ab", "é"]))
def test_property_stream_equals_full_decode_cut_at_stop(text, chunk, stop):
    tok = small_bpe()
    ids = tok.encode(text)
    full = tok.decode(ids)
    expected = full[: full.find(stop)] if stop and stop in full else full
    got = "".join(stream(tok, ids, chunk, stop=(stop,) if stop else ()))
    assert got == expected


@functools.lru_cache(maxsize=1)
def bpe_with_markers() -> _HFAdapter:
    """small_bpe's vocabulary plus two special tokens an output parser reads (harmony-like)."""
    from tokenizers import AddedToken

    adapter = small_bpe()
    adapter.backend.add_special_tokens([AddedToken("<|channel|>", special=True)])
    adapter.backend.add_special_tokens([AddedToken("<|other|>", special=True)])
    return adapter


@given(chunk=st.integers(1, 5))
@settings(max_examples=20, deadline=None)
def test_kept_special_ids_stay_in_the_text_and_others_are_skipped(chunk: int) -> None:
    tok = bpe_with_markers()
    channel, other = tok.backend.token_to_id("<|channel|>"), tok.backend.token_to_id("<|other|>")
    ids = [
        channel,
        *tok.encode("analysis"),
        other,
        *tok.encode("Hello 👋🏽 world"),
        channel,
        channel,
        *tok.encode("final"),
        tok.eos_token_ids[0],
    ]
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True, kept_special_ids=[channel])
    out = "".join(detok.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk))
    out += detok.finish()
    assert out == "<|channel|>analysisHello 👋🏽 world<|channel|><|channel|>final"
    # Without skipping, every special token shows, the kept ones included.
    everything = IncrementalDetokenizer(tok, skip_special_tokens=False, kept_special_ids=[channel])
    assert everything.add(ids) + everything.finish() == tok.decode(ids, skip_special_tokens=False)
