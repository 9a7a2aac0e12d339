"""Every workload at a tiny scale against a real HTTP server: the report's arithmetic holds,
turns are sent in order, concurrency is respected, and failures become errors."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from localradix.bench import run_bench
from localradix.bench.options import build_parser
from localradix.bench.report import summarize
from localradix.bench.runner import Endpoint, RunOptions, run_workload
from localradix.bench.workloads import WORKLOADS, Sizes, build_workload

TINY = Sizes(scale=0.1, system_tokens=200, doc_tokens=300, prompt_tokens=20, max_tokens=8)
QUIET = RunOptions(concurrency=4, warmup=0, progress=False, request_timeout=10)
HERE = Path(__file__).parent


def bench(server, name, model="fake", sizes=TINY, opts=QUIET, nonce=""):
    wl = build_workload(name, sizes, seed=1, nonce=nonce)
    endpoint = Endpoint(server.url + "/v1", model)
    run = asyncio.run(run_workload(endpoint, wl, opts))
    return wl, run, summarize(run, wl, {"label": model})


def assert_monotonic(d):
    if d["n"]:
        assert d["min"] <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"]
        assert d["min"] <= d["mean"] <= d["max"]


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_report_arithmetic(fake_server, name):
    wl, run, rep = bench(fake_server, name, nonce=name)
    n = wl.num_requests
    assert rep["requests"] == {"total": n, "ok": n, "errors": 0}
    tok = rep["tokens"]
    # tokens counted from the stream match the server's usage, request by request
    assert all(r.stream_tokens == r.output_tokens == wl.max_tokens for r in run.results)
    assert tok["output_from_stream"] == tok["output_from_usage"] == tok["output"] == n * 8
    assert tok["requests_with_usage"] == tok["requests_with_cached"] == n
    assert rep["output_tokens_per_s"] == pytest.approx(tok["output"] / rep["wall_time_s"])
    assert rep["requests_per_s"] == pytest.approx(n / rep["wall_time_s"])
    for key in ("ttft_s", "itl_s", "tpot_s", "latency_s"):
        assert_monotonic(rep[key])
    assert rep["ttft_s"]["n"] == n and rep["itl_s"]["n"] == n * 7
    assert rep["ttft_s"]["max"] <= rep["latency_s"]["max"]
    assert 0 <= rep["cached_share"] < 1
    assert rep["tokens"]["prompt"] == sum(r.prompt_tokens for r in run.results)
    json.dumps(rep)  # JSON-able


def test_sharing_shows_in_cached_share(fake_server):
    shares = {n: bench(fake_server, n, nonce=f"s-{n}")[2]["cached_share"] for n in WORKLOADS}
    assert shares["agent"] > 0.5 and shares["rag"] > 0.7 and shares["chat"] > 0.4
    assert shares["random"] < 0.25 and shares["single"] < 0.25  # only "[run tag] Request"


def test_chat_turns_follow_replies_in_order(fresh_server):
    sizes = Sizes(num_conversations=3, turns=3, prompt_tokens=5, max_tokens=4)
    wl, run, rep = bench(fresh_server, "chat", sizes=sizes)
    bodies = fresh_server.app.requests
    assert len(bodies) == 9
    for conv in wl.sessions:
        mine = [b["messages"] for b in bodies if b["messages"][0]["content"] == conv.system]
        assert [len(m) for m in mine] == [2, 4, 6]  # each turn appends a reply and a question
        for k in range(1, 3):
            assert mine[k][: len(mine[k - 1])] == mine[k - 1]
            assert mine[k][-2] == {"role": "assistant", "content": "w0 w1 w2 w3 "}
            assert mine[k][-1]["content"] == conv.turns[k]
    body = bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0 and body["max_tokens"] == 4


def test_concurrency_limit_and_single_stream(fresh_server):
    opts = RunOptions(concurrency=3, warmup=0, progress=False)
    bench(fresh_server, "random", sizes=Sizes(num_requests=12, max_tokens=20), opts=opts)
    assert fresh_server.app.max_in_flight == 3
    fresh_server.app.max_in_flight = 0
    bench(fresh_server, "single", sizes=Sizes(num_requests=3, max_tokens=5), opts=opts)
    assert fresh_server.app.max_in_flight == 1


@pytest.mark.parametrize(
    "model, message",
    [
        ("fail-500", "HTTP 500: boom"),
        ("malformed", "malformed stream chunk"),
        ("truncated", "stream ended before [DONE]"),
        ("stream-error", "error in stream: kv cache exhausted"),
        ("json", "response is not an event stream (application/json)"),
    ],
)
def test_failing_endpoint_reports_errors(fake_server, model, message):
    wl, run, rep = bench(fake_server, "chat", model=model)
    n = wl.num_requests
    assert rep["requests"] == {"total": n, "ok": 0, "errors": n}
    assert any(message in m for m in rep["error_counts"])
    skipped = rep["error_counts"].get("not sent: an earlier turn of this conversation failed", 0)
    assert skipped == n - len(wl.sessions)  # later turns of a failed conversation are not sent
    assert rep["ttft_s"]["n"] == 0 and rep["output_tokens_per_s"] == 0


def test_connection_refused_and_timeouts_are_errors(fake_server):
    wl = build_workload("random", Sizes(num_requests=3, max_tokens=4))
    run = asyncio.run(run_workload(Endpoint("http://127.0.0.1:9/v1", "x"), wl, QUIET))
    assert all(r.error and "Connect" in r.error for r in run.results)
    opts = RunOptions(concurrency=4, warmup=0, progress=False, request_timeout=0.3)
    _, _, rep = bench(fake_server, "random", model="slow", sizes=Sizes(num_requests=2), opts=opts)
    assert rep["error_counts"] == {"timeout: no complete reply within 0.3 s": 2}  # no token
    opts = RunOptions(concurrency=4, warmup=0, progress=False, request_timeout=0.5)
    sizes = Sizes(num_requests=2, max_tokens=2000)  # tokens keep coming, too many of them
    _, _, rep = bench(fake_server, "random", sizes=sizes, opts=opts)
    assert rep["error_counts"] == {"timeout: no complete reply within 0.5 s": 2}


def test_missing_usage_falls_back_to_stream_counts(fake_server):
    wl, run, rep = bench(fake_server, "agent", model="no-usage")
    assert rep["requests"]["errors"] == 0
    assert rep["tokens"]["output_from_usage"] is None and rep["tokens"]["prompt"] is None
    assert rep["tokens"]["output"] == wl.num_requests * 8
    assert rep["cached_share"] is None


def test_cli_compare_json_table_and_plot(fake_server, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "r.json", tmp_path / "p.png"
    args = [
        "--workload", "agent,random", "--scale", "0.1", "--max-tokens", "4",
        "--compare", fake_server.url + "#fake", f"flaky={fake_server.url}#flaky",
        "down=http://127.0.0.1:9",
        "--output", str(out), "--plot", str(png), "--per-request",
    ]  # fmt: skip
    assert run_bench(build_parser().parse_args(args)) == 1  # some requests failed
    doc = json.loads(out.read_text())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    base = f"127.0.0.1:{fake_server.port}"
    labels = [(r["label"], r["workload"]["name"]) for r in doc["runs"]]
    assert labels == [(t, w) for t in (base, "flaky", "down") for w in ("agent", "random")]
    assert len(doc["comparisons"]) == 4
    first = doc["runs"][0]
    assert first["requests"]["errors"] == 0 and first["target"]["model"] == "fake"
    assert len(first["per_request"]) == first["requests"]["total"]
    nonces = {r["workload"]["params"]["nonce"] for r in doc["runs"]}
    assert len(nonces) == 6 and "" not in nonces
    down = [r for r in doc["runs"] if r["label"] == "down"]
    assert all(r["requests"]["ok"] == 0 for r in down)
    printed = capsys.readouterr().out
    assert "ratio to 127.0.0.1" in printed and "workload agent" in printed


def test_cli_discovers_model_and_saves_default_path(fake_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--url", fake_server.url, "--workload", "single", "--num-requests", "2",
            "--max-tokens", "3", "--no-nonce", "--no-progress"]  # fmt: skip
    assert run_bench(build_parser().parse_args(args)) == 0
    (path,) = (tmp_path / "bench-results").glob("bench-single-*.json")
    run = json.loads(path.read_text())["runs"][0]
    assert run["target"]["model"] == "fake" and run["workload"]["params"]["nonce"] == ""
    assert "per_request" not in run


def test_cmd_target_launches_and_stops_a_server(tmp_path):
    script = HERE / "fake_openai_server.py"
    cmd = f"cmd:{sys.executable} {script} --port {{port}}#fake"
    out = tmp_path / "r.json"
    args = ["--compare", cmd, "--workload", "rag", "--scale", "0.1", "--max-tokens", "3",
            "--doc-tokens", "50", "--output", str(out), "--no-progress"]  # fmt: skip
    assert run_bench(build_parser().parse_args(args)) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["requests"]["errors"] == 0 and run["cached_share"] > 0.5
    port = run["target"]["base_url"].split(":")[-1].split("/")[0]
    import httpx

    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_server_that_fails_to_start_is_reported(tmp_path, capsys):
    script = HERE / "fake_openai_server.py"
    out = tmp_path / "r.json"
    args = ["--compare", f"cmd:{sys.executable} {script} --port {{port}} --fail",
            "--workload", "agent", "chat", "--scale", "0.1", "--output", str(out),
            "--launch-timeout", "30", "--no-progress"]  # fmt: skip
    assert run_bench(build_parser().parse_args(args)) == 1
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 2 and all(r["requests"]["ok"] == 0 for r in runs)
    assert runs[0]["fatal"].startswith("launch failed: server exited with code 1")
    err = capsys.readouterr().err
    assert "refusing to start (--fail)" in err  # the server's output tail
    log = Path(err.split("full log: ", 1)[1].split(")", 1)[0])
    assert log.exists()  # kept for the user to read
    log.unlink()


def test_launch_targets_get_common_and_own_server_args(monkeypatch, tmp_path):
    import localradix.bench.main as bench_main

    seen = []

    def fake_argv(args, port, model):
        seen.append((args, model))
        return [sys.executable, str(HERE / "fake_openai_server.py"), "--port", str(port)]

    monkeypatch.setattr(bench_main, "localradix_argv", fake_argv)
    out = tmp_path / "r.json"
    args = ["--launch", "--compare", "nocache=launch:--disable-radix-cache",
            "--server-args", "--page-size 4", "--launch-model", "m.gguf", "--model", "fake",
            "--workload", "random", "--num-requests", "2", "--max-tokens", "2",
            "--output", str(out), "--no-progress"]  # fmt: skip
    assert run_bench(build_parser().parse_args(args)) == 0
    assert seen == [
        (("--page-size", "4"), "m.gguf"),
        (("--page-size", "4", "--disable-radix-cache"), "m.gguf"),
    ]
    doc = json.loads(out.read_text())
    assert [r["label"] for r in doc["runs"]] == ["localradix", "nocache"]
    assert doc["comparisons"][0]["target"] == "nocache"
