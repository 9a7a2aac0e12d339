"""Built-in backends, one package each (`localradix.backends.<name>`), found via `platform.py`.

Each package's `__init__` holds only its `BackendSpec` (no heavy imports); probes and runners
live in submodules imported when the backend is probed or chosen.
"""
