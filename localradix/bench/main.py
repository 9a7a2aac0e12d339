"""`localradix bench` from parsed arguments to printed tables, JSON report and charts."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import secrets
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from localradix import __version__
from localradix.bench.report import comparisons, failed_run, summarize
from localradix.bench.runner import Endpoint, RunOptions, make_client, run_workload
from localradix.bench.table import format_comparisons, format_runs
from localradix.bench.targets import Target, TargetError, parse_target, unique_labels
from localradix.bench.workloads import WORKLOADS, Sizes, build_workload
from localradix.child_server import (
    LaunchError,
    ServerProcess,
    command_argv,
    free_port,
    localradix_argv,
    localradix_env,
    port_in_args,
)

SCHEMA_VERSION = 1
RESULTS_DIR = Path("bench-results")


class UsageError(ValueError):
    pass


@dataclass(frozen=True)
class Plan:
    targets: list[Target]
    workloads: list[str]
    sizes: Sizes
    seed: int
    nonce: bool
    run: RunOptions
    model: str | None
    api_key: str | None
    launch_model: str | None
    common_server_args: tuple[str, ...]
    launch_timeout: float
    per_request: bool


def main(ns: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    try:
        plan = make_plan(ns)
    except (UsageError, TargetError) as e:
        print(f"localradix bench: error: {e}", file=sys.stderr)
        return 2
    runs = [r for target in plan.targets for r in run_target(target, plan)]
    comps = comparisons(runs, ns.baseline)
    print(format_runs(runs))
    if comps:
        print("\n" + format_comparisons(comps))
    doc = {
        "localradix_bench": SCHEMA_VERSION,
        "localradix_version": __version__,
        "created": datetime.now().astimezone().isoformat(timespec="seconds"),
        "options": _options(ns),
        "runs": runs,
        "comparisons": comps,
    }
    _save(doc, ns)
    return 0 if all(r["requests"]["errors"] == 0 for r in runs) else 1


# -- plan -------------------------------------------------------------------------------------


def make_plan(ns: argparse.Namespace) -> Plan:
    return Plan(
        targets=_targets(ns),
        workloads=_workload_names(ns.workload),
        sizes=_sizes(ns),
        seed=ns.seed,
        nonce=not ns.no_nonce,
        run=RunOptions(
            concurrency=_positive(ns.concurrency, "--concurrency"),
            request_timeout=ns.request_timeout,
            warmup=max(0, ns.warmup),
            extra_body=_extra_body(ns.extra_body),
            progress=not ns.no_progress,
        ),
        model=ns.model,
        api_key=ns.api_key,
        launch_model=ns.launch_model,
        common_server_args=tuple(shlex.split(ns.server_args or "")),
        launch_timeout=ns.launch_timeout,
        per_request=ns.per_request,
    )


def _targets(ns: argparse.Namespace) -> list[Target]:
    specs = [*ns.url, *(["launch:"] if ns.launch else []), *ns.compare]
    if not specs:
        raise UsageError("nothing to benchmark: give --url URL, --launch or --compare SPEC ...")
    return unique_labels([parse_target(s) for s in specs])


def _workload_names(values: list[str]) -> list[str]:
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    names = [w for n in names for w in (WORKLOADS if n == "all" else (n,))]
    bad = [n for n in names if n not in WORKLOADS]
    if bad or not names:
        raise UsageError(f"unknown workload {bad}; choose from {', '.join(WORKLOADS)} or all")
    return list(dict.fromkeys(names))


def _sizes(ns: argparse.Namespace) -> Sizes:
    if ns.scale <= 0:
        raise UsageError("--scale must be positive")
    keys = [k for k in Sizes.__dataclass_fields__ if k != "scale"]
    values = {k: getattr(ns, k) for k in keys}
    for k, v in values.items():
        if v is not None:
            _positive(v, "--" + k.replace("_", "-"))
    return Sizes(scale=ns.scale, **values)


def _positive(v: int, flag: str) -> int:
    if v < 1:
        raise UsageError(f"{flag} must be at least 1")
    return v


def _extra_body(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--extra-body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise UsageError("--extra-body must be a JSON object")
    return body


# -- running ----------------------------------------------------------------------------------


def run_target(target: Target, plan: Plan) -> list[dict[str, Any]]:
    """Every workload against one target; a server that will not start fails its runs."""
    info = target.describe()
    try:
        with open_target(target, plan, info) as base_url:
            model = target.model or plan.model or discover_model(base_url, plan.api_key)
            endpoint = Endpoint(base_url, model, plan.api_key)
            info.update(base_url=base_url, model=model)
            return [run_one(endpoint, info, name, plan) for name in plan.workloads]
    except LaunchError as e:
        print(f"localradix bench: {target.label}: {e}", file=sys.stderr)
        message = "launch failed: " + str(e).splitlines()[0]
        return [failed_run(_workload(name, plan), info, message) for name in plan.workloads]


@contextlib.contextmanager
def open_target(target: Target, plan: Plan, info: dict[str, Any]) -> Iterator[str]:
    """Yields the target's base URL, with its server running for kinds launch and cmd."""
    if target.kind == "url":
        assert target.url is not None
        yield target.url
        return
    if target.kind == "launch":
        args = (*plan.common_server_args, *target.server_args)
        port = port_in_args(args) or free_port()
        argv, env = localradix_argv(args, port, plan.launch_model), localradix_env()
    else:
        assert target.command is not None
        port = free_port()
        argv, env = command_argv(target.command, port), None
    info["argv"] = argv
    print(f"localradix bench: starting {shlex.join(argv)}", file=sys.stderr)
    with ServerProcess(argv, port, plan.launch_timeout, env):
        yield f"http://127.0.0.1:{port}/v1"


