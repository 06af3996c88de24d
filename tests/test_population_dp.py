"""The population-scale DP experiment (scripts/population_dp.py, docs/replications/population-dp.md):
at tiny sizes the script's table holds the runs' epsilon, which falls as the population grows at
a fixed cohort and is rayfl's accountant's own value, and the page's tables are what the script
renders from the results committed beside it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from rayfl.pipeline.accounting import Mechanism, epsilon

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "replications" / "population-dp.md"


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("population_dp", REPO / "scripts" / "population_dp.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["population_dp"] = module
    spec.loader.exec_module(module)
    return module


def test_epsilon_falls_with_the_population_and_is_the_accountants(ray_local, tmp_path: Path) -> None:
    pdp = script()
    cohort, rounds = 20, 2
    pdp.main(["--out", str(tmp_path), "--populations", "200", "2000", "--seeds", "0", "--no-reference", "--accounting-populations",
              "--set", f"algorithm.clients_per_round={cohort}", "--set", f"run.rounds={rounds}",
              "--set", "run.eval_every=1", "--set", "data.eval_clients=20", "--set", "privacy.accountant=rdp"])
    runs = pd.read_parquet(tmp_path / "runs.parquet")
    private = runs[runs["private"]].set_index("population")
    assert list(private.index) == [200, 2000]
    for n, row in private.iterrows():
        direct = epsilon(Mechanism(1.0, "poisson", n, cohort), rounds, n ** -1.1, "rdp")
        assert row["epsilon"] == pytest.approx(direct, rel=1e-12)
        assert row["delta"] == pytest.approx(n ** -1.1, rel=1e-12)
    assert private.loc[2000, "epsilon"] < 0.75 * private.loc[200, "epsilon"]  # q 0.1 -> 0.01
    assert runs["private"].all()
    table = (tmp_path / "population_dp.md").read_text()
    assert f"| 2,000 | 0.01 | {pdp.sci(2000 ** -1.1)} | {pdp.sci(private.loc[2000, 'epsilon'])} |" in table
    assert (tmp_path / "population_dp.png").stat().st_size > 0
    pdp.main(["--out", str(tmp_path), "--table-only"])  # from the Parquet alone, the same table
    assert (tmp_path / "population_dp.md").read_text() == table


def test_the_page_shows_what_the_script_renders_from_the_committed_results() -> None:
    pdp = script()
    data = pdp.page_data(PAGE)
    runs, acc = (pd.read_parquet(data / name) for name in pdp.DATA_FILES)
    text = PAGE.read_text(encoding="utf-8")
    shown = text.split(pdp.BEGIN, 1)[1].split(pdp.END, 1)[0]
    assert shown == "\n" + pdp.render(runs, acc), (
        "the page's tables are out of date: python scripts/population_dp.py --table-only --page "
        + PAGE.relative_to(REPO).as_posix())
