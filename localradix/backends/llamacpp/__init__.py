"""llama.cpp backend: GGUF models in their own quantization, on llama.cpp's kernels.

llama-cpp-python (`pip install llama-cpp-python`, which compiles llama.cpp) computes the
logits; the shared scheduler, radix cache and sampler do the rest. `--backend auto` picks it for
GGUF models on machines without a CUDA/ROCm/NPU torch backend (CPUs, and Macs with its Metal
build); it cannot load Hugging Face folders.
"""

from localradix.platform import BackendSpec

SPEC = BackendSpec(
    name="llamacpp",
    priority=75,  # above MLX and the torch CPU runner, below the GPU/NPU torch backends
    description="llama.cpp (GGUF in its own quantization; CPU, or Metal/CUDA builds)",
    probe_fn="localradix.backends.llamacpp.probe:probe",
    create_runner_fn="localradix.backends.llamacpp.runner:create_llamacpp_runner",
    requires=("llama_cpp",),
    install_hint="pip install llama-cpp-python (compiles llama.cpp: ~10 minutes)",
    dtypes=("float16", "bfloat16", "float32"),  # the KV cache's type; weights stay as stored
    default_dtype="float16",
    device_types=("cpu", "gpu", "metal"),
    attention_backend="llama.cpp",
    page_sizes=(1,),
    formats=("gguf",),
    mixes_decode_into_prefill=True,
)
