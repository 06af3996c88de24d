"""Published numbers that `rayfl report` puts next to measured ones, each file naming its source."""

from __future__ import annotations

from importlib import resources

import pandas as pd


def paper_table(name: str) -> pd.DataFrame:
    """A reference table shipped with rayfl, e.g. `zo_hfl_table1` (ZO-HFL's Table I)."""
    with resources.files(__package__).joinpath(f"{name}.csv").open() as fh:
        return pd.read_csv(fh, comment="#")
