"""Session-wide settings, made before any test module imports torch.

Triton's CPU interpreter (for the Triton attention kernels: tests/backends/
test_triton_attention.py, tests/engine/test_triton_parity.py) must be on when triton is first
imported, which torch._dynamo does as soon as transformers builds a model. No test here runs
Triton on a GPU, so turning it on for the session changes nothing else.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
