"""The exception every configuration check raises, in a module of its own so that any module
(config sections, extension kinds, the engine's placement) can raise it without importing the
whole config; and its kind for a resource request the cluster cannot meet."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration mistake, with the dotted key it concerns."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


class ResourceError(ConfigError):
    """A resource request the Ray cluster cannot meet; `key` names the engine field to change."""
