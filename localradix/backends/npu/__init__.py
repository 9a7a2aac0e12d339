"""Ascend NPU backend (torch_npu). For now it runs the torch reference runner on "npu"
(torch-native attention); the vendor attention ops are a later issue."""

from localradix.platform import BackendSpec

SPEC = BackendSpec(
    name="npu",
    priority=80,
    description="torch_npu on Huawei Ascend NPUs",
    probe_fn="localradix.backends.npu.probe:probe",
    create_runner_fn="localradix.backends.torch_device:create_torch_runner",
    requires=("torch", "torch_npu"),
    install_hint="pip install 'localradix[npu]', with Ascend CANN",
    dtypes=("bfloat16", "float16", "float32"),
    default_dtype="bfloat16",
    device_types=("npu",),
)
