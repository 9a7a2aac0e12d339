"""localradix on llama.cpp vs llama.cpp's own `llama-server`: same GGUF, same threads, same cells.

Starts both servers on loopback, runs `localradix bench` against both on the same seeded
workloads (llama-server is the baseline), samples each server's resident memory (its whole
process tree) the whole time, and prints the bench tables, then one summary against the targets
of issue 13: single-stream decode >= llama-server's tok/s; wall time <= 0.25x on `agent`
(shared long system prompt), <= 0.8x on `chat` (multi-turn), <= 1.0x on `random` (no sharing);
peak RSS <= 1.2x. Build llama-server from the llama.cpp that llama-cpp-python vendors (its
sdist's `vendor/llama.cpp`: `cmake -B build && cmake --build build --target llama-server`).

    python benchmarks/bench_llamacpp.py --llama-server PATH/llama-server [--model X.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from localradix.bench.launch import free_port, localradix_env
from localradix.loader import resolve_model

TARGETS = {  # workload -> highest wall-time ratio localradix / llama-server
    "agent": 0.25,
    "chat": 0.8,
    "random": 1.0,
}
RSS_TARGET = 1.2


class Server:
    """A server process on loopback, with its peak resident memory sampled in the background."""

    def __init__(self, label: str, argv: list[str], port: int, env: dict[str, str]) -> None:
        self.label, self.port = label, port
        self.log = Path(tempfile.mkstemp(prefix=f"bench-{label}-", suffix=".log")[1])
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.peak_rss = 0
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.label} exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"{self.label} did not become healthy in {timeout:.0f} s")

    def stop(self) -> None:
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            try:
                root = psutil.Process(self.proc.pid)
                procs = [root, *root.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in procs)
            except psutil.Error:
                continue
            self.peak_rss = max(self.peak_rss, rss)


def main() -> int:
    ns = _parser().parse_args()
    model = str(resolve_model(ns.model).path)
    llama_port, radix_port = free_port(), free_port()
    llama_env = dict(os.environ)
    llama_env["LD_LIBRARY_PATH"] = str(Path(ns.llama_server).resolve().parent)
    servers = [
        Server(
            "llama-server",
            [ns.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(llama_port),
             "-np", str(ns.parallel), "-t", str(ns.threads), "-tb", str(ns.threads),
             "-c", str(ns.cells), "-fa", "on", "--no-webui"],
            llama_port,
            llama_env,
        ),
        Server(
            "localradix",
            [sys.executable, "-m", "localradix", "serve", model, "--backend", "llamacpp",
             "--host", "127.0.0.1", "--port", str(radix_port), "--threads", str(ns.threads),
             "--max-total-tokens", str(ns.cells), "--log-level", "warning", *shlex.split(ns.server_args)],
            radix_port,
            localradix_env(),
        ),
    ]  # fmt: skip
    try:
        for server in servers:
            server.wait_healthy()
        report = _bench(ns, servers)
    finally:
        for server in servers:
            server.stop()
    print(_summary(report, servers))
    return 0


def _bench(ns: argparse.Namespace, servers: list[Server]) -> dict:
    output = Path(tempfile.mkstemp(prefix="bench-llamacpp-", suffix=".json")[1])
    argv = [sys.executable, "-m", "localradix", "bench", "--no-progress",
            "--compare", *(f"{s.label}={s.url}" for s in servers),
            "--baseline", "llama-server", "--workload", *ns.workloads,
            "--scale", str(ns.scale), "--concurrency", str(ns.parallel),
            "--extra-body", '{"ignore_eos": true}',  # both servers write max_tokens tokens
            "--output", str(output)]  # fmt: skip
    subprocess.run(argv, check=True, env=localradix_env())
    return json.loads(output.read_text())


def _summary(report: dict, servers: list[Server]) -> str:
    runs = {(r["workload"]["name"], r["label"]): r for r in report["runs"]}
    lines = ["", "localradix (llamacpp backend) vs llama-server: the issue's targets"]
    single = [runs.get(("single", s.label)) for s in servers]
    if all(single):
        rates = [1 / r["tpot_s"]["p50"] for r in single]  # type: ignore[index]
        lines.append(
            _line("single-stream decode tok/s (1 / TPOT p50)", *rates, rates[1] >= rates[0])
        )
    for name, limit in TARGETS.items():
        pair = [runs.get((name, s.label)) for s in servers]
        if all(pair):
            base, ours = (r["wall_time_s"] for r in pair)  # type: ignore[index]
            lines.append(_line(f"{name}: wall time (s), target <= {limit}x", base, ours,
                               ours <= limit * base))  # fmt: skip
    base, ours = (s.peak_rss / 2**20 for s in servers)
    lines.append(_line(f"peak RSS (MiB), target <= {RSS_TARGET}x", base, ours,
                       ours <= RSS_TARGET * base))  # fmt: skip
    return "\n".join(lines)


def _line(what: str, base: float, ours: float, met: bool) -> str:
    verdict = "met" if met else "MISSED"
    return f"  {what:<44} llama-server {base:9.2f}  localradix {ours:9.2f}  " \
           f"ratio {ours / base:5.2f}  {verdict}"  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--llama-server", required=True, help="path to the llama-server binary")
    p.add_argument("--model", default=None, help="GGUF file (default: the bundled SmolLM2)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for both (default 2)")
    p.add_argument("--parallel", type=int, default=8, help="llama-server slots = bench concurrency")
    p.add_argument("--cells", type=int, default=32768, help="KV cells for both (default 32768)")
    p.add_argument("--workloads", nargs="+", default=["single", "agent", "chat", "random"])
    p.add_argument("--scale", type=float, default=1.0, help="workload size multiplier")
    p.add_argument(
        "--server-args", default="", help='extra `localradix serve` flags, e.g. "--flag 1"'
    )
    return p


if __name__ == "__main__":
    raise SystemExit(main())
