"""Quant tags, GGUF choices (split shards grouped), derived aliases and pull plans."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localradix.store import StoreError
from localradix.store.names import (
    derive_alias,
    gguf_choices,
    is_repo_id,
    quant_of,
    select_choice,
    split_ref,
)
from localradix.store.pull import plan_pull

REPO_FILES = {
    "README.md": 10,
    "Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf": 4_700_000_000,
    "Qwen2.5-Coder-7B-Instruct-Q4_K_S.gguf": 4_500_000_000,
    "Qwen2.5-Coder-7B-Instruct-Q8_0-00001-of-00002.gguf": 5_000_000_000,
    "Qwen2.5-Coder-7B-Instruct-Q8_0-00002-of-00002.gguf": 3_100_000_000,
    "mmproj-Qwen2.5-f16.gguf": 600_000_000,
}


@pytest.mark.parametrize(
    "name, quant",
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("qwen2.5-coder-7b-instruct-q4_k_m.gguf", "q4_k_m"),
        ("Model-IQ2_XXS-00001-of-00003.gguf", "IQ2_XXS"),
        ("Llama-3.2-1B-Instruct-BF16.gguf", "BF16"),
        ("sub/dir/model-f16.gguf", "f16"),
        ("Qwen2-7B.gguf", None),
    ],
)
def test_quant_of(name, quant):
    assert quant_of(name) == quant


def test_choices_group_shards_and_skip_projectors():
    choices = gguf_choices(REPO_FILES)
    assert [c.label for c in choices] == ["Q4_K_M", "Q4_K_S", "Q8_0"]
    q8 = choices[2]
    assert q8.files[0].endswith("00001-of-00002.gguf") and len(q8.files) == 2
    assert q8.size == 8_100_000_000 and q8.complete


def test_a_missing_shard_makes_a_choice_incomplete():
    files = {k: v for k, v in REPO_FILES.items() if "00002-of" not in k}
    assert not next(c for c in gguf_choices(files) if c.label == "Q8_0").complete


@pytest.mark.parametrize(
    "tag, label",
    [("Q4_K_M", "Q4_K_M"), ("q4_k_m", "Q4_K_M"), ("q8", "Q8_0"), ("Q4_K_S", "Q4_K_S")],
)
def test_select_by_tag_any_case_or_unique_prefix(tag, label):
    assert select_choice("o/r", gguf_choices(REPO_FILES), tag).label == label


@pytest.mark.parametrize(
    "tag, message",
    [
        (None, "o/r has 3 GGUF files: Q4_K_M (4.7 GB), Q4_K_S (4.5 GB), Q8_0 (8.1 GB)"),
        ("q4_k", "quant 'q4_k' matches several of o/r's GGUF files: Q4_K_M (4.7 GB), Q4_K_S"),
        ("Q5_K_M", "quant 'Q5_K_M' is not one of o/r's GGUF files: Q4_K_M (4.7 GB), Q4_K_S"),
    ],
)
def test_ambiguous_or_unknown_tags_list_the_choices(tag, message):
    with pytest.raises(StoreError, match="pick one, e.g. `localradix pull o/r:Q4_K_") as info:
        select_choice("o/r", gguf_choices(REPO_FILES), tag)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    "names, variant, alias",
    [
        (["SmolLM2-135M-Instruct.Q4_1.gguf"], "Q4_1", "smollm2:135m-q4_1"),
        (
            ["Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf", "b/X-GGUF"],
            "Q4_K_M",
            "qwen2.5-coder:7b-q4_k_m",
        ),
        (["model-q4_0.gguf", "org/Mistral-7B-v0.3-GGUF"], "Q4_0", "mistral:7b-q4_0"),
        (["mlx-community/Llama-3.2-1B-Instruct-4bit"], "4bit", "llama-3.2:1b-4bit"),
        (["org/tinystories"], None, "tinystories:latest"),
        (["Mixtral-8x7B-v0.1.Q2_K.gguf"], "Q2_K", "mixtral:8x7b-q2_k"),
    ],
)
def test_derived_aliases(names, variant, alias):
    assert derive_alias(names, variant) == alias


def test_refs():
    assert split_ref("org/name:Q4_K_M") == ("org/name", "Q4_K_M")
    assert split_ref("org/name") == ("org/name", None)
    assert is_repo_id("org/name.v2") and not is_repo_id("smollm2:135m") and not is_repo_id("a/b/c")


def test_plan_fetches_only_what_a_folder_needs():
    files = {
        "config.json": 1, "generation_config.json": 1, "model-00001-of-00002.safetensors": 5,
        "model-00002-of-00002.safetensors": 5, "model.safetensors.index.json": 1,
        "tokenizer.json": 2, "tokenizer_config.json": 1, "chat_template.jinja": 1,
        "pytorch_model.bin": 9, "onnx/model.onnx": 9, "README.md": 1, "original/params.json": 1,
    }  # fmt: skip
    plan = plan_pull("o/r", files, None)
    assert plan.variant is None and plan.size == 17
    assert "pytorch_model.bin" not in plan.files and "README.md" not in plan.files
    assert len(plan.files) == 8


def test_plan_prefers_the_folder_without_a_tag_and_the_gguf_with_one():
    files = {"config.json": 1, "model.safetensors": 5, "m-Q8_0.gguf": 3}
    assert plan_pull("o/r", files, None).files == ("config.json", "model.safetensors")
    assert plan_pull("o/r", files, "q8_0").files == ("m-Q8_0.gguf",)


@given(
    st.dictionaries(
        st.from_regex(
            r"[A-Za-z]{1,6}-(Q4_K_M|Q8_0|F16)(-0000[12]-of-00002)?\.gguf", fullmatch=True
        ),
        st.integers(0, 10**9),
        max_size=8,
    )
)
def test_every_gguf_file_is_in_exactly_one_choice(files):
    placed = [f for c in gguf_choices(files) for f in c.files]
    assert sorted(placed) == sorted(files)
