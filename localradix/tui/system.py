"""Host figures for the status line: CPU, RAM, the server process, device memory.

The server's own `system` section (its host, its device) wins when the snapshot has one; else
psutil measures this machine, which is the server's only when the URL is local.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from localradix.tui.fmt import number

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0", ""}


@dataclass(frozen=True)
class SystemSample:
    cpu_percent: float | None = None
    ram_used: float | None = None
    ram_total: float | None = None
    proc_rss: float | None = None  # the server process, when we know its pid
    proc_cpu: float | None = None
    device_used: float | None = None
    device_total: float | None = None
    source: str = "local"  # "server" | "local" | "none"


def is_local(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOCAL_HOSTS


class SystemProbe:
    """`sample()` is cheap and non-blocking (psutil's CPU figures are since the last call)."""

    def __init__(self, local: bool = True, pid: int | None = None) -> None:
        self.local = local
        self.pid = pid
        self._procs: dict[int, Any] = {}  # kept so cpu_percent measures since the last call

    def sample(self) -> SystemSample:
        if not self.local:
            return SystemSample(source="none")
        try:
            import psutil
        except ImportError:
            return SystemSample(source="none")
        mem = psutil.virtual_memory()
        rss, pcpu = self._process(psutil)
        return SystemSample(
            cpu_percent=psutil.cpu_percent(interval=None),
            ram_used=float(mem.total - mem.available),
            ram_total=float(mem.total),
            proc_rss=rss,
            proc_cpu=pcpu,
        )

    def _process(self, psutil: Any) -> tuple[float | None, float | None]:
        if self.pid is None:
            return None, None
        try:
            root = self._procs.get(self.pid) or psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except (psutil.Error, OSError):
            return None, None
        self._procs = {p.pid: self._procs.get(p.pid, p) for p in procs}
        rss = cpu = 0.0
        for p in self._procs.values():
            try:
                rss += p.memory_info().rss
                cpu += p.cpu_percent(interval=None)
            except (psutil.Error, OSError):
                continue
        return rss, cpu


def merge(server: Mapping[str, Any], local: SystemSample) -> SystemSample:
    """The server's `system` section where it has figures, the local sample otherwise."""
    if not server:
        return local

    def pick(key: str, fallback: float | None) -> float | None:
        v = number(server.get(key))
        return v if v is not None else fallback

    return SystemSample(
        cpu_percent=pick("cpu_percent", local.cpu_percent),
        ram_used=pick("ram_used", local.ram_used),
        ram_total=pick("ram_total", local.ram_total),
        proc_rss=pick("process_rss", local.proc_rss),
        proc_cpu=pick("process_cpu_percent", local.proc_cpu),
        device_used=pick("device_mem_used", None),
        device_total=pick("device_mem_total", None),
        source="server",
    )
