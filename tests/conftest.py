"""Session-wide settings, made before any test module imports triton.

Triton's CPU interpreter (for the Triton attention kernels: tests/backends/
test_triton_attention.py, tests/engine/test_triton_parity.py) must be on when triton is first
imported, which torch._dynamo does as soon as transformers builds a model. On a machine with
a GPU the kernels are compiled for it instead (tests/backends/test_gpu_devices.py).

The prefix cache's disk tier is off for every engine and server a test starts (it would write
to ~/.cache and carry KV from one test to the next); the tier tests turn it on in a folder of
their own with --kv-disk-cache.
"""

import os

import torch

os.environ["LOCALRADIX_KV_DISK_CACHE"] = "off"

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
