"""The CPU is always there; the probe only describes it (and imports no torch)."""

from __future__ import annotations

from localradix.backends.torch_device import cpu_description
from localradix.platform import Availability


def probe(explicit: bool) -> Availability:
    return Availability(True, "always available", "cpu", cpu_description())
