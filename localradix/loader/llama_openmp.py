"""How llama.cpp's OpenMP threads wait between steps, set before llama.cpp is first imported.

libgomp's workers spin for a long while after each parallel region (one per `llama_decode`).
Between steps that spinning takes the cores the server's own work needs (the API process,
detokenizing, the scheduler), and on a small machine every step then waits for a descheduled
thread: the bundled model served one stream at ~52 tok/s over HTTP on 2 cores with libgomp's
default, ~110 tok/s with a short spin. A user's own GOMP_SPINCOUNT / OMP_WAIT_POLICY wins.
"""

from __future__ import annotations

import os

SPIN_COUNT = "10000"


def settle_openmp() -> None:
    """Call before importing llama_cpp: libgomp reads its environment when it loads."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
