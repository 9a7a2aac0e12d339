"""Split GGUF models (llama.cpp's NAME-00001-of-0000N.gguf shards, as `pull` fetches them) load
from their first shard on the torch runner: the bundled model cut in two serves the same greedy
tokens as the whole file; a missing shard is a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localradix import Engine, SamplingParams
from localradix.gguf_file import read_gguf
from localradix.store.bundled import ensure_bundled

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

gguf = pytest.importorskip("gguf")


def split_gguf(src: Path, folder: Path, parts: int = 2) -> list[Path]:
    """Write `src` as `parts` shards the way llama.cpp's gguf-split does: the metadata in the
    first, the tensors spread over all, `split.*` keys in each."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tensors = list(reader.tensors)
    per = -(-len(tensors) // parts)
    paths = []
    for i in range(parts):
        path = folder / f"model-{i + 1:05d}-of-{parts:05d}.gguf"
        writer = gguf.GGUFWriter(str(path), arch)
        if i == 0:
            for field in reader.fields.values():
                if field.name == "general.architecture" or field.name.startswith("GGUF."):
                    continue
                vtype = field.types[0]
                sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
                writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
        writer.add_uint16("split.no", i)
        writer.add_uint16("split.count", parts)
        writer.add_int32("split.tensors.count", len(tensors))
        chunk = tensors[i * per : (i + 1) * per]
        for t in chunk:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in chunk:
            writer.write_tensor_data(t.data)
        writer.close()
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return split_gguf(ensure_bundled(), tmp_path_factory.mktemp("split"))


def test_the_first_shard_reads_as_the_whole_model(shards: list[Path]) -> None:
    whole = read_gguf(ensure_bundled())
    split = read_gguf(shards[0])
    assert [t.name for t in split.tensors] == [t.name for t in whole.tensors]
    for a, b in zip(split.tensors, whole.tensors, strict=True):
        assert a.shape == b.shape and a.qtype == b.qtype and np.array_equal(a.data, b.data)
    assert len(read_gguf(shards[1]).tensors) < len(whole.tensors)  # a later shard: its own


def test_a_split_model_serves_the_same_greedy_tokens_on_torch(shards: list[Path]) -> None:
    params = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    prompt = [[1, 504, 3458, 314, 4624, 282, 1117, 30]]
    outputs = []
    for path in (ensure_bundled(), shards[0]):
        with Engine(str(path), backend="cpu", dtype="float32", max_total_tokens=256) as engine:
            outputs.append(engine.generate(prompt, params)[0].token_ids)
    assert outputs[0] == outputs[1] and len(outputs[0]) == 8


def test_a_missing_shard_is_named(shards: list[Path], tmp_path: Path) -> None:
    lone = tmp_path / shards[0].name
    lone.symlink_to(shards[0])
    with pytest.raises(ValueError, match="missing shard.*00002-of-00002"):
        read_gguf(lone)
