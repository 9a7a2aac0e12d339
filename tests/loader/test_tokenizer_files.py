"""Tokenizer from HF folders, and a SentencePiece-style GGUF vocabulary, against transformers."""

from __future__ import annotations

import json

import pytest

from localradix.loader import Tokenizer, load_tokenizer

from .conftest import CHAT_TEMPLATE, byte_level_vocab, gguf

transformers = pytest.importorskip("transformers")


@pytest.fixture
def hf_folder(tmp_path):
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    tokens, _ = byte_level_vocab()
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("ll", "o"), ("Ġ", "w")]
    backend = Backend(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True) for t in tokens[:3]])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    return tmp_path, fast


def test_hf_folder_tokenizer(hf_folder):
    folder, fast = hf_folder
    tok = load_tokenizer(str(folder))
    assert tok.eos_token_ids == (2, 0) and tok.bos_token_id == 1
    messages = [{"role": "user", "content": "the hello 🙂"}]
    prompt = tok.apply_chat_template(messages)
    assert prompt == fast.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.encode(prompt) == fast.encode(prompt, add_special_tokens=False)
    assert tok.decode(tok.encode(prompt)) == "user\nthe hello 🙂\nassistant\n"


def test_template_from_jinja_file_wins(hf_folder):
    folder, _ = hf_folder
    (folder / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert Tokenizer.from_folder(folder).apply_chat_template([{}, {}]) == "J2"


def test_no_tokenizer_or_template(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        Tokenizer.from_folder(tmp_path)


def _write_spm_gguf(path):
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "he", "ll", "lo", "▁he", "▁hel"]
    pieces += ["▁hell", "▁hello", "▁w", "or", "▁wor", "▁world", "ld"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in [
        (w.add_block_count, 1),
        (w.add_context_length, 64),
        (w.add_embedding_length, 8),
        (w.add_feed_forward_length, 16),
        (w.add_head_count, 2),
        (w.add_head_count_kv, 2),
    ]:
        add(value)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_sentencepiece_gguf_matches_transformers(tmp_path, cache_dir):
    from localradix.loader.gguf_convert import ensure_gguf_tokenizer
    from localradix.loader.tokenizer import Tokenizer

    _write_spm_gguf(tmp_path / "spm.gguf")
    # The rebuilt tokenizer (llama.cpp's own is load_tokenizer's and has its own tests).
    tok = Tokenizer.from_folder(ensure_gguf_tokenizer(tmp_path / "spm.gguf"))
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    for text in ["hello world", " hello", "hello\nworld", "héllo wörld", "world  hello", "x"]:
        ours = tok.encode(text, add_special_tokens=True)
        assert ours == ref.encode(text), text
        assert ours[0] == 1 and tok.decode(ours) == ref.decode(ours, skip_special_tokens=True)
        if not text.startswith(" "):  # like sentencepiece, decoding strips one leading space
            assert tok.decode(ours) == text
