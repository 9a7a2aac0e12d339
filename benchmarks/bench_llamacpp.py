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
from pathlib import Path

import psutil

from localradix.child_server import ServerProcess, free_port, localradix_argv, localradix_env
from localradix.loader import resolve_model

TARGETS = {  # workload -> highest wall-time ratio localradix / llama-server
    "agent": 0.25,
    "chat": 0.8,
    "random": 1.0,
}
RSS_TARGET = 1.2


class PeakRSS:
    """The peak resident memory of a process and its children, sampled in the background."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            try:
                root = psutil.Process(self.pid)
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                continue
            self.peak = max(self.peak, rss)


def main() -> int:
    ns = _parser().parse_args()
    model = str(resolve_model(ns.model).path)
    llama_port, radix_port = free_port(), free_port()
    llama_env = dict(os.environ)
    llama_env["LD_LIBRARY_PATH"] = str(Path(ns.llama_server).resolve().parent)
    servers = {
        "llama-server": ServerProcess(
            [ns.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(llama_port),
             "-np", str(ns.parallel), "-t", str(ns.threads), "-tb", str(ns.threads),
             "-c", str(ns.cells), "-fa", "on", "--no-webui"],
            llama_port, ready_timeout=600, env=llama_env,
        ),
        "localradix": ServerProcess(
            localradix_argv(
                ("--backend", "llamacpp", "--threads", str(ns.threads), "--max-total-tokens",
                 str(ns.cells), "--log-level", "warning", *shlex.split(ns.server_args)),
                radix_port, model,
            ),
            radix_port, ready_timeout=600, env=localradix_env(),
        ),
    }  # fmt: skip
    meters: dict[str, PeakRSS] = {}
    try:
        for label, server in servers.items():
            server.start()
            assert server.proc is not None
            meters[label] = PeakRSS(server.proc.pid)  # from the start: loading counts too
        for server in servers.values():
            server.wait_ready()
        report = _bench(ns, {label: s.base for label, s in servers.items()})
    finally:
        for server in servers.values():
            server.stop(keep_log=True)
        for meter in meters.values():
            meter.stop()
    print(_summary(report, {label: m.peak for label, m in meters.items()}))
    return 0


def _bench(ns: argparse.Namespace, urls: dict[str, str]) -> dict:
    output = ns.output or Path(tempfile.mkstemp(prefix="bench-llamacpp-", suffix=".json")[1])
    argv = [sys.executable, "-m", "localradix", "bench", "--no-progress",
            "--compare", *(f"{label}={url}" for label, url in urls.items()),
            "--baseline", "llama-server", "--workload", *ns.workloads,
            "--scale", str(ns.scale), "--concurrency", str(ns.parallel),
            "--extra-body", '{"ignore_eos": true}',  # both servers write max_tokens tokens
            "--output", str(output)]  # fmt: skip
    subprocess.run(argv, check=True, env=localradix_env())
    return json.loads(output.read_text())


def _summary(report: dict, peak_rss: dict[str, int]) -> str:
    runs = {(r["workload"]["name"], r["label"]): r for r in report["runs"]}
    lines = ["", "localradix (llamacpp backend) vs llama-server: the issue's targets"]
    labels = list(peak_rss)  # llama-server (the baseline), then localradix
    single = [runs.get(("single", label)) for label in labels]
    if all(single):
        rates = [1 / r["tpot_s"]["p50"] for r in single]  # type: ignore[index]
        lines.append(
            _line("single-stream decode tok/s (1 / TPOT p50)", *rates, rates[1] >= rates[0])
        )
    for name, limit in TARGETS.items():
        pair = [runs.get((name, label)) for label in labels]
        if all(pair):
            base, ours = (r["wall_time_s"] for r in pair)  # type: ignore[index]
            lines.append(_line(f"{name}: wall time (s), target <= {limit}x", base, ours,
                               ours <= limit * base))  # fmt: skip
    base, ours = (peak_rss[label] / 2**20 for label in labels)
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
    p.add_argument("--output", type=Path, default=None, help="keep the bench's JSON report here")
    return p


if __name__ == "__main__":
    raise SystemExit(main())
