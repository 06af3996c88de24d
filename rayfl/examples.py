"""The example jobs shipped with rayfl (the repository's jobs/, installed as package data), run
by name: `rayfl run --example digits_fedavg`, or `ffgg/table1_mnist_fedavg` for a paper's."""

from __future__ import annotations

from pathlib import Path

from rayfl.config import ConfigError


def jobs_dir() -> Path:
    """Where the shipped jobs are: beside the package's modules (a wheel's package data, or
    the repository's jobs/ through the package's link to it)."""
    return Path(__file__).resolve().parent / "jobs"


def examples() -> dict[str, str]:
    """Every shipped job by name (its path under jobs/ without .yaml), with the first line of
    its leading comment."""
    root = jobs_dir()
    found = {}
    for path in sorted(root.rglob("*.yaml")):
        name = path.relative_to(root).with_suffix("").as_posix()
        found[name] = _summary(path)
    return found


def example_path(name: str) -> Path:
    """The shipped job `name`, or a one-line ConfigError listing them."""
    path = jobs_dir() / f"{name.removesuffix('.yaml')}.yaml"
    if not path.is_file() or ".." in Path(name).parts:
        known = ", ".join(examples()) or "none installed"
        raise ConfigError("--example", f"no example job {name!r}; examples: {known}")
    return path


def _summary(path: Path) -> str:
    """The start of the job's leading comment."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(" ".join(lines).split())
    return text if len(text) <= 100 else text[:97].rsplit(" ", 1)[0] + " ..."
