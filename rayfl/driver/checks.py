"""What a config may ask of the drivers, checked before anything runs: whether it runs
asynchronously, and what it cannot do there (one line each). The algorithm class comes from
the caller (the registry's entry), so this module imports neither."""

from __future__ import annotations

from typing import Any

from rayfl.errors import ConfigError


def is_algorithm(obj: Any) -> bool:
    """Whether a registry entry's target is a parts-built algorithm class (else a server loop)."""
    return isinstance(obj, type) and bool(getattr(obj, "__rayfl_algorithm__", False))


def asynchrony_of(cfg: Any, cls: Any) -> Any:
    """The asynchronous driver's settings (an AsynchronyConfig) for this config and its
    algorithm class (rayfl.Algorithm; None for a hand-written loop), or None: synchronous."""
    return None if cls is None else cls.asynchrony_of(cfg)


def check_driver(cfg: Any, cls: Any) -> None:
    """Asynchrony needs an algorithm built from parts with one client call a step and an
    asynchronous reading, and no synchronous round policy beside it."""
    name = cfg.algorithm.name
    section = getattr(cfg, "asynchrony", None)
    if section is not None and section.enabled:
        if cls is None:
            raise ConfigError("asynchrony.enabled", f"{name!r} is a hand-written server loop; only algorithms built "
                                                    "from parts (rayfl.Algorithm) run under the asynchronous driver")
        if cls.always_asynchronous:
            raise ConfigError("asynchrony.enabled", f"{name} is asynchronous by itself (its algorithm keys set "
                                                    "concurrency and staleness); drop the asynchrony section")
        why = cls.refuses_asynchrony(cfg.algorithm)
        if why is not None:
            raise ConfigError("asynchrony.enabled", f"{name} does not run asynchronously: {why}")
    asynchronous = asynchrony_of(cfg, cls) is not None
    if asynchronous and getattr(cfg.algorithm, "server_as_client", False):
        raise ConfigError("algorithm.server_as_client", "the server's own update joins synchronous rounds only; set it "
                                                        "to false for an asynchronous run")
    if asynchronous and cfg.system.policy != "sync":
        raise ConfigError("system.policy", f"{cfg.system.policy!r} closes synchronous rounds; an asynchronous run "
                                           "applies arrivals as they come: set system.policy: sync")


def check_server_optimizer(cfg: Any, cls: Any) -> None:
    """The `server:` section's optimizer needs a parts-built algorithm whose global model the
    driver can read and write, and no second optimizer of the algorithm's own."""
    section = getattr(cfg, "server", None)
    if section is None or not section.changes_step:
        return
    name = cfg.algorithm.name
    if cls is None:
        raise ConfigError("server.optimizer", f"{name!r} is a hand-written server loop; the server optimizer applies to "
                                              "algorithms built from parts (rayfl.Algorithm)")
    own = getattr(getattr(cfg.algorithm, "server_optimizer", None), "name", "sgd")
    if own != "sgd" and section.optimizer != "sgd":
        raise ConfigError("server.optimizer", f"algorithm.server_optimizer is already {own}; set one of the two")
    from rayfl.driver.parts import Algorithm

    if cls.model_of is not Algorithm.model_of and cls.with_model is Algorithm.with_model:
        raise ConfigError("server.optimizer", f"{name} defines model_of but not with_model, so the driver cannot write "
                                              "the optimizer's step back into its state")
