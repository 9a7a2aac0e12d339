"""Backend detection and the registry, on faked machines (fake torch / mlx / torch_npu modules)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import types
from types import SimpleNamespace

import pytest

from localradix import doctor
from localradix import platform as lp
from localradix.config import ServerArgs
from localradix.platform import Availability, BackendError, BackendSpec, Target


def _device_api(count: int, name: str = "Fake GPU") -> SimpleNamespace:
    props = SimpleNamespace(name=name, total_memory=80 * 2**30)
    return SimpleNamespace(
        is_available=lambda: count > 0,
        device_count=lambda: count,
        get_device_properties=lambda i: props,
        is_bf16_supported=lambda: True,
    )


def _fake_torch(cuda: str | None = None, hip: str | None = None, gpus: int = 0) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "2.9.0+fake"
    torch.version = SimpleNamespace(cuda=cuda, hip=hip)
    torch.cuda = _device_api(gpus)
    return torch


class Machine:
    """A faked machine: which modules are installed, what they report, which OS."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mp = monkeypatch
        self.installed = {"torch"}
        monkeypatch.setattr(lp, "_module_exists", lambda name: name in self.installed)
        monkeypatch.setattr(lp, "_entry_points", lambda: [])
        monkeypatch.setattr(sys, "platform", "linux")
        monkeypatch.setattr("platform.machine", lambda: "x86_64")
        self.torch(_fake_torch(cuda=None))

    def torch(self, module: types.ModuleType) -> None:
        self.mp.setitem(sys.modules, "torch", module)

    def apple(self, metal: bool = True) -> None:
        self.mp.setattr(sys, "platform", "darwin")
        self.mp.setattr("platform.machine", lambda: "arm64")
        self.mlx(metal)

    def mlx(self, metal: bool = False) -> None:
        core = types.ModuleType("mlx.core")
        core.__version__ = "0.99.0"
        core.metal = SimpleNamespace(
            is_available=lambda: metal,
            device_info=lambda: {"architecture": "applegpu_g15s", "memory_size": 64 * 2**30},
        )
        package = types.ModuleType("mlx")
        package.core = core
        self.mp.setitem(sys.modules, "mlx", package)
        self.mp.setitem(sys.modules, "mlx.core", core)
        self.installed.add("mlx")

    def npu(self, count: int = 2) -> None:
        torch = sys.modules["torch"]
        torch.npu = _device_api(count, "Ascend910B")
        torch_npu = types.ModuleType("torch_npu")
        torch_npu.__version__ = "2.5.1"
        self.mp.setitem(sys.modules, "torch_npu", torch_npu)
        self.installed.add("torch_npu")

    def llamacpp(self, gpu_offload: bool = False) -> None:
        low = types.ModuleType("llama_cpp.llama_cpp")
        low.llama_supports_gpu_offload = lambda: gpu_offload
        package = types.ModuleType("llama_cpp")
        package.__version__ = "0.3.99"
        package.llama_cpp = low
        self.mp.setitem(sys.modules, "llama_cpp", package)
        self.mp.setitem(sys.modules, "llama_cpp.llama_cpp", low)
        self.installed.add("llama_cpp")

    def plugins(self, *eps: object) -> None:
        self.mp.setattr(lp, "_entry_points", lambda: list(eps))


@pytest.fixture
def machine(monkeypatch):
    return Machine(monkeypatch)


def _reasons(choice: lp.Choice) -> dict[str, tuple[bool, str]]:
    return {s.name: (s.available, s.reason) for s in choice.report}


# ---- detection -------------------------------------------------------------------------------


def test_no_gpu_chooses_cpu_with_reasons(machine):
    choice = lp.choose_backend("auto")
    assert choice.spec.name == "cpu"
    reasons = _reasons(choice)
    assert reasons["cuda"] == (False, "torch 2.9.0+fake is built without CUDA")
    assert reasons["rocm"] == (False, "torch 2.9.0+fake is not a ROCm (HIP) build")
    assert reasons["npu"][0] is False and "torch_npu not installed" in reasons["npu"][1]
    assert "pip install torch-npu" in reasons["npu"][1]
    assert reasons["mlx"][0] is False and "mlx not installed" in reasons["mlx"][1]
    assert reasons["cpu"] == (True, "always available")
    assert [s.name for s in choice.report] == ["cuda", "rocm", "npu", "llamacpp", "mlx", "cpu"]