def run_one(endpoint: Endpoint, info: dict[str, Any], name: str, plan: Plan) -> dict[str, Any]:
    workload = _workload(name, plan)
    opts = replace(plan.run, label=f"{info['label']} / {name}")
    result = asyncio.run(run_workload(endpoint, workload, opts))
    report = summarize(result, workload, dict(info))
    if not plan.per_request:
        report.pop("per_request")
    req = report["requests"]
    print(
        f"localradix bench: {opts.label}: {req['ok']}/{req['total']} ok in "
        f"{report['wall_time_s']:.2f} s",
        file=sys.stderr,
    )
    return report


def _workload(name: str, plan: Plan):
    nonce = secrets.token_hex(4) if plan.nonce else ""
    return build_workload(name, plan.sizes, plan.seed, nonce)


def discover_model(base_url: str, api_key: str | None) -> str:
    """The first model id of GET /models; "default" when the server does not say."""

    async def fetch() -> str:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with make_client(base_url, 1, 10.0) as client:
            resp = await client.get(base_url + "/models", headers=headers)
            return resp.json()["data"][0]["id"]

    try:
        return asyncio.run(fetch())
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return "default"


# -- output -----------------------------------------------------------------------------------


def _options(ns: argparse.Namespace) -> dict[str, Any]:
    return {
        k: v
        for k, v in vars(ns).items()
        if isinstance(v, (str, int, float, bool, list, type(None))) and k != "api_key"
    }


def _save(doc: dict[str, Any], ns: argparse.Namespace) -> None:
    if not ns.no_save:
        path = Path(ns.output) if ns.output else _default_path(doc)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"\nreport: {path}")
    if ns.plot:
        from localradix.bench.plot import plot_runs

        try:
            print(f"plot: {plot_runs(doc['runs'], ns.plot)}")
        except (RuntimeError, OSError) as e:
            print(f"localradix bench: no plot: {e}", file=sys.stderr)


def _default_path(doc: dict[str, Any]) -> Path:
    names = dict.fromkeys(r["workload"]["name"] for r in doc["runs"])
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return RESULTS_DIR / f"bench-{'-'.join(names)}-{stamp}.json"
