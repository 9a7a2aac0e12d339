"""What the scheduler needs from a grammar engine (kept free of xgrammar and of arrays libs)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from localradix.sampling_params import Constraint


class GrammarMatcherState(Protocol):
    def fill_mask(self, mask: np.ndarray, row: int) -> None: ...
    def accept(self, token: int) -> bool: ...
    @property
    def terminated(self) -> bool: ...


class GrammarBackend(Protocol):
    def submit(self, constraint: Constraint) -> Future[Any]:
        """Compile (off the engine loop, cached); the future raises InvalidGrammar if bad."""
        ...

    def new_state(self, compiled: Any) -> GrammarMatcherState: ...
