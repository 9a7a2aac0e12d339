"""RequestTracker (fan-out, folding outputs into text, usage) and RequestLimits, on a byte-level
tokenizer (id = byte, 256 = a special end token): no model needed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from localradix.engine.tracker import Delta, RequestTracker, api_finish_reason
from localradix.limits import RequestLimits
from localradix.messages import ModelInfo, RequestOutput
from localradix.sampling_params import SamplingParams

END = 256


class ByteTokenizer:
    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        data = bytearray()
        for i in ids:
            if i < 256:
                data.append(i)
            elif not skip_special_tokens:
                data += b"<end>"
        return data.decode("utf-8", "replace")


def _ids(text: str) -> tuple[int, ...]:
    return tuple(text.encode())


def _out(rid: str, ids, **kw) -> RequestOutput:
    return RequestOutput(rid, tuple(ids), **kw)


def test_fan_out_gives_each_fork_its_rid_prompt_and_seed():
    params = SamplingParams(n=3, seed=10, max_new_tokens=5)
    tracker = RequestTracker("r", [[1, 2], [3]], params, ByteTokenizer())
    requests = tracker.engine_requests()
    assert [r.rid for r in requests] == [f"r-{i}" for i in range(6)]
    assert [r.input_ids for r in requests] == [(1, 2)] * 3 + [(3,)] * 3
    assert [r.params.seed for r in requests] == [10, 11, 12] * 2
    assert all(r.params.n == 1 for r in requests)
    unseeded = RequestTracker("u", [[1]], params.replace(seed=None), ByteTokenizer())
    assert [r.params.seed for r in unseeded.engine_requests()] == [None] * 3


def test_a_stop_token_is_not_text_even_when_special_tokens_are_shown():
    params = SamplingParams(skip_special_tokens=False, max_new_tokens=8)
    tracker = RequestTracker("r", [[1]], params, ByteTokenizer())
    choice = tracker.choices[0]
    delta = Delta(0)
    tracker.apply(choice, _out("r-0", _ids("hi")), delta)
    tracker.apply(choice, _out("r-0", (END,), finished=True, finish_reason="stop",
                               matched_stop=END, completion_tokens=3), delta)  # fmt: skip
    assert (delta.text, delta.finish_reason) == ("hi", "stop")
    assert choice.token_ids == [*_ids("hi"), END] and choice.completion_tokens == 3
    # ...but a special token that did not end the request is text when asked for
    shown = RequestTracker("s", [[1]], params.replace(ignore_eos=True), ByteTokenizer())
    shown.apply(shown.choices[0], _out("s-0", (*_ids("a"), END, *_ids("b")), finished=True,
                                       finish_reason="length"), Delta(0))  # fmt: skip
    assert shown.choices[0].text == "a<end>b"


@given(st.text(alphabet="abc xy", max_size=30), st.integers(1, 5))
def test_text_is_cut_at_the_stop_string_however_the_ids_arrive(text, chunk):
    """The engine ends at the token completing "xy" and names it; the streamed text never shows
    it, however the ids are grouped into outputs (a prefix "x" is held back meanwhile)."""
    params = SamplingParams(stop=("xy",), max_new_tokens=64)
    tracker = RequestTracker("r", [[1]], params, ByteTokenizer())
    choice = tracker.choices[0]
    hit = text.find("xy")
    ids = _ids(text if hit < 0 else text[: hit + 2])  # what the engine generates
    reason, matched = ("length", None) if hit < 0 else ("stop", "xy")
    streamed = ""
    for i in range(0, max(len(ids), 1), chunk):
        delta = Delta(0)
        last = i + chunk >= len(ids)
        out = _out("r-0", ids[i : i + chunk], finished=last,
                   finish_reason=reason if last else None, matched_stop=matched if last else None)  # fmt: skip
        tracker.apply(choice, out, delta)
        streamed += delta.text
        assert "xy" not in streamed
    assert streamed == choice.text == text.split("xy")[0]


def test_finish_reasons_and_usage():
    assert [api_finish_reason(r) for r in ("stop", "length", "abort", "error", None)] == [
        "stop",
        "length",
        "abort",
        "abort",
        "abort",
    ]
    tracker = RequestTracker("r", [[1, 2, 3], [4, 5]], SamplingParams(n=2), ByteTokenizer())
    cached = [0, 2, 1, 1]
    for choice, hit in zip(tracker.choices, cached):
        out = _out(choice.rid, _ids("ab"), finished=True, finish_reason="length",
                   completion_tokens=2, cached_tokens=hit)  # fmt: skip
        tracker.apply(choice, out, Delta(choice.index))
    assert tracker.finished
    usage = tracker.usage().as_dict()
    assert usage == {
        "prompt_tokens": 5,  # each prompt once, not once per choice
        "completion_tokens": 8,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 0 + 1},
    }


def test_limits_say_both_lengths_and_clamp_max_tokens():
    info = ModelInfo("m", "/m", 256, 512, "cpu", "cpu", "float32", kv_total_tokens=100)
    limits = RequestLimits.of(info)
    assert limits.prompt_problem([5] * 50) is None
    assert limits.prompt_problem([]).message == "the prompt is empty"
    too_long = limits.prompt_problem([5] * 300)
    assert too_long.code == "context_length_exceeded" and "300" in too_long.message
    assert "256" in too_long.message
    no_room = limits.prompt_problem([5] * 100)
    assert "100" in no_room.message and "--max-total-tokens" in no_room.message
    assert limits.prompt_problem([5, 512]).message == "token ids must be in [0, 512)"
    assert limits.prompt_problem([-1]).message == "token ids must be in [0, 512)"
    assert [limits.max_new_tokens(x) for x in (None, 10, 10**9)] == [256, 10, 256]
