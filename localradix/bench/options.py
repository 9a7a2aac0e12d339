"""The `localradix bench` command line (argparse only; nothing heavy is imported here)."""

from __future__ import annotations

import argparse

from localradix.bench.workloads import WORKLOAD_HELP, WORKLOADS

DESCRIPTION = """\
Benchmark any OpenAI-compatible server (localradix, llama.cpp's llama-server, Ollama, mlx-lm,
vLLM, SGLang, ...) with the same seeded workload, using streamed chat completions.

Workloads:
""" + "\n".join(f"  {name:<8}{text}" for name, text in WORKLOAD_HELP.items())

EPILOG = """\
Targets (each --url, --launch and --compare SPEC adds one; with two or more, ratios to the
first, or to --baseline, are printed):
  [LABEL=]URL[#MODEL]          an endpoint, e.g. http://127.0.0.1:8080 or
                               ollama=http://localhost:11434/v1#llama3.2:1b
  [LABEL=]launch:[ARGS]        start `python -m localradix serve --port P ARGS` for the run
                               and stop it afterwards, e.g. "launch:" or
                               "nocache=launch:--disable-radix-cache"
  [LABEL=]cmd:COMMAND[#MODEL]  start any server; {port} in COMMAND becomes a free port, e.g.
                               "cmd:llama-server -m m.gguf --port {port}"

Sizes are in words of seeded filler text (about one token each); the server's usage reports
the exact token counts. Counts (requests, conversations, documents) scale with --scale.

Examples:
  localradix bench --launch --workload agent
  localradix bench --url http://127.0.0.1:8080 --model qwen --workload chat rag --plot b.png
  localradix bench --workload agent --compare "launch:" "launch:--disable-radix-cache"
  localradix bench --workload all --compare launch: "llama=cmd:llama-server -m m.gguf --port {port}"

Exit status: 0 when every request succeeded, 1 when some failed, 2 on a usage error.
"""


SIZE_FLAGS = (
    ("--num-requests", "requests (agent, random, single)"),
    ("--num-conversations", "conversations (chat)"),
    ("--turns", "turns per conversation (chat)"),
    ("--num-docs", "documents (rag)"),
    ("--questions-per-doc", "questions per document (rag)"),
    ("--system-tokens", "system prompt size (agent, chat)"),
    ("--doc-tokens", "document size (rag)"),
    ("--prompt-tokens", "unique part of each request: task, user turn, question or prompt"),
    ("--max-tokens", "max_tokens of every request"),
)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("targets")
    t.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="URL",
        help="endpoint base URL (repeatable); /v1 is added when the path is empty",
    )
    t.add_argument(
        "--launch",
        action="store_true",
        help="start a local localradix server for the run, stop it afterwards",
    )
    t.add_argument(
        "--launch-model",
        metavar="PATH",
        help="model for launched localradix servers (default: the bundled one)",
    )
    t.add_argument(
        "--server-args",
        default="",
        metavar='"ARGS"',
        help="extra `localradix serve` flags for every launched localradix (--launch and "
        'launch: targets), as one string; write --server-args="--flag" for a single flag',
    )
    t.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="SPEC",
        help="targets to run on the identical workload (syntax below)",
    )
    t.add_argument("--baseline", metavar="LABEL", help="label of the target ratios refer to")
    t.add_argument(
        "--model",
        metavar="NAME",
        help="model name sent in requests (default: the first of GET /v1/models)",
    )
    t.add_argument("--api-key", metavar="KEY", help="sent as 'Authorization: Bearer KEY'")
    t.add_argument(
        "--launch-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds to wait for a launched server's /health (default 600)",
    )

    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload",
        nargs="+",
        default=["agent"],
        metavar="W",
        help=f"one or more of {', '.join(WORKLOADS)}, or all (default agent)",
    )
    w.add_argument(
        "--scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply request / conversation / document counts (default 1)",
    )
    w.add_argument("--seed", type=int, default=0, metavar="N", help="prompt seed (default 0)")
    for flag, text in SIZE_FLAGS:
        w.add_argument(flag, type=int, metavar="N", help=text)
    w.add_argument(
        "--no-nonce",
        action="store_true",
        help="byte-identical prompts across runs (by default a random tag opens "
        "every prompt so a warm cache from an earlier run cannot help)",
    )

    r = p.add_argument_group("run")
    r.add_argument(
        "--concurrency",
        type=int,
        default=8,
        metavar="N",
        help="requests in flight at most (default 8; 'single' always uses 1)",
    )
    r.add_argument(
        "--warmup",
        type=int,
        default=1,
        metavar="N",
        help="untimed tiny requests before each run (default 1)",
    )
    r.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds before one request counts as failed (default 600)",
    )
    r.add_argument(
        "--extra-body",
        metavar="JSON",
        help="JSON object merged into every request, e.g. '{\"ignore_eos\": true}' "
        "(not portable across servers)",
    )

    o = p.add_argument_group("output")
    o.add_argument(
        "--output",
        metavar="FILE",
        help="JSON report path (default bench-results/bench-<workloads>-<time>.json)",
    )
    o.add_argument("--no-save", action="store_true", help="do not write the JSON report")
    o.add_argument("--plot", metavar="FILE.png", help="write throughput and TTFT charts (PNG)")
    o.add_argument(
        "--per-request",
        action="store_true",
        help="include every request's timings in the JSON report",
    )
    o.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="localradix bench")
    p.description = DESCRIPTION
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_bench_arguments(p)
    return p
