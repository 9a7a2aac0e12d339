"""Short requests while a long prompt prefills: their time to first token, and the long one's.

An IDE's autocomplete and a chat share a server with an agent that sends an 8k-token prompt.
This starts `localradix serve` on the bundled model, sends the long prompt, and while it is
prefilling sends a 4-token chat every second; it prints the short requests' time to first
token (p50 / p99) and the long prompt's, next to the long prompt's time alone.

    python benchmarks/bench_mixed_traffic.py --backend llamacpp [--long-tokens 8000] [-- ARGS]

Arguments after `--` go to `localradix serve` (e.g. `--step-budget-ms 0` for fixed chunks).
Target (issue "hard edges"): short p99 <= 2 s while the long prompt's TTFT grows <= 20%.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

WORDS = "model cache token prefix radix server request batch decode prefill kernel".split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(backend: str, extra: list[str]) -> Iterator[tuple[str, str]]:
    port = free_port()
    cmd = [sys.executable, "-m", "localradix", "serve", "--backend", backend]
    cmd += ["--port", str(port), "--disable-radix-cache", *extra]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"server exited:\n{log.read().decode()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        name = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        yield url, name
    finally:
        proc.terminate()
        proc.wait(60)


def long_prompt(url: str, tokens: int) -> str:
    """Text of about `tokens` tokens, measured with the server's own tokenizer."""
    text = " ".join(WORDS[i % len(WORDS)] + str(i % 97) for i in range(tokens))
    while True:
        r = httpx.post(url + "/tokenize", json={"content": text}).json()
        n = len(r["tokens"])
        if n <= tokens:
            return text
        text = text[: int(len(text) * tokens / n * 0.99)]


def first_token_s(url: str, body: dict, route: str) -> float:
    start = time.monotonic()
    with httpx.stream("POST", url + route, json={**body, "stream": True}, timeout=900) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                choice = chunk["choices"][0] if chunk.get("choices") else {}
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
                    return time.monotonic() - start
    return time.monotonic() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(url: str, name: str, text: str) -> tuple[float, float, list[float]]:
    long_body = {"model": name, "prompt": text, "max_tokens": 1, "temperature": 0}
    alone = first_token_s(url, long_body, "/v1/completions")
    done = threading.Event()
    result: list[float] = []

    def run_long() -> None:
        result.append(first_token_s(url, long_body, "/v1/completions"))
        done.set()

    shorts: list[float] = []
    threads = [threading.Thread(target=run_long)]
    threads[0].start()
    time.sleep(1.0)
    i = 0
    while not done.is_set():
        chat = {
            "model": name,
            "messages": [{"role": "user", "content": f"Say hi {i}"}],
            "max_tokens": 4,
            "temperature": 0,
        }
        t = threading.Thread(
            target=lambda c=chat: shorts.append(first_token_s(url, c, "/v1/chat/completions"))
        )
        t.start()
        threads.append(t)
        i += 1
        done.wait(1.0)
    for t in threads:
        t.join()
    return alone, result[0], shorts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--long-tokens", type=int, default=8000)
    parser.add_argument("serve_args", nargs="*", help="after --: arguments for localradix serve")
    args = parser.parse_args()
    with server(args.backend, args.serve_args) as (url, name):
        text = long_prompt(url, args.long_tokens)
        alone, mixed, shorts = measure(url, name, text)
    print(f"backend {args.backend}, serve args {args.serve_args or '(defaults)'}")
    print(
        f"long prompt ({args.long_tokens} tokens) TTFT: alone {alone:.1f} s, with the short "
        f"requests {mixed:.1f} s ({(mixed / alone - 1) * 100:+.1f}%)"
    )
    print(
        f"short chats ({len(shorts)}): TTFT p50 {percentile(shorts, 0.5):.2f} s, "
        f"p99 {percentile(shorts, 0.99):.2f} s, max {max(shorts):.2f} s"
    )


if __name__ == "__main__":
    main()
