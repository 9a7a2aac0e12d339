"""CUDA backend (NVIDIA): the device runner with FlashInfer paged attention (bf16 by default),
CUDA-graph capture of decode steps and a KV pool sized from free GPU memory. Without the
flashinfer package, or in float32, it runs the Triton kernels (`triton_attention.py`; Triton
ships with torch's GPU builds), else the torch-native attention (and no graphs)."""

from localradix.model_api.attention import ATTENTION_BACKENDS
from localradix.platform import BackendSpec

SPEC = BackendSpec(
    name="cuda",
    priority=100,
    description="torch on NVIDIA GPUs",
    probe_fn="localradix.backends.cuda.probe:probe",
    create_runner_fn="localradix.backends.cuda.runner:create_cuda_runner",
    requires=("torch",),
    install_hint="a CUDA build of torch (on Linux, PyPI's own); pip install flashinfer-python",
    dtypes=("bfloat16", "float16", "float32"),
    default_dtype="bfloat16",
    device_types=("cuda",),
    # Preferred kernels: the runner falls back to torch-native attention where FlashInfer
    # cannot run (package missing, float32, unsupported GPU); see `runner.py`.
    attention_backend="flashinfer",
    supports_graphs=True,
)

# The kernels this backend brings, for the torch runner's attention registry (rocm shares them).
ATTENTION_BACKENDS.register("flashinfer", "localradix.backends.cuda.attention:FlashInferAttention")
ATTENTION_BACKENDS.register("triton", "localradix.backends.cuda.triton_attention:TritonAttention")
