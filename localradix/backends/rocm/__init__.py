"""ROCm backend (AMD): a HIP build of torch, whose devices torch names "cuda". The CUDA device
runner with FlashInfer+ROCm attention and decode graphs on MI300-class GPUs (gfx942/gfx950),
torch-native (SDPA) attention elsewhere; see `localradix.backends.rocm.runner`."""

from localradix.backends import cuda as _cuda  # noqa: F401  (registers the FlashInfer kernels)
from localradix.platform import BackendSpec

SPEC = BackendSpec(
    name="rocm",
    priority=90,
    description="torch (HIP build) on AMD GPUs",
    probe_fn="localradix.backends.rocm.probe:probe",
    create_runner_fn="localradix.backends.rocm.runner:create_rocm_runner",
    requires=("torch",),
    install_hint="pip install torch --index-url https://download.pytorch.org/whl/rocm6.2",
    dtypes=("bfloat16", "float16", "float32"),
    default_dtype="bfloat16",
    device_types=("cuda", "hip"),
    # Preferred kernels: the runner falls back to torch-native attention where FlashInfer
    # cannot run (package missing, float32, unsupported GPU); see `runner.py`.
    attention_backend="flashinfer",
    supports_graphs=True,
)
