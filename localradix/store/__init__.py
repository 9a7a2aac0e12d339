"""The model store: models pulled from the Hugging Face hub into its cache, known by name.

The store *is* the hub's cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`): `pull` downloads with
huggingface-hub (resumable, with its progress bars, `HF_TOKEN`, `HF_ENDPOINT`, `HF_HUB_OFFLINE`),
`ls` scans the cache, `rm` deletes a model's files from it. What localradix adds is names: a
short alias derived from each model (`smollm2:135m-q4_1`), editable in `aliases.json`, next to
the repo id and `REPO:QUANT`. Nothing here imports torch, and huggingface-hub is imported only
by the functions that talk to the hub. `source.resolve_model` turns what a user typed (a path, a
store name, nothing: the bundled model, `bundled.py`) into the `ModelSource` the loader reads.
"""

from __future__ import annotations

from localradix.store.errors import StoreError

__all__ = ["StoreError"]
