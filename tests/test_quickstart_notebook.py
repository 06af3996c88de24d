"""The quickstart notebook runs as written: every cell, in order, in a fresh kernel and a fresh
directory (nbclient), so a change to the Python API that breaks it fails here. Its committed
outputs are not compared: they only show what a run printed when the notebook was saved."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "getting-started" / "quickstart.ipynb"


@pytest.mark.slow
def test_the_quickstart_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # the notebook starts a Ray of its own
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # a failing cell raises CellExecutionError naming the cell and its traceback
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    assert sorted(p.name for p in (tmp_path / "results" / "quickstart").iterdir()) == [
        "fedavg",
        "fedprox",
    ]
    assert (tmp_path / "results" / "quickstart" / "fedprox" / "rounds").is_dir()
