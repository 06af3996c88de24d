"""docs/benchmarks.md is what scripts/gen_benchmarks.py renders from the committed bench JSON,
the README's speed figures are that JSON's, and the peer comparison hands every system the same
workload (the same rows per client, the same initial model)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
# a figure with its unit: 3.72x, 0.81 s, 1.7 GB, 850 MB
FIGURE = re.compile(r"\b\d+(?:\.\d+)?(?:x|\s(?:s|GB|MB))\b")


def script(name: str, folder: Path = REPO / "scripts") -> ModuleType:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_page_is_generated_from_the_committed_json() -> None:
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert script("gen_benchmarks").render() == page, "docs/benchmarks.md is out of date: python scripts/gen_benchmarks.py"


def readme_speed_bullet() -> str:
    """The README's `- speed:` bullet, up to the next bullet or paragraph."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("- speed:"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("- ") or not lines[i].strip())
    return " ".join(lines[start:end])


def test_the_readme_quotes_the_tables_figures() -> None:
    gen = script("gen_benchmarks")
    figures = gen.readme_figures()
    quoted = FIGURE.findall(readme_speed_bullet())
    assert sorted(quoted) == sorted(figures.values()), (
        f"README.md's speed figures {quoted} are not the tables' {figures}: update README.md")
    page = gen.render()
    for name, value in figures.items():
        assert f" {value}" in page, f"{name} {value} is not on docs/benchmarks.md"


def test_every_peer_gets_the_same_rows_and_initial_model(tmp_path: Path) -> None:
    from rayfl.models import build_model
    from rayfl.models.params import set_flat
    from rayfl.runner import build_dataset

    compare = script("compare_peers")
    shared = script("shared_workload", REPO / "scripts" / "peers")
    cfg = compare.workload_config(compare.WORKLOAD, 3, "partition.num_clients=12", "algorithm.clients_per_round=3")
    dataset = build_dataset(cfg)
    settings = compare.export_workload(cfg, dataset, tmp_path / "w.npz")
    w = shared.load_workload(tmp_path / "w.npz")
    assert (w.num_clients, w.rounds, w.clients_per_round, w.batch_size) == (12, 3, 3, settings["batch_size"])
    for c in range(w.num_clients):
        x, y = w.client(c)
        rows = np.asarray(dataset.client_train[c])
        np.testing.assert_array_equal(x, dataset.train_x[rows])
        np.testing.assert_array_equal(y, dataset.train_y[rows])
    # the peers' model from the exported weights computes what rayfl's initial model computes
    ours = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
    set_flat(ours, torch.from_numpy(w.initial))
    theirs = shared.build_model(w)
    inputs = torch.from_numpy(w.test_x[:50])
    with torch.no_grad():
        torch.testing.assert_close(theirs(inputs), ours(inputs), rtol=0, atol=0)
    assert shared.accuracy(theirs, w) == compare.test_accuracy(cfg, dataset, w.initial)


def test_a_runner_times_rounds_as_the_bench_does() -> None:
    shared = script("shared_workload", REPO / "scripts" / "peers")
    seconds, median = shared.seconds_per_round([0.0, 5.0, 6.0, 8.0, 9.0], 20.0)
    assert seconds == [5.0, 1.0, 2.0, 1.0, 11.0]
    assert median == 1.0  # rounds 1..3: round 0 holds the start, the last round the evaluation


def test_a_bench_result_names_the_commit_and_machine_it_measured(tmp_path: Path) -> None:
    import json
    import subprocess

    from rayfl.bench.common import write_result

    write_result(tmp_path / "r.json", {"seconds": 1.0})
    recorded = json.loads((tmp_path / "r.json").read_text())["provenance"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    assert recorded["commit"] == head.stdout.strip()[:7]
    assert recorded["cpus"] >= 1 and recorded["processor"] and len(recorded["date"]) == 10
    assert isinstance(recorded["uncommitted_changes"], bool)
