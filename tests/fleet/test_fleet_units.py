"""The fleet's pieces without processes: where replicas run, smg's command line, restart
backoff, the CLI flags, and the message when smg is missing."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localradix import cli
from localradix.config import ServerArgs, args_from_namespace
from localradix.fleet import gateway
from localradix.fleet.child import Backoff, Child
from localradix.fleet.placement import place_replicas, visible_gpus


def test_cpu_replicas_split_the_cores():
    placements = place_replicas(3, ServerArgs(), gpus=[], cores=8)
    assert [p.flags for p in placements] == [("--threads", "2")] * 3
    assert all(p.env["OMP_NUM_THREADS"] == "2" for p in placements)


def test_given_threads_are_kept_for_every_replica():
    (placement,) = place_replicas(1, ServerArgs(threads=3), gpus=[], cores=8)
    assert placement.flags == () and placement.env["OMP_NUM_THREADS"] == "3"


def test_gpu_replicas_get_one_device_each_in_turn():
    placements = place_replicas(3, ServerArgs(), gpus=["4", "7"])
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in placements] == ["4", "7", "4"]
    assert all(p.flags == () for p in placements)


def test_cpu_backends_ignore_gpus():
    (placement,) = place_replicas(1, ServerArgs(backend="llamacpp"), gpus=["0"], cores=4)
    assert "CUDA_VISIBLE_DEVICES" not in placement.env


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5")
    assert visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert visible_gpus() == []


def test_gateway_command_line():
    args = ServerArgs(host="0.0.0.0", port=9000, router_policy="round_robin", cors_origins=("*",))
    argv = gateway.gateway_argv(args, ["http://127.0.0.1:1", "http://127.0.0.1:2"], 1234)
    assert argv[:5] == [
        sys.executable,
        "-m",
        "localradix.fleet.smg_launch",
        "launch",
        "--worker-urls",
    ]
    text = " ".join(argv)
    assert "--worker-urls http://127.0.0.1:1 http://127.0.0.1:2 --policy round_robin" in text
    assert "--host 0.0.0.0 --port 9000" in text
    assert "--prometheus-host 127.0.0.1 --prometheus-port 1234" in text
    assert "--cors-allowed-origins *" in text


def test_smg_accepts_the_gateway_command_line():
    argv = gateway.gateway_argv(ServerArgs(), ["http://127.0.0.1:1"], 1234)
    help_text = subprocess.run(
        [*argv[:4], "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for flag in (a for a in argv[4:] if a.startswith("--")):
        assert flag in help_text, flag


def test_a_missing_smg_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(gateway.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(gateway.GatewayMissing, match="pip install smg"):
        gateway.require_smg()


@given(st.integers(min_value=1, max_value=50))
def test_backoff_doubles_up_to_its_cap(failures: int):
    backoff = Backoff(first_s=1.0, max_s=30.0)
    assert backoff.delay(1) == 1.0
    assert backoff.delay(failures) <= 30.0
    assert backoff.delay(failures + 1) == min(30.0, 2 * backoff.delay(failures))


def test_a_child_that_exits_is_restarted_after_its_backoff():
    argv = [sys.executable, "-c", "raise SystemExit(3)"]
    child = Child("replica 0", argv, 1, {}, Backoff(first_s=0.2, healthy_s=60))
    child.start()
    child.process.proc.wait(30)  # type: ignore[union-attr]
    child.tend(time.monotonic())
    assert child.restart_at is not None and child.failures == 1 and child.restarts == 0
    first_pid = child.pid
    child.tend(child.restart_at)
    assert child.restarts == 1 and child.pid != first_pid and child.restart_at is None
    child.process.proc.wait(30)  # type: ignore[union-attr]
    child.tend(time.monotonic())
    assert child.failures == 2 and child.restart_at is not None  # no healthy stretch: 0.4 s
    child.stop()


def test_replicas_and_dp_are_one_flag():
    parser = cli.build_parser()
    assert args_from_namespace(parser.parse_args(["serve", "--dp", "3"])).replicas == 3
    args = args_from_namespace(parser.parse_args(["serve", "--replicas", "2"]))
    assert args.replicas == 2 and args.router_policy == "cache_aware"


def test_serve_refuses_replicas_below_one(capsys):
    from localradix.fleet.supervisor import run_fleet

    assert run_fleet(ServerArgs(replicas=0)) == 1
    assert "--replicas must be at least 1" in capsys.readouterr().err


def test_replica_stats_merge_into_one_fleet_snapshot():
    from localradix.tui.gateway import merge_replicas
    from localradix.tui.stats import Stats

    def payload(running: int, hits: int, misses: int, kv_used: int) -> dict:
        engine = {"running": running, "queued": 0, "kv_total": 1000, "kv_used": kv_used}
        engine.update(cache_hit_tokens=hits, cache_miss_tokens=misses)
        engine["requests"] = [{"id": f"r{running}", "state": "decode"}]
        return {"model": {"name": "m"}, "engine_alive": True, "engine": engine}

    merged = merge_replicas(
        [
            ("http://a", payload(2, 30, 10, 100)),
            ("http://b", payload(1, 10, 50, 300)),
            ("http://c", None),
        ]
    )
    stats = Stats.parse(merged)
    assert (
        stats.get("running") == 3 and stats.get("kv_used") == 400 and stats.get("kv_total") == 2000
    )
    assert len(stats.requests) == 2 and stats.model["name"] == "m"
    assert stats.routing_hit_rate == 40 / 100
    assert [r["up"] for r in stats.replicas] == [True, True, False]
    assert stats.replicas[0]["hit_rate"] == 0.75 and stats.replicas[2]["hit_rate"] is None


def test_the_gateway_feed_waits_for_a_gateway_that_is_not_up_yet():
    import asyncio

    from localradix.child_server import free_port
    from localradix.tui.feed import Disconnected
    from localradix.tui.gateway import GatewayFeed

    async def first_two() -> list:
        events = []
        async for event in GatewayFeed(f"http://127.0.0.1:{free_port()}").events():
            events.append(event)
            if len(events) == 2:
                return events
        return events

    events = asyncio.run(first_two())
    assert all(isinstance(e, Disconnected) for e in events)
    assert [e.retry_in for e in events] == [0.5, 1.0]


def test_a_replica_that_cannot_start_stops_the_fleet_with_its_reason(tmp_path):
    import os
    from pathlib import Path

    from localradix.child_server import free_port

    missing = tmp_path / "missing.gguf"
    argv = [sys.executable, "-m", "localradix", "serve", str(missing), "--replicas", "2"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [*argv, "--port", str(free_port())], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 1
    assert "exited with code 1" in done.stderr and "not found" in done.stderr


def test_up_forwards_the_replica_flags_to_the_server_it_starts():
    """`localradix up --replicas 2` starts `serve --replicas 2` and attaches to its gateway."""
    from localradix.child_server import serve_argv

    ns = cli.build_parser().parse_args(["up", "--dp", "2", "--router-policy", "round_robin"])
    argv = serve_argv(ns, 8123)
    assert argv[argv.index("--replicas") + 1] == "2"
    assert argv[argv.index("--router-policy") + 1] == "round_robin"
    worker = serve_argv(cli.build_parser().parse_args(["up"]), 8123)
    assert "--replicas" not in worker and "--router-policy" not in worker
