"""Value checks every config section shares, each raising a one-line `ConfigError` naming its
key. In a module of their own so sections defined outside rayfl.config (the round pipeline's)
use the same ones without importing the whole config."""

from __future__ import annotations

from rayfl.errors import ConfigError


def choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(key, f"unknown value {value!r}; allowed values are {list(allowed)}")


def positive(key: str, value: int | float) -> None:
    if value <= 0:
        raise ConfigError(key, f"must be > 0, got {value}")


def positive_float(key: str, value: float) -> None:
    """> 0, NaN included in what fails."""
    if not value > 0:
        raise ConfigError(key, f"must be > 0, got {value}")


def non_negative(key: str, value: int | float) -> None:
    if value < 0:
        raise ConfigError(key, f"must be >= 0, got {value}")


def fraction(key: str, value: float, open_left: bool = True, open_right: bool = False) -> None:
    lo_ok = value > 0 if open_left else value >= 0
    hi_ok = value < 1 if open_right else value <= 1
    if not (lo_ok and hi_ok):
        lo = "(0" if open_left else "[0"
        hi = "1)" if open_right else "1]"
        raise ConfigError(key, f"must be in {lo}, {hi}, got {value}")
