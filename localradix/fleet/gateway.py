"""The smg gateway's command line: `python -m smg launch` over the replicas' URLs.

What smg needs from a worker, found by running it against `localradix serve` (smg 1.13):
`GET /health`, `GET /v1/models` (owned_by "localradix": registered as a generic OpenAI
worker), `GET /v1/loads` every few seconds, and nothing else. A replica that dies is marked
unhealthy by the health checks below and routed to again once its restart answers /health on
the same URL; it is never removed, so no worker API call is needed.
"""

from __future__ import annotations

import importlib.util
import sys

from localradix.config import ServerArgs

INSTALL_HINT = "pip install smg"  # the `gateway` extra
HEALTH_INTERVAL_S = 2  # how soon a dead replica is skipped and a restarted one routed to
LOG_LEVELS = {"debug": "debug", "info": "info", "warning": "warn", "error": "error"}


class GatewayMissing(RuntimeError):
    """smg is not installed."""


def require_smg() -> None:
    if importlib.util.find_spec("smg") is None:
        raise GatewayMissing(
            f"--replicas needs the smg gateway, which is not installed: {INSTALL_HINT} "
            "(or install localradix with its gateway extra)"
        )


def gateway_argv(args: ServerArgs, worker_urls: list[str], metrics_port: int) -> list[str]:
    argv = [sys.executable, "-m", "localradix.fleet.smg_launch", "launch"]
    argv += ["--worker-urls", *worker_urls]
    argv += ["--policy", args.router_policy, "--host", args.host, "--port", str(args.port)]
    # smg's Prometheus listener defaults to 0.0.0.0:29000: keep it private and off fixed ports.
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
    argv += ["--health-check-interval-secs", str(HEALTH_INTERVAL_S)]
    argv += ["--health-failure-threshold", "1", "--health-success-threshold", "1"]
    argv += ["--shutdown-grace-period-secs", str(max(1, round(args.drain_timeout)))]
    argv += ["--max-payload-size", str(args.max_body_bytes)]
    argv += ["--log-level", LOG_LEVELS.get(args.log_level, "info")]
    if args.cors_origins:
        argv += ["--cors-allowed-origins", *args.cors_origins]
    return argv
