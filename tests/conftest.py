"""Session-wide settings, made before any test module imports triton.

Triton's CPU interpreter (for the Triton attention kernels: tests/backends/
test_triton_attention.py, tests/engine/test_triton_parity.py) must be on when triton is first
imported, which torch._dynamo does as soon as transformers builds a model. On a machine with
a GPU the kernels are compiled for it instead (tests/backends/test_gpu_devices.py).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
