"""What to benchmark: an endpoint URL, a localradix server to launch, or any server command.

Target spec syntax (for --compare; --url and --launch build the same objects):

    [LABEL=]URL[#MODEL]          an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080
    [LABEL=]launch:[SERVER ARGS] start `python -m localradix serve --port P SERVER ARGS`
    [LABEL=]cmd:COMMAND[#MODEL]  start COMMAND (its `{port}` is replaced by a free port) and
                                 benchmark http://127.0.0.1:{port}/v1
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

_LABEL = re.compile(r"^([A-Za-z0-9_.+\-]+)=(.+)$", re.S)


class TargetError(ValueError):
    pass


@dataclass(frozen=True)
class Target:
    label: str
    kind: str  # "url" | "launch" | "cmd"
    url: str | None = None  # base URL ending in /v1 (kind "url")
    model: str | None = None  # model name sent in requests; None = --model or discovered
    server_args: tuple[str, ...] = ()  # kind "launch"
    command: str | None = None  # kind "cmd"

    def describe(self) -> dict:
        return {
            "label": self.label,
            "kind": self.kind,
            "url": self.url,
            "model": self.model,
            "server_args": list(self.server_args),
            "command": self.command,
        }


def normalize_base_url(url: str) -> str:
    """http://h:p -> http://h:p/v1; strips a trailing /chat/completions; keeps other paths."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TargetError(f"not an http(s) URL: {url!r}")
    for suffix in ("/chat/completions", "/completions"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url if urlsplit(url).path not in ("", "/") else url + "/v1"


def parse_target(spec: str) -> Target:
    label, body = None, spec.strip()
    m = _LABEL.match(body)
    if m and not body.startswith(("http://", "https://", "launch:", "cmd:")):
        label, body = m.group(1), m.group(2)
    if body.startswith(("http://", "https://")):
        url, _, model = body.partition("#")
        base = normalize_base_url(url)
        return Target(label or urlsplit(base).netloc, "url", url=base, model=model or None)
    if body.startswith("launch:"):
        args = tuple(shlex.split(body[len("launch:") :]))
        return Target(label or _launch_label(args), "launch", server_args=args)
    if body.startswith("cmd:"):
        command, _, model = body[len("cmd:") :].partition("#")
        if "{port}" not in command:
            raise TargetError(f"cmd target needs a {{port}} placeholder: {spec!r}")
        name = shlex.split(command)[0].rsplit("/", 1)[-1] if command.strip() else "cmd"
        return Target(label or name, "cmd", command=command.strip(), model=model or None)
    raise TargetError(
        f"cannot read target {spec!r}: expected URL, launch:[ARGS] or cmd:COMMAND "
        "(optionally prefixed with LABEL=)"
    )


def _launch_label(args: tuple[str, ...]) -> str:
    return "localradix" + (" " + " ".join(args) if args else "")


def unique_labels(targets: list[Target]) -> list[Target]:
    """Suffix repeated labels with #2, #3, ... so every column of a table is distinct."""
    seen: dict[str, int] = {}
    out = []
    for t in targets:
        n = seen[t.label] = seen.get(t.label, 0) + 1
        out.append(t if n == 1 else Target(**{**t.__dict__, "label": f"{t.label} #{n}"}))
    return out
