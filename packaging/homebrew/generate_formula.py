"""Write the Homebrew formula for a localradix release from pip's own resolution report.

    pip install --dry-run --ignore-installed --only-binary=:all: --report report.json \
        'localradix[mlx] @ <release wheel URL>'          # on the target machine (a Mac)
    python packaging/homebrew/generate_formula.py report.json --url <release wheel URL> \
        --sha256 <its sha256> --homepage <project page> > localradix.rb

One `resource` per package pip resolved (its wheel's URL and sha256, as pip recorded them), so
the formula never drifts from pyproject.toml. pip evaluates environment markers for the machine
it runs on, even with `--platform`, so the report must be made on the platform the formula is
for: the dependency closure is recomputed here from the report's own environment, and a report
that lacks a package the target needs (or holds a wheel the target cannot run) is refused.
Standard library only (plus `packaging`, which every pip-bearing Python has).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

try:
    from packaging.requirements import Requirement
except ImportError:  # pragma: no cover - pip vendors it
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]

PROJECT = "localradix"
TEMPLATE = Path(__file__).with_name("localradix.rb.template")


def canonicalize_name(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


class ReportError(ValueError):
    """The report cannot make a correct formula; the message says why and what to do."""


@dataclass(frozen=True)
class Wheel:
    name: str  # canonical
    version: str
    url: str
    sha256: str


def load_report(path: Path) -> dict[str, Any]:
    report = json.loads(Path(path).read_text(encoding="utf-8"))
    if str(report.get("version")) != "1" or "install" not in report:
        raise ReportError(f"{path} is not a pip installation report (pip install --report)")
    return report


def resolved_wheels(report: dict[str, Any]) -> tuple[dict[str, Any], list[Wheel]]:
    """(the localradix entry, the wheels of the packages it needs in the report's environment)."""
    items = {canonicalize_name(i["metadata"]["name"]): i for i in report["install"]}
    if PROJECT not in items:
        raise ReportError(f"the report does not install {PROJECT}")
    env = report["environment"]
    needed = _closure(items, env)
    wheels = [_wheel(items[name], env) for name in sorted(needed - {PROJECT})]
    return items[PROJECT], wheels


def _closure(items: dict[str, Any], env: dict[str, str]) -> set[str]:
    """Names `localradix[extras]` requires under `env`, following each package's metadata."""
    root = items[PROJECT]
    todo = [(PROJECT, frozenset(root.get("requested_extras") or ()))]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        for line in items[name]["metadata"].get("requires_dist") or ():
            req = Requirement(line)
            if req.marker and not any(
                req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})
            ):
                continue
            dep = canonicalize_name(req.name)
            if dep not in items:
                raise ReportError(
                    f"{name} needs {req} on {_platform(env)}, but the report lacks it. pip "
                    "evaluates markers for the machine it runs on, even with --platform: "
                    "make the report on the platform the formula is for"
                )
            todo.append((dep, frozenset(req.extras)))
    return {name for name, _ in seen}


def _wheel(item: dict[str, Any], env: dict[str, str]) -> Wheel:
    meta, info = item["metadata"], item["download_info"]
    url = info["url"]
    filename = url.rsplit("/", 1)[-1]
    if not url.startswith("https://") or not filename.endswith(".whl"):
        raise ReportError(
            f"{meta['name']}: {url} is not a downloadable wheel; resolve with "
            "--only-binary=:all: against PyPI (no local mirrors or find-links)"
        )
    platforms = filename.removesuffix(".whl").split("-")[-1].split(".")
    if not any(_runs_on(tag, env) for tag in platforms):
        raise ReportError(f"{filename} does not run on {_platform(env)}")
    sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256")
    if not sha256:
        raise ReportError(f"{meta['name']}: the report records no sha256 for {url}")
    return Wheel(canonicalize_name(meta["name"]), meta["version"], url, sha256)


def _runs_on(tag: str, env: dict[str, str]) -> bool:
    machine = env["platform_machine"].lower()
    if tag == "any":
        return True
    if env["sys_platform"] == "darwin":
        arches = {machine, "universal2"} | ({"intel"} if machine == "x86_64" else set())
        return tag.startswith("macosx_") and tag.split("_", 3)[-1] in arches
    if env["sys_platform"] == "linux":
        return re.match(r"(many|musl)linux", tag) is not None and tag.endswith(machine)
    return False


def _platform(env: dict[str, str]) -> str:
    return f"{env['sys_platform']} {env['platform_machine']}, Python {env['python_version']}"


def _platform_lines(env: dict[str, str]) -> str:
    if env["sys_platform"] == "darwin":
        arch = ":arm64" if env["platform_machine"] == "arm64" else ":x86_64"
        return f"  depends_on arch: {arch}\n  depends_on :macos"
    return "  depends_on :linux"


def render(report: dict[str, Any], url: str, sha256: str, homepage: str) -> str:
    root, wheels = resolved_wheels(report)
    env = report["environment"]
    resources = "".join(
        f'  resource "{w.name}" do\n    url "{w.url}", using: :nounzip\n'
        f'    sha256 "{w.sha256}"\n  end\n\n'
        for w in wheels
    )
    meta = root["metadata"]
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        resolved_on=_platform(env),
        homepage=homepage,
        url=url,
        version=meta["version"],
        sha256=sha256,
        license=meta.get("license") or "Apache-2.0",
        platform=_platform_lines(env),
        python=env["python_version"],
        resources=resources.rstrip("\n") + "\n",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("report", type=Path, help="pip install --dry-run --report JSON")
    parser.add_argument("--url", required=True, help="the release's localradix wheel URL")
    parser.add_argument("--sha256", required=True, help="that wheel's sha256")
    parser.add_argument("--homepage", required=True, help="the project's home page")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(render(load_report(args.report), args.url, args.sha256, args.homepage))
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
