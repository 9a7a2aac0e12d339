"""Tiny random-weight GGUFs of every model family localradix serves through llama.cpp.

Each family is built with transformers from a config (hidden 64, 2-6 layers, a few small
experts for MoE, seed 0), saved as a Hugging Face folder with a tokenizer, and converted by the
llama.cpp converter that the installed llama-cpp-python vendors (`convert_hf_to_gguf.py` with its
in-tree `gguf-py` first on PYTHONPATH, as a subprocess), so the GGUF is what a user's converter
would write for a real model of that family.

Tokenizers: BPE families get the bundled SmolLM2 tokenizer (its pre-tokenizer hashes to
`smollm`; 49,152 tokens, and no smaller BPE vocabulary can keep a known hash, since the hash is
of token ids up to 46,438); families whose converter wants SentencePiece (gemma3, gemma4,
phi3) get a 1,024-token SentencePiece BPE model trained here on seeded filler text.

GGUFs are cached under `$LOCALRADIX_CACHE_DIR/families/<family>-<hash>/model.gguf` (hash of this
file, family_configs.py, the tokenizer source and the llama-cpp-python / transformers / torch versions), built once
under a file lock, so parallel sessions (and pytest-xdist workers) share one build.

`python -m tests.families.gguf_families [family ...]` (from the repository root) builds them and
prints each one's build time and path.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .family_configs import FAMILIES, SEED, SPM_VOCAB, Family

TESTS = Path(__file__).resolve().parent.parent
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _load_sibling(name: str) -> Any:
    """tests/<name>.py by path (tests/ is no package; works with any pytest import mode)."""
    key = f"_localradix_tests_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, TESTS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


llama_sdist = _load_sibling("llama_sdist")


# ---- tokenizers ------------------------------------------------------------------------------
def _filler_lines(n: int = 3000) -> list[str]:
    from localradix.bench.words import WORDS

    rng = random.Random(SEED)
    return [" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(n)]


def _train_spm(specials: dict[str, Any]) -> bytes:
    """A SentencePiece BPE model with byte fallback (any text encodes) and the given pieces."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_filler_lines()),
        model_writer=out,
        vocab_size=SPM_VOCAB,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        num_threads=1,  # one thread: the same model on every machine
        minloglevel=2,
        # <|endoftext|>: llama.cpp looks it up by text in phi3 models (absent = a load error).
        user_defined_symbols=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        **specials,
    )
    return out.getvalue()


GEMMA_SPECIALS: dict[str, Any] = dict(
    pad_id=0, eos_id=1, bos_id=2, unk_id=3,
    pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
)  # fmt: skip
LLAMA_SPECIALS: dict[str, Any] = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)