def test_gguf_goes_to_llama_cpp_and_hf_folders_to_torch(machine):
    machine.llamacpp()
    assert lp.choose_backend("auto", model_format="gguf").spec.name == "llamacpp"
    choice = lp.choose_backend("auto", model_format="hf")
    assert choice.spec.name == "cpu"
    assert _reasons(choice)["llamacpp"] == (False, "cannot load hf models (loads gguf)")
    machine.torch(_fake_torch(cuda="12.4", gpus=1))  # a CUDA GPU keeps GGUF on torch + FlashInfer
    assert lp.choose_backend("auto", model_format="gguf").spec.name == "cuda"


def test_macs_run_gguf_on_llama_cpp_metal_and_hf_on_mlx(machine):
    machine.apple(metal=True)
    machine.llamacpp(gpu_offload=True)
    gguf = lp.choose_backend("auto", model_format="gguf")
    assert (gguf.spec.name, gguf.availability.device) == ("llamacpp", "gpu")
    assert lp.choose_backend("auto", model_format="hf").spec.name == "mlx"


def test_cuda_build_without_device(machine):
    machine.torch(_fake_torch(cuda="12.4", gpus=0))
    choice = lp.choose_backend("auto")
    assert choice.spec.name == "cpu"
    assert _reasons(choice)["cuda"] == (False, "no CUDA device visible (torch 2.9.0+fake)")


def test_cuda_present_is_chosen(machine):
    machine.torch(_fake_torch(cuda="12.4", gpus=2))
    choice = lp.choose_backend("auto")
    assert choice.spec.name == "cuda"
    assert choice.availability.reason == "2 CUDA device(s), CUDA 12.4"
    assert choice.availability.device == "cuda"
    assert "Fake GPU (80.0 GiB)" in choice.availability.detail
    target = lp.resolve_target(choice, ServerArgs())
    assert target == Target("cuda", "cuda", "bfloat16", "flashinfer")


def test_rocm_present_is_chosen(machine):
    machine.torch(_fake_torch(hip="6.2.4", gpus=1))
    choice = lp.choose_backend("auto")
    assert choice.spec.name == "rocm"
    assert _reasons(choice)["cuda"] == (False, "torch 2.9.0+fake is a ROCm build (see rocm)")
    assert choice.availability.device == "cuda"  # torch names HIP devices "cuda"


def test_npu_present_is_chosen(machine):
    machine.npu(2)
    choice = lp.choose_backend("auto")
    assert choice.spec.name == "npu"
    assert choice.availability.reason == "2 Ascend NPU(s)"
    assert lp.resolve_target(choice, ServerArgs()).device == "npu"


def test_apple_silicon_chooses_mlx_on_metal(machine):
    machine.apple(metal=True)
    choice = lp.choose_backend("auto")
    assert choice.spec.name == "mlx"
    reasons = _reasons(choice)
    assert reasons["cuda"] == (False, "CUDA does not run on macOS")
    assert reasons["rocm"] == (False, "ROCm does not run on macOS")
    assert "applegpu_g15s, 64.0 GiB" in choice.availability.detail
    target = lp.resolve_target(choice, ServerArgs())
    assert target == Target("mlx", "gpu", "bfloat16", "mlx_paged")


def test_mlx_off_apple_only_when_requested(machine):
    machine.mlx()
    auto = lp.choose_backend("auto")
    assert auto.spec.name == "cpu"
    available, reason = _reasons(auto)["mlx"]
    assert not available and "not Apple silicon" in reason and "--backend mlx" in reason
    named = lp.choose_backend("mlx")
    assert named.spec.name == "mlx"
    assert named.availability.device == "cpu"
    others = {s.name: s.reason for s in named.report if s.name != "mlx"}
    assert set(others.values()) == {"not probed (--backend mlx)"}
    assert lp.resolve_target(named, ServerArgs(backend="mlx")).dtype == "float32"


def test_named_backend_is_probed_alone(machine, monkeypatch):
    machine.mlx()
    monkeypatch.setitem(sys.modules, "torch", None)  # any `import torch` would now fail
    assert lp.choose_backend("mlx").spec.name == "mlx"


def test_requested_backend_unavailable_raises_with_reason(machine):
    with pytest.raises(BackendError, match="'cuda' is not available: torch .* without CUDA"):
        lp.choose_backend("cuda")
    with pytest.raises(BackendError, match="'npu' is not available: torch_npu not installed"):
        lp.choose_backend("npu")


