"""One package per paper rayfl reproduces: what belongs to that paper beyond its algorithm.

Each `rayfl/papers/<paper>/` holds the paper's published numbers (CSV files naming their
source), its table and figure layouts drawn from Parquet (`report.py`), and anything else
only that paper needs; its jobs live in `jobs/<paper>/` and its replication notes in
`docs/replications/<paper>.md`. The algorithms themselves stay in `rayfl/algorithms/`, one file
each, because any experiment may use them.

`rayfl report` calls every function in `PAPER_REPORTS` on the loaded results; each writes its
tables and figures when the results hold runs it recognises and returns the lines to print
(nothing otherwise)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from rayfl.results.load import Results

if TYPE_CHECKING:  # imported where a table is read: the algorithms import this package (a
    import pandas as pd  # paper's problem data), and pandas would add 0.4 s to every run's start

PaperReport = Callable[[Results, Path], list[str]]


def paper_table(paper: str, name: str) -> pd.DataFrame:
    """A published table shipped with rayfl, e.g. `paper_table("zo_hfl", "table1")`."""
    import pandas as pd

    with resources.files(f"{__package__}.{paper}").joinpath(f"{name}.csv").open() as fh:
        return pd.read_csv(fh, comment="#")


def paper_reports() -> list[PaperReport]:
    """Every paper's report writer (imported here, lazily: they import plotting)."""
    from rayfl.papers.comfedl.maml_report import write_comfedl_maml_report
    from rayfl.papers.comfedl.report import write_comfedl_report
    from rayfl.papers.fedrzo.fig2 import write_fedrzo_fig2
    from rayfl.papers.fedrzo.report import write_fedrzo_report
    from rayfl.papers.ffgg.report import write_ffgg_report
    from rayfl.papers.ffgg.table1 import write_ffgg_table1
    from rayfl.papers.zo_hfl.report import write_zo_hfl_report

    return [write_zo_hfl_report, write_ffgg_table1, write_fedrzo_fig2, write_fedrzo_report, write_comfedl_report,
            write_comfedl_maml_report, write_ffgg_report]
