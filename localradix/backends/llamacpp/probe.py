"""llama.cpp: usable wherever llama-cpp-python imports; offloads to a GPU if its build can."""

from __future__ import annotations

from localradix.platform import Availability


def probe(explicit: bool) -> Availability:
    from localradix.loader.llama_openmp import settle_openmp

    settle_openmp()
    import llama_cpp
    import llama_cpp.llama_cpp as llama

    version = getattr(llama_cpp, "__version__", "?")
    if llama.llama_supports_gpu_offload():
        return Availability(True, f"llama-cpp-python {version}, GPU offload", "gpu")
    from localradix.backends.llamacpp.runner import default_threads

    return Availability(
        True, f"llama-cpp-python {version} on the CPU", "cpu", f"{default_threads()} threads"
    )
