"""The store tests' fixtures: the hub stand-in's repos, and stand-ins started per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hub_standin import HubStandIn, Repo
from store_support import (
    EMPTY_REPO,
    ENCODER_REPO,
    FOLDER_REPO,
    GGUF_REPO,
    SPLIT_REPO,
    bundled_gguf,
    write_encoder_folder,
    write_split_gguf,
    write_tiny_folder,
)


@pytest.fixture(scope="session")
def hub_repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Repo]:
    files = tmp_path_factory.mktemp("hub-files")
    smol = bundled_gguf()
    truncated = files / "SmolLM2-135M-Instruct-Q8_0.gguf"
    truncated.write_bytes(smol.read_bytes()[: smol.stat().st_size // 2])
    readme = files / "README.md"
    readme.write_text("# a model card\n")
    (files / "split").mkdir()
    shards = write_split_gguf(files / "split")
    (files / "tiny").mkdir()
    return {
        GGUF_REPO: Repo(
            {
                "SmolLM2-135M-Instruct-Q4_1.gguf": smol,
                "SmolLM2-135M-Instruct-Q8_0.gguf": truncated,
                "README.md": readme,
            }
        ),  # fmt: skip
        SPLIT_REPO: Repo({p.name: p for p in shards}),
        FOLDER_REPO: Repo(write_tiny_folder(files / "tiny")),
        EMPTY_REPO: Repo({"README.md": readme}),
        ENCODER_REPO: Repo(write_encoder_folder(files / "encoder")),
    }


@pytest.fixture
def make_hub(hub_repos: dict[str, Repo]) -> Iterator[Callable[..., HubStandIn]]:
    """Start stand-ins (stopped at the end of the test)."""
    started: list[HubStandIn] = []

    def make(**kwargs: Any) -> HubStandIn:
        hub = HubStandIn(hub_repos, **kwargs).start()
        started.append(hub)
        return hub

    yield make
    for hub in started:
        hub.stop()
