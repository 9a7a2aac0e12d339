"""What finding or fetching a model raises; each message says what to do next."""

from __future__ import annotations


class ModelSourceError(ValueError):
    """The model spec names nothing loadable; the message says what to do."""


class StoreError(ModelSourceError):
    """A store operation that cannot be done; the message says what to do next."""
