"""The contract smg (the multi-replica gateway) needs from a worker, against the fake engine:
the model card's fields, `/v1/loads` in SGLang's schema, `POST /flush_cache`, and /health."""

from __future__ import annotations

import httpx

LOAD_FIELDS = {
    "dp_rank",
    "num_running_reqs",
    "num_waiting_reqs",
    "num_waiting_uncached_tokens",
    "num_total_reqs",
    "num_used_tokens",
    "max_total_num_tokens",
    "token_usage",
    "gen_throughput",
    "cache_hit_rate",
    "utilization",
    "max_running_requests",
}


def test_model_card_has_owner_root_and_length(fake_server):
    card = httpx.get(fake_server.base + "/models").json()["data"][0]
    assert card["owned_by"] == "localradix"
    assert card["root"] == "<fake>"  # the fake engine's model path
    assert card["max_model_len"] == 2048
    one = httpx.get(fake_server.base + "/models/" + card["id"]).json()
    assert one == card


def test_loads_in_smg_schema(fake_server):
    body = {"model": "fake-model", "prompt": "hello", "max_tokens": 4, "temperature": 0}
    assert httpx.post(fake_server.base + "/completions", json=body).status_code == 200
    report = httpx.get(fake_server.base + "/loads").json()
    assert set(report) == {"timestamp", "dp_rank_count", "loads"}
    assert report["dp_rank_count"] == 1 and len(report["loads"]) == 1
    rank = report["loads"][0]
    assert set(rank) == LOAD_FIELDS
    assert rank["dp_rank"] == 0
    assert rank["max_running_requests"] == 8  # the fixture's --max-running-requests
    assert rank["max_total_num_tokens"] > 0
    assert 0.0 <= rank["token_usage"] <= 1.0 and 0.0 <= rank["cache_hit_rate"] <= 1.0
    assert rank["num_total_reqs"] == rank["num_running_reqs"] + rank["num_waiting_reqs"]


def test_flush_cache_at_the_root_as_smg_calls_it(fake_server):
    r = httpx.post(fake_server.url + "/flush_cache")
    assert r.status_code == 200 and r.json() == {"flushed": True}


def test_health_is_200_once_loaded_and_names_the_model(fake_server):
    r = httpx.get(fake_server.url + "/health")
    models = {"fake-model": "ready"}  # every model's state (one here)
    assert r.status_code == 200
    body = {"status": "ok", "model": "fake-model", "models": models, "engine_restarts": 0}
    assert r.json() == body


def test_health_is_503_before_the_model_has_loaded():
    from litestar.testing import TestClient

    from localradix.config import ServerArgs
    from localradix.server.app import create_app

    args = ServerArgs()
    app = create_app(args)
    r = TestClient(app, base_url=f"http://127.0.0.1:{args.port}").get(
        "/health"
    )  # outside `with`: no startup, the engine never loads
    assert r.status_code == 503 and "starting" in r.json()["error"]["message"]
