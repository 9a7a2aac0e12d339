"""ROCm backend (AMD): a HIP build of torch, whose devices torch names "cuda". For now it runs
the torch reference runner (torch-native attention, no graphs); kernels are a later issue."""

from localradix.platform import BackendSpec

SPEC = BackendSpec(
    name="rocm",
    priority=90,
    description="torch (HIP build) on AMD GPUs",
    probe_fn="localradix.backends.rocm.probe:probe",
    create_runner_fn="localradix.backends.torch_device:create_torch_runner",
    requires=("torch",),
    install_hint="pip install 'localradix[rocm]' --index-url https://download.pytorch.org/whl/rocm6.2",
    dtypes=("bfloat16", "float16", "float32"),
    default_dtype="bfloat16",
    device_types=("cuda", "hip"),
)
