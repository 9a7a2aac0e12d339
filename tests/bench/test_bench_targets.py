"""Target specs, URL normalization, the argument parser and its wiring."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from localradix.bench import add_bench_parser, run_bench
from localradix.bench.options import build_parser
from localradix.bench.targets import TargetError, normalize_base_url, parse_target, unique_labels
from localradix.child_server import localradix_argv, port_in_args


@pytest.mark.parametrize(
    "url, base",
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1"),
        ("http://h:1/v1/", "http://h:1/v1"),
        ("http://h:1/v1/chat/completions", "http://h:1/v1"),
        ("https://h/api/openai/v1", "https://h/api/openai/v1"),
    ],
)
def test_normalize_base_url(url, base):
    assert normalize_base_url(url) == base


def test_parse_targets():
    t = parse_target("http://localhost:11434#llama3.2:1b")
    assert (t.kind, t.url, t.model, t.label) == (
        "url", "http://localhost:11434/v1", "llama3.2:1b", "localhost:11434"
    )  # fmt: skip
    t = parse_target("ollama=http://localhost:11434/v1?x=1")
    assert t.label == "ollama" and t.model is None
    t = parse_target("launch:")
    assert (t.kind, t.server_args, t.label) == ("launch", (), "localradix")
    t = parse_target("nocache=launch:--disable-radix-cache --page-size 4")
    assert t.server_args == ("--disable-radix-cache", "--page-size", "4")
    assert t.label == "nocache"
    assert parse_target("launch:--disable-radix-cache").label == (
        "localradix --disable-radix-cache"
    )
    t = parse_target("cmd:/opt/bin/llama-server -m m.gguf --port {port}#qwen")
    assert (t.kind, t.label, t.model) == ("cmd", "llama-server", "qwen")
    for bad in ("localhost:8000", "cmd:llama-server -m x", "ftp://x", "x=y"):
        with pytest.raises(TargetError):
            parse_target(bad)


def test_unique_labels():
    ts = unique_labels(
        [parse_target("launch:"), parse_target("launch:"), parse_target("a=launch:")]
    )
    assert [t.label for t in ts] == ["localradix", "localradix #2", "a"]


def test_launch_argv_and_port():
    argv = localradix_argv(("--page-size", "4"), 1234, "m.gguf")
    assert argv[1:] == [
        "-m", "localradix", "serve", "m.gguf", "--host", "127.0.0.1", "--port", "1234",
        "--kv-disk-cache", "off", "--page-size", "4",
    ]  # fmt: skip
    kept = localradix_argv(("--kv-disk-cache", "/tmp/kv"), 1234, None)
    assert kept.count("--kv-disk-cache") == 1 and "off" not in kept
    assert port_in_args(["--port", "9"]) == 9 and port_in_args(["--port=7"]) == 7
    assert port_in_args(["--page-size", "4"]) is None


def test_subcommand_wiring():
    parser = argparse.ArgumentParser(prog="localradix")
    add_bench_parser(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["bench", "--url", "http://x:1", "--workload", "chat", "rag"])
    assert ns.func is run_bench and ns.workload == ["chat", "rag"] and ns.concurrency == 8


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--url", "http://x:1", "--workload", "nope"],
        ["--url", "http://x:1", "--concurrency", "0"],
        ["--url", "http://x:1", "--extra-body", "[1]"],
        ["--compare", "not-a-target"],
    ],
)
def test_usage_errors_exit_2(args, capsys):
    assert run_bench(build_parser().parse_args(args)) == 2
    assert "localradix bench: error:" in capsys.readouterr().err


def test_import_is_light():
    code = (
        "import sys, localradix.bench, localradix.bench.options;"
        "heavy = {'httpx', 'matplotlib', 'tqdm', 'torch', 'numpy'} & set(sys.modules);"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_documents_the_target_syntax():
    text = build_parser().format_help()
    for word in ("launch:", "cmd:", "--compare", "agent", "rag", "--plot", "Exit status"):
        assert word in text
