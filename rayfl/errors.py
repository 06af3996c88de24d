"""The one exception every configuration check raises, in a module of its own so that any
module (config sections, extension kinds) can raise it without importing the whole config."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration mistake, with the dotted key it concerns."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
