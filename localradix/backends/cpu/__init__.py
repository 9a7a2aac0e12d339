"""CPU backend: the torch reference runner on the CPU. Always available; the last resort."""

from localradix.platform import BackendSpec

SPEC = BackendSpec(
    name="cpu",
    priority=0,
    description="torch on the CPU (reference runner)",
    probe_fn="localradix.backends.cpu.probe:probe",
    create_runner_fn="localradix.backends.torch_device:create_torch_runner",
    requires=("torch",),
    install_hint="pip install torch --index-url https://download.pytorch.org/whl/cpu",
    dtypes=("float32", "bfloat16", "float16"),
    default_dtype="float32",  # small models on CPU are per-op bound; fp32 is as fast and exact
    device_types=("cpu",),
)