def test_unknown_backend_lists_the_known_ones(machine):
    with pytest.raises(BackendError, match="unknown backend 'tpu'; choose one of: auto, cuda"):
        lp.choose_backend("tpu")


def test_device_narrows_auto(machine):
    machine.torch(_fake_torch(cuda="12.4", gpus=1))
    choice = lp.choose_backend("auto", device="cpu")
    assert choice.spec.name == "cpu"
    assert _reasons(choice)["cuda"] == (False, "--device cpu selects another backend")
    assert lp.choose_backend("auto", device="cuda:1").spec.name == "cuda"
    target = lp.resolve_target(lp.choose_backend("auto", "cuda:1"), ServerArgs(device="cuda:1"))
    assert target.device == "cuda:1"


def test_probe_that_raises_is_recorded(machine, monkeypatch):
    broken = _fake_torch(cuda="12.4", gpus=1)
    broken.cuda.is_available = lambda: (_ for _ in ()).throw(RuntimeError("driver too old"))
    machine.torch(broken)
    choice = lp.choose_backend("auto")
    assert choice.spec.name == "cpu"
    assert _reasons(choice)["cuda"] == (False, "probe failed: RuntimeError: driver too old")


# ---- plugins -----------------------------------------------------------------------------


class _EP:
    def __init__(self, name: str, value: str, load) -> None:
        self.name, self.value, self._load = name, value, load
        self.dist = SimpleNamespace(name=f"{name}-plugin")

    def load(self):
        return self._load()


def _raise(exc: Exception):
    def load():
        raise exc

    return load


def fancy_probe(explicit: bool) -> Availability:
    return Availability(True, "fancy chip found", "fancy:0")


PLUGIN = BackendSpec(
    name="fancy",
    priority=500,
    description="a plugin accelerator",
    probe_fn=f"{__name__}:fancy_probe",  # this module, however pytest named it
    create_runner_fn="fancy_pkg.runner:create",
    dtypes=("float16",),
    default_dtype="float16",
    page_sizes=(16, 32),
)


def test_plugins_join_and_broken_ones_are_recorded(machine, monkeypatch):
    machine.plugins(
        _EP("fancy", "fancy_pkg:SPEC", lambda: PLUGIN),
        _EP("broken", "broken_pkg:SPEC", _raise(ImportError("No module named 'broken_pkg'"))),
        _EP("weird", "weird_pkg:thing", lambda: 42),
        _EP("cpu", "impostor:SPEC", lambda: dataclasses.replace(PLUGIN, name="cpu")),
        _EP("cpu", "localradix.backends.cpu:SPEC", lambda: pytest.fail("built-in reloaded")),
    )
    records = {(r.name, r.origin): r for r in lp.discover_backends()}
    assert records[("broken", "plugin broken-plugin")].error == (
        "ImportError: No module named 'broken_pkg'"
    )
    assert (
        records[("weird", "plugin weird-plugin")].error
        == "TypeError: expected a BackendSpec, got int"
    )
    assert records[("cpu", "plugin cpu-plugin")].error == "name taken by another backend; ignored"
    choice = lp.choose_backend("auto")
    assert choice.spec.name == "fancy"  # highest priority, available
    reasons = _reasons(choice)
    assert reasons["broken"] == (False, "failed to load: ImportError: No module named 'broken_pkg'")
    with pytest.raises(BackendError, match="'broken' failed to load: ImportError"):
        lp.choose_backend("broken")
    # the plugin's declared capabilities drive resolution
    assert lp.resolve_target(choice, ServerArgs(page_size=16)).dtype == "float16"
    with pytest.raises(BackendError, match="does not support dtype 'float32'; supported: float16"):
        lp.resolve_target(choice, ServerArgs(dtype="float32", page_size=16))
    with pytest.raises(BackendError, match="does not support --page-size 1; supported: 16, 32"):
        lp.resolve_target(choice, ServerArgs())


def test_entry_point_may_be_a_factory(machine):
    machine.plugins(_EP("fancy", "fancy_pkg:make_spec", lambda: lambda: PLUGIN))
    assert "fancy" in lp.backend_specs()


def test_real_builtins_load_and_are_ordered():
    specs = lp.backend_specs()
    assert list(specs)[:6] == ["cuda", "rocm", "npu", "llamacpp", "mlx", "cpu"]
    assert specs["mlx"].attention_backend == "mlx_paged"
    assert all(s.default_dtype in s.dtypes for s in specs.values())


