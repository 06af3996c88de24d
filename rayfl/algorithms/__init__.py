"""Built-in algorithms: each a config dataclass and a server loop over the Federation, in a
module of its own, registered in `rayfl.algorithms.catalog` (see rayfl.registry)."""

import importlib


def import_all() -> None:
    """Import every built-in algorithm's module (what a host may be asked to run)."""
    from rayfl.algorithms.catalog import BUILTIN

    for _, run, _, _ in BUILTIN:
        importlib.import_module(f"rayfl.algorithms.{run.split(':')[0]}")


__all__ = ["import_all"]