def _write_spm_tokenizer(folder: Path, gemma: bool) -> None:
    model = _train_spm(GEMMA_SPECIALS if gemma else LLAMA_SPECIALS)
    (folder / "tokenizer.model").write_bytes(model)
    bos, eos, unk = ("<bos>", "<eos>", "<unk>") if gemma else ("<s>", "</s>", "<unk>")
    config: dict[str, Any] = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "add_bos_token": True,
        "chat_template": CHAT_TEMPLATE,
        # Gemma's class adds a <mask> token beyond tokenizer.json (one past the config's vocab).
        "tokenizer_class": "PreTrainedTokenizerFast" if gemma else "LlamaTokenizer",
    }
    if gemma:
        config["pad_token"] = "<pad>"
        _write_gemma_tokenizer_json(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def _write_gemma_tokenizer_json(folder: Path) -> None:
    """tokenizer.json from tokenizer.model: gemma4's converter reads only this (LlamaHfVocab)."""
    import sentencepiece as spm
    from transformers.convert_slow_tokenizer import GemmaConverter, GemmaSentencePieceExtractor

    class Extractor(GemmaSentencePieceExtractor):
        # transformers 5.25's Gemma extractor reads self.sp, which nothing sets.
        def __init__(self, model: str) -> None:
            super().__init__(model)
            self.sp = spm.SentencePieceProcessor(model_file=model)

    class Converter(GemmaConverter):
        SpmExtractor = Extractor

    slow = SimpleNamespace(
        vocab_file=str(folder / "tokenizer.model"),
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
    )
    Converter(slow).converted().save(str(folder / "tokenizer.json"))


def _smollm2_tokenizer_folder() -> Path:
    """tokenizer.json + tokenizer_config.json read from the bundled SmolLM2 GGUF."""
    from localradix.loader.gguf_convert import ensure_gguf_tokenizer
    from localradix.store.bundled import ensure_bundled

    return ensure_gguf_tokenizer(ensure_bundled())  # fetched once if not on this machine


def _write_bpe_tokenizer(folder: Path) -> None:
    source = _smollm2_tokenizer_folder()
    shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE  # no "You are SmolLM" system line in the fixtures
    # SmolLM2's own class: AutoTokenizer would otherwise pick the family's (Qwen2Tokenizer
    # re-splits digits its way), changing the pre-tokenizer hash the converter checks.
    config["tokenizer_class"] = "GPT2Tokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def _vocab_size(family: Family) -> int:
    if family.vocab == "bpe":
        tokenizer = json.loads((_smollm2_tokenizer_folder() / "tokenizer.json").read_text())
        return len(tokenizer["model"]["vocab"])
    return SPM_VOCAB


# ---- building --------------------------------------------------------------------------------
def _save_hf_model(family: Family, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    config = family.config(_vocab_size(family))
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if family.tune is not None:
        family.tune(model)
    model.save_pretrained(folder)
    if family.fix_config is not None:
        path = folder / "config.json"
        saved = json.loads(path.read_text())
        family.fix_config(saved)
        path.write_text(json.dumps(saved, indent=1))


def _write_tokenizer(family: Family, folder: Path) -> None:
    if family.vocab == "bpe":
        _write_bpe_tokenizer(folder)
    else:
        _write_spm_tokenizer(folder, gemma=family.vocab == "spm-gemma")


def _convert(family: Family, folder: Path, out: Path) -> None:
    tree = llama_sdist.llama_cpp_tree()
    env = dict(os.environ)
    # The in-tree gguf-py, never PyPI's `gguf` (same version string, fails on new models).
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "gguf-py"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(tree / "convert_hf_to_gguf.py"), str(folder)]
    cmd += ["--outfile", str(out), "--outtype", "f16", *family.flags]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"converting {family.name} failed:\n{done.stderr[-4000:]}")


def build_family(family: Family, dest: Path) -> None:
    """dest/hf (the transformers folder) and dest/model.gguf, built in a temporary folder."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{family.name}-") as tmp:
        work = Path(tmp) / "out"
        hf = work / "hf"
        hf.mkdir(parents=True)
        _save_hf_model(family, hf)
        _write_tokenizer(family, hf)
        _convert(family, hf, work / "model.gguf")
        (work / "build.json").write_text(json.dumps(_build_facts(family), indent=1))
        os.replace(work, dest)  # whole folder at once: readers never see half a build


# ---- cache -----------------------------------------------------------------------------------
def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _inputs_hash(family: Family) -> str:
    """What the build depends on: this file, the tokenizer source, and the libraries."""
    digest = hashlib.sha256()
    digest.update(Path(__file__).read_bytes())
    digest.update((Path(__file__).parent / "family_configs.py").read_bytes())
    digest.update(family.name.encode())
    for package in ("llama-cpp-python", "transformers", "torch", "sentencepiece"):
        digest.update(f"{package}={_version(package)}".encode())
    if family.vocab == "bpe":
        digest.update((_smollm2_tokenizer_folder() / "tokenizer.json").read_bytes())
    else:
        digest.update("\n".join(_filler_lines()).encode())  # the SentencePiece training text
    return digest.hexdigest()[:16]


def _build_facts(family: Family) -> dict[str, Any]:
    return {
        "family": family.name,
        "kind": family.kind,
        "workarounds": family.note,
        "llama_cpp_python": _version("llama-cpp-python"),
        "transformers": _version("transformers"),
        "torch": _version("torch"),
        "built_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def families_root() -> Path:
    return llama_sdist.cache_root() / "families"


def family_gguf(name: str) -> Path:
    """The cached GGUF of one family, built first if needed (once across processes)."""
    family = FAMILIES[name]
    dest = families_root() / f"{name}-{_inputs_hash(family)}"
    gguf = dest / "model.gguf"
    if gguf.is_file():
        return gguf
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds the file
        if not gguf.is_file():
            build_family(family, dest)
    return gguf


def build_all(names: list[str] | None = None) -> dict[str, float]:
    """Build (or find) each family's GGUF; seconds taken per family (about 0 when cached)."""
    seconds = {}
    for name in names or list(FAMILIES):
        start = time.monotonic()
        family_gguf(name)
        seconds[name] = time.monotonic() - start
    return seconds


if __name__ == "__main__":
    for name, took in build_all(sys.argv[1:] or None).items():
        print(f"{name:18s} {took:6.1f}s  {family_gguf(name)}")
