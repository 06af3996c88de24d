"""ComFedL's Fig. 3 table (rayfl.papers.comfedl.report): each ablation value's average and
worst-client validation accuracy after the page's rounds, means over its seeds."""

from __future__ import annotations

import math

import pandas as pd

from rayfl.papers.comfedl.report import fig3_markdown, fig3_table, fig6_markdown
from rayfl.results.load import Results


def test_fig3_table_means_each_setting_over_its_seeds_at_the_pages_rounds():
    runs = pd.DataFrame({"experiment": "e", "run_id": ["tau=1,s0", "tau=1,s1", "tau=5,s0", "gamma=0.2,s0"],
                         "tau": [1, 1, 5, 5], "gamma": [0.2] * 4, "seed": [0, 1, 0, 0]})
    value = {"tau=1,s0": 0.5, "tau=1,s1": 0.7, "tau=5,s0": 0.8, "gamma=0.2,s0": 0.8}
    rounds = pd.DataFrame([{"experiment": "e", "run_id": rid, "round": r, "avg_val_accuracy": v + r / 1000,
                            "worst_val_accuracy": v - 0.1} for rid, v in value.items() for r in (9, 19, 49, 99)])
    results = Results(rounds, pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    table = fig3_table(results, [("τ", "tau", runs)]).set_index("setting")
    assert table.loc["τ = 1", "seeds"] == 2 and table.loc["τ = 5", "seeds"] == 1  # one setting and seed counts once
    assert math.isclose(table.loc["τ = 1", "avg_val_accuracy@49"], 100 * (0.6 + 0.049))
    assert math.isclose(table.loc["τ = 5", "worst_val_accuracy@19"], 70.0)
    assert math.isnan(table.loc["τ = 1", "avg_val_accuracy@199"])  # a round not logged
    assert fig3_markdown(table.reset_index()).splitlines()[2] == "| τ = 1 | 2 | 61.9 / 50.0 | 64.9 / 50.0 | 69.9 / 50.0 | — |"


def test_fig6_table_gives_each_methods_mean_and_spread_per_rho():
    finals = pd.DataFrame({"method": ["ComFedL-DAMAML", "ComFedL-DAMAML", "FedAvg", "FedAvg", "FedAvg"],
                           "rho": [0.5, 0.5, 0.5, 0.5, 0.9], "seed": [0, 1, 0, 1, 0],
                           "pers_avg_val_accuracy": [0.90, 0.92, 0.91, 0.91, 0.94],
                           "pers_worst_val_accuracy": [0.80, 0.84, 0.85, 0.85, 0.88]})
    lines = fig6_markdown(finals).splitlines()
    assert lines[2] == "| 0.5 | 2 | 91.00 ± 1.00 / 82.00 ± 2.00 | 91.00 ± 0.00 / 85.00 ± 0.00 |"
    assert lines[3] == "| 0.9 | 1 | — | 94.00 ± 0.00 / 88.00 ± 0.00 |"
