"""The store end to end, as a user runs it: `localradix pull | ls | alias | serve | rm` in
subprocesses, against a local stand-in for the hub (hub_standin.py says which routes it serves),
with the real huggingface-hub client. The tests run in order on one store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_standin import HubStandIn, Repo
from store_support import (
    EMPTY_REPO,
    ENCODER_REPO,
    FOLDER_REPO,
    GGUF_REPO,
    cli,
    files_under,
    start_serve,
    store_env,
)

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

QUANT_FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"


@pytest.fixture(scope="module")
def hub(hub_repos: dict[str, Repo]) -> Iterator[HubStandIn]:
    standin = HubStandIn(hub_repos).start()
    yield standin
    standin.stop()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("user")


@pytest.fixture(scope="module")
def env(home: Path, hub: HubStandIn) -> dict[str, str]:
    return store_env(home, hub)


def one_line_error(result: Any) -> str:
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("localradix: error: "), result.stderr
    return last


def test_pull_gguf_by_quant_tag_in_any_case(env, hub, home):
    r = cli(env, "pull", f"{GGUF_REPO}:q4_1")
    assert r.returncode == 0, r.stderr
    assert "as smollm2:135m-q4_1" in r.stdout
    snapshot = next((home / "hf/hub/models--test-org--SmolLM2-135M-Instruct-GGUF").glob("snap*/*"))
    assert sorted(p.name for p in snapshot.iterdir()) == [QUANT_FILE]  # no README, no Q8_0
    assert hub.gets("README.md") == [] and hub.gets("SmolLM2-135M-Instruct-Q8_0.gguf") == []


def test_pull_a_folder_fetches_only_what_a_model_needs(env, hub, home):
    r = cli(env, "pull", FOLDER_REPO)
    assert r.returncode == 0, r.stderr
    snapshot = next((home / "hf/hub/models--test-org--tiny-llama-1M").glob("snap*/*"))
    assert sorted(p.name for p in snapshot.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json",
    ]  # fmt: skip
    assert hub.gets("onnx/model.onnx") == [] and hub.gets("pytorch_model.bin") == []


def test_ls_lists_both_and_the_bundled_model(env):
    r = cli(env, "ls")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[1]: line.split() for line in r.stdout.splitlines()[1:]}
    assert rows["bundled"][:4] == ["smollm2:135m-q4_1", "bundled", "gguf", "Q4_1"]
    gguf = rows[f"{GGUF_REPO}:Q4_1"]
    assert gguf[2:4] == ["gguf", "Q4_1"] and gguf[-2:] == ["llama", "8192"]
    assert gguf[4:6] == ["98.4", "MB"]
    folder = rows[FOLDER_REPO]
    assert folder[0] == "tiny-llama:1m-f32" and folder[2:4] == ["safetensors", "f32"]
    assert folder[-2:] == ["LlamaForCausalLM", "256"]


@pytest.mark.parametrize(
    "ref, expected",
    [
        ("test-org/nope", "no model repo 'test-org/nope' on http://127.0.0.1:"),
        (f"{GGUF_REPO}:Q5_K_M", "quant 'Q5_K_M' is not one of test-org/SmolLM2-135M-Instruct-GGUF"),
        (EMPTY_REPO, "test-org/no-model holds no model files"),
        (ENCODER_REPO, "test-org/bert-tiny is not a model that generates text"),
        (f"{FOLDER_REPO}:Q4_0", "has no GGUF files, so no quant 'Q4_0' to pick"),
        ("not-a-repo", "is not a repo id"),
    ],
)
def test_bad_pulls_say_what_to_do_and_write_nothing(env, home, ref, expected):
    before = files_under(home / "hf")
    line = one_line_error(cli(env, "pull", ref))
    assert expected in line, line
    assert files_under(home / "hf") == before


def test_unknown_quant_lists_the_choices(env):
    line = one_line_error(cli(env, "pull", f"{GGUF_REPO}:Q5"))
    assert "Q4_1 (98.4 MB), Q8_0 (49.2 MB)" in line
    assert f"`localradix pull {GGUF_REPO}:Q4_1`" in line


def test_a_truncated_gguf_is_refused_and_removed(env, home):
    before = files_under(home / "hf")
    line = one_line_error(cli(env, "pull", f"{GGUF_REPO}:Q8_0"))
    assert "SmolLM2-135M-Instruct-Q8_0.gguf is not a whole GGUF file" in line
    assert "its files were removed" in line
    after = files_under(home / "hf")
    assert not any("Q8_0" in f for f in after)
    assert {f for f in after - before if "/blobs/" in f or "/snapshots/" in f} == set()


def test_a_name_of_two_models_is_an_error_that_lists_them(env, home):
    """The pulled GGUF's derived alias is the bundled model's: the name is refused."""
    line = one_line_error(cli(env, "alias", "smollm2:135m-q4_1", "x"))
    assert f"matches 2 models (bundled, {GGUF_REPO}:Q4_1)" in line
    assert "`localradix alias bundled NEW-NAME`" in line
    proc_log = home / "ambiguous.log"
    with pytest.raises(AssertionError, match="matches 2 models"):
        start_serve(env, "smollm2:135m-q4_1", proc_log)


@pytest.mark.slow
def test_offline_serve_of_a_user_alias_answers_through_openai(env, hub, home):
    import openai

    r = cli(env, "alias", f"{GGUF_REPO}:q4_1", "smol:pulled")
    assert (
        r.returncode == 0 and "smol:pulled -> test-org/SmolLM2-135M-Instruct-GGUF:Q4_1" in r.stdout
    )
    hub.stop()
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    r = cli(offline, "ls")
    assert r.returncode == 0 and "smol:pulled" in r.stdout
    proc, url = start_serve(offline, "smol:pulled", home / "serve.log")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x")
        ids = [m.id for m in client.models.list()]  # the served one, then the store's others
        assert ids[0] == "smol:pulled" and "smol:pulled" not in ids[1:]
        reply = client.chat.completions.create(
            model="smol:pulled",
            messages=[{"role": "user", "content": "Say hi"}],
            max_tokens=8,
            temperature=0,
        )
        assert reply.choices[0].message.content
    finally:
        proc.terminate()
        proc.wait(60)
    line = one_line_error(cli(offline, "pull", f"{GGUF_REPO}:Q8_0"))
    assert "HF_HUB_OFFLINE is set" in line
    r = cli(offline, "pull", FOLDER_REPO)  # already here: fine offline
    assert r.returncode == 0 and "is in the store; the hub did not answer" in r.stdout


@pytest.mark.slow
def test_offline_serve_of_a_pulled_folder_by_its_derived_alias(env, home):
    import openai

    proc, url = start_serve({**env, "HF_HUB_OFFLINE": "1"}, "tiny-llama:1m-f32", home / "f.log")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x")
        reply = client.completions.create(
            model="tiny-llama:1m-f32", prompt="a b c", max_tokens=4, temperature=0
        )
        assert reply.model == "tiny-llama:1m-f32" and 0 < reply.usage.completion_tokens <= 4
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.slow  # removes the alias the offline serve above made
def test_rm_asks_then_removes_the_files_and_the_alias(env, home):
    line = one_line_error(cli(env, "rm", "smol:pulled"))
    assert "pass --yes" in line
    r = cli(env, "rm", "smol:pulled", "--yes")
    assert r.returncode == 0, r.stderr
    assert f"removed {GGUF_REPO}:Q4_1" in r.stdout
    assert not (home / "hf/hub/models--test-org--SmolLM2-135M-Instruct-GGUF").exists()
    assert "smol:pulled" not in (home / "localradix/aliases.json").read_text()
    r = cli(env, "rm", "tiny-llama:1m-f32", "-y")
    assert r.returncode == 0, r.stderr
    assert [f for f in files_under(home / "hf/hub") if f.startswith("models--")] == []
    r = cli(env, "ls")
    assert [line.split()[1] for line in r.stdout.splitlines()[1:]] == ["bundled"]
    assert "always kept" in one_line_error(cli(env, "rm", "bundled", "-y"))
