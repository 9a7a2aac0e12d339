"""Apple MLX backend: MLX model definitions, paged KV in MLX arrays, sampling in MLX; no torch.

Chosen automatically on Apple silicon (Metal GPU). Elsewhere MLX's CPU build (`mlx[cpu]` on
Linux) runs only when asked for with `--backend mlx`, which is how CI tests this backend.
"""

from localradix.platform import BackendSpec

SPEC = BackendSpec(
    name="mlx",
    priority=70,
    description="Apple MLX (Metal GPU on Apple silicon; CPU elsewhere on request)",
    probe_fn="localradix.backends.mlx.probe:probe",
    create_runner_fn="localradix.backends.mlx.runner:create_mlx_runner",
    requires=("mlx",),
    install_hint="pip install mlx",
    dtypes=("float32", "bfloat16", "float16"),
    default_dtype="float32",  # off Metal; the probe says bfloat16 on Apple GPUs
    device_types=("gpu", "mps"),
    attention_backend="mlx_paged",
    quantizes_at_load=True,
)
