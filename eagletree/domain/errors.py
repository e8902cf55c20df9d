"""The library's exception types; adapters raise these too, so callers never see adapter types."""

from __future__ import annotations


class EagleTreeError(Exception):
    """Base class of every error eagletree raises on purpose."""


class ConfigurationError(EagleTreeError, ValueError):
    """Settings contradict each other or the target model; the message says what to change."""


class OutOfSlots(EagleTreeError, RuntimeError):
    """A pool has fewer free entries than a caller asked for."""

    def __init__(self, requested: int, available: int, what: str = "KV slots") -> None:
        super().__init__(f"asked for {requested} {what}, {available} free")
        self.requested = requested
        self.available = available


class DoubleFree(EagleTreeError, RuntimeError):
    """A slot or request row was freed while it was already free."""