def test_listing_imports_no_torch():
    code = (
        "import sys, localradix.platform as p\n"
        "names = list(p.backend_specs())\n"
        "[s.missing_requirements() for s in p.backend_specs().values()]\n"
        "print('torch' in sys.modules, 'mlx.core' in sys.modules, names)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("False False ['cuda', 'rocm', 'npu', 'llamacpp', 'mlx', 'cpu'")


# ---- doctor ----------------------------------------------------------------------------------


def _run_doctor(capsys, *argv: str) -> tuple[int, str]:
    rc = doctor.main(list(argv))
    return rc, capsys.readouterr().out


def test_doctor_prints_hardware_backends_choice_and_packages(machine, capsys):
    machine.torch(_fake_torch(cuda="12.4", gpus=1))
    rc, out = _run_doctor(capsys)
    assert rc == 0
    assert "Memory" in out and "GiB available" in out
    assert "cuda      100  available      1 CUDA device(s), CUDA 12.4" in out
    assert "hardware: 0: Fake GPU (80.0 GiB)" in out
    assert "npu        80  not available  torch_npu not installed" in out
    assert "cuda: device cuda, dtype bfloat16 (for --dtype auto)" in out
    assert "Packages" in out and "numpy" in out


def test_doctor_says_which_backend_runs_each_format_and_how_to_get_llama_cpp(machine, capsys):
    rc, out = _run_doctor(capsys)
    assert "GGUF files:           cpu: device cpu" in out
    assert "pip install llama-cpp-python" in out
    machine.llamacpp()
    rc, out = _run_doctor(capsys)
    assert "GGUF files:           llamacpp: device cpu, dtype float16" in out
    assert "Hugging Face folders: cpu: device cpu" in out
    assert "pip install llama-cpp-python" not in out


def test_doctor_json_and_failed_request(machine, capsys):
    rc, out = _run_doctor(capsys, "--json", "--backend", "npu")
    assert rc == 1
    report = json.loads(out)
    assert report["chosen"]["backend"] is None
    assert "torch_npu not installed" in report["chosen"]["error"]
    assert {b["name"] for b in report["backends"]} >= {"cuda", "rocm", "npu", "mlx", "cpu"}
    assert report["packages"]["numpy"]


def test_doctor_as_a_cli_subcommand(machine, capsys, monkeypatch):
    from localradix import cli

    # the line cli.COMMANDS gets for `localradix doctor` (idempotent if already wired)
    monkeypatch.setitem(
        cli.COMMANDS, "doctor", cli.Command("localradix.doctor", "add_doctor_parser", "run_doctor")
    )
    assert cli.main(["doctor", "--backend", "cpu"]) == 0
    assert "Chosen for --backend cpu" in capsys.readouterr().out


def test_doctor_shows_the_kv_disk_cache(machine, capsys, tmp_path):
    import numpy as np

    from localradix.mem.disk_tier import DiskTier
    from localradix.mem.kv_chunks import KVChunk, chain, root_digest

    rc, out = _run_doctor(capsys)  # tests/conftest.py turns the tier off
    assert "KV disk cache (cached prefixes kept across restarts; `localradix cache` lists" in out
    assert "  off (--kv-disk-cache or $LOCALRADIX_KV_DISK_CACHE says off): " in out
    tokens = np.arange(8, dtype=np.int64)
    tier = DiskTier(tmp_path, "f" * 24, 1 << 30, {"name": "m"})
    tier.put(KVChunk(chain(tokens, None, 8)[0], root_digest(None), tokens,
                     np.zeros((8, 32), np.uint8)))  # fmt: skip
    tier.close()
    size = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.suffix in (".kv", ".next"))
    rc, out = _run_doctor(capsys, "--kv-disk-cache", str(tmp_path), "--kv-disk-gib", "2")
    assert f"  folder   {tmp_path}\n  budget   2.0 GiB (2 GiB asked for)\n" in out
    assert f"  used     {size} B (1 file, 1 model)\n" in out
    rc, out = _run_doctor(capsys, "--json", "--kv-disk-cache", str(tmp_path))
    disk = json.loads(out)["kv_disk"]
    assert disk["on"] and disk["used_bytes"] == size and disk["models"][0]["name"] == "m"
