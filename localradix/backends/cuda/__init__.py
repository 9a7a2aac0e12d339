"""CUDA backend (NVIDIA). For now it runs the torch reference runner on "cuda" (torch-native
attention, no graphs); the FlashInfer + CUDA-graph runner is a later issue."""

from localradix.platform import BackendSpec

SPEC = BackendSpec(
    name="cuda",
    priority=100,
    description="torch on NVIDIA GPUs",
    probe_fn="localradix.backends.cuda.probe:probe",
    create_runner_fn="localradix.backends.torch_device:create_torch_runner",
    requires=("torch",),
    install_hint="pip install 'localradix[cuda]'",
    dtypes=("bfloat16", "float16", "float32"),
    default_dtype="bfloat16",
    device_types=("cuda",),
)
