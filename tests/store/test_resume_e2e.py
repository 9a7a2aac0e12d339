"""Interrupted pulls of a split GGUF (two shards) from the hub stand-in: a connection cut
mid-file resumes with a Range request; a hub gone mid-file fails in one line, keeps the finished
shard, lists nothing, and the next pull fetches only what is missing."""

from __future__ import annotations

import pytest
from store_support import SHARDS, SPLIT_REPO, cli, files_under, store_env

pytestmark = pytest.mark.slow  # seconds of e2e work: the full suite runs it, the fast tier does not

CHUNK = 10 << 20  # huggingface-hub writes what it receives in chunks of 10 MiB
CUT_AT = CHUNK + 1000


def test_a_cut_connection_resumes_where_it_stopped(make_hub, hub_repos, tmp_path):
    hub = make_hub(cut={SHARDS[1]: CUT_AT})
    env = store_env(tmp_path, hub)
    r = cli(env, "pull", f"{SPLIT_REPO}:q8_0")
    assert r.returncode == 0, r.stderr
    assert hub.gets(SHARDS[1]) == [None, f"bytes={CHUNK}-"]  # the first chunk is kept
    snapshot = next((tmp_path / "hf/hub/models--test-org--Tiny-2M-GGUF").glob("snap*/*"))
    for name in SHARDS:
        assert (snapshot / name).read_bytes() == hub_repos[SPLIT_REPO].files[name].read_bytes()
    r = cli(env, "ls")
    row = next(line.split() for line in r.stdout.splitlines() if SPLIT_REPO in line)
    assert row[0] == "tiny:2m-q8_0" and row[2:4] == ["gguf", "Q8_0"] and row[-1] == "512"


def test_a_hub_gone_mid_file_keeps_finished_shards_for_the_next_pull(make_hub, tmp_path):
    hub = make_hub(cut={SHARDS[1]: CUT_AT}, die_on_cut=True)
    env = store_env(tmp_path, hub)
    r = cli(env, "pull", f"{SPLIT_REPO}:Q8_0")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"localradix: error: cannot download {SPLIT_REPO} from {hub.url}")
    assert "run the same pull again; finished files are kept" in last
    left = files_under(tmp_path / "hf")
    assert not [f for f in left if f.endswith(".incomplete")]
    assert sum("/blobs/" in f for f in left) == 1  # the first shard, finished
    assert SPLIT_REPO not in cli(env, "ls").stdout  # half a model is not a model

    hub.stop()
    again = make_hub(port=hub.port)
    r = cli(env, "pull", f"{SPLIT_REPO}:Q8_0")
    assert r.returncode == 0, r.stderr
    assert again.gets(SHARDS[0]) == [] and again.gets(SHARDS[1]) == [None]
    assert SPLIT_REPO in cli(env, "ls").stdout


def test_rm_of_a_repo_id_removes_a_partial_pull(make_hub, tmp_path):
    hub = make_hub(cut={SHARDS[1]: CUT_AT}, die_on_cut=True)
    env = store_env(tmp_path, hub)
    assert cli(env, "pull", f"{SPLIT_REPO}:Q8_0").returncode == 1
    r = cli(env, "rm", SPLIT_REPO, "--yes")
    assert r.returncode == 0 and "removed the partial download" in r.stdout, r.stderr
    assert not [f for f in files_under(tmp_path / "hf/hub") if f.startswith("models--")]
