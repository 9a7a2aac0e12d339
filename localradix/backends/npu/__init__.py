"""Ascend NPU backend (torch_npu): the device runner on "npu" with torch_npu's fused attention
for decode steps and torch-native paged attention for the rest (and in float32)."""

from localradix.model_api.attention import ATTENTION_BACKENDS
from localradix.platform import BackendSpec

SPEC = BackendSpec(
    name="npu",
    priority=80,
    description="torch_npu on Huawei Ascend NPUs",
    probe_fn="localradix.backends.npu.probe:probe",
    create_runner_fn="localradix.backends.npu.runner:create_npu_runner",
    requires=("torch", "torch_npu"),
    install_hint="pip install torch-npu, with Ascend CANN",
    dtypes=("bfloat16", "float16", "float32"),
    default_dtype="bfloat16",
    device_types=("npu",),
    attention_backend="npu_fused",
)

# The kernels this backend brings, for the torch runner's attention registry.
ATTENTION_BACKENDS.register("npu_fused", "localradix.backends.npu.attention:NpuFusedAttention")
