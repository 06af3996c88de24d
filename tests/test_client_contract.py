"""The claims of docs/reference/client-contract.md that are cheap to check: its tables name
exactly `local_sgd`'s parameters, `ClientContext`'s attributes and `AlgorithmConfig`'s keys,
a client's state starts empty, and its bytes are counted as the page's FedAvg example says."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import numpy as np

import rayfl
from rayfl.config import ModelConfig, RunConfig
from rayfl.engine.host import ClientHostImpl

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "client-contract.md"


def first_column(heading: str) -> list[str]:
    """The names in the first column of the first table under `## heading` (`a`, `b` cells
    give both; `rng(purpose)` gives rng)."""
    section = PAGE.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [re.match(r"\w+", name).group(0) for row in rows for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])]


def test_the_local_sgd_table_is_its_signature() -> None:
    assert first_column("Helpers a client function can call") == list(inspect.signature(rayfl.local_sgd).parameters)


def test_the_ctx_table_is_every_public_attribute_of_client_context() -> None:
    cls = rayfl.ClientContext
    public = [f.name for f in dataclasses.fields(cls)]
    public += [name for name, value in vars(cls).items() if not name.startswith("_")
               and (callable(value) or isinstance(value, property))]
    assert sorted(first_column("`ctx`: what the function sees")) == sorted(public)


def test_the_shared_keys_table_is_every_algorithm_config_key() -> None:
    keys = [f.name for f in dataclasses.fields(rayfl.AlgorithmConfig)]
    assert sorted(first_column("The shared keys to honour")) == sorted(keys)


def test_fedavgs_bytes_and_a_first_state_are_as_the_page_says() -> None:
    x = np.zeros((6, 2), dtype=np.float32)
    arrays = {"train_x": x, "train_y": np.zeros(6, dtype=np.int64), "test_x": x[:1], "test_y": np.zeros(1, dtype=np.int64)}
    host = ClientHostImpl(0, arrays, {0: np.arange(3), 1: np.arange(3, 6)}, None, ModelConfig(), (2,), 2, seed=0)
    assert host.states[1] == {}  # never run: empty
    d = 6  # the linear model on 2 features and 2 classes
    algorithm = rayfl.FedAvg(None, rayfl.FedAvgConfig(), RunConfig())
    payload = algorithm.payload(rayfl.ModelState(x=np.zeros(d, dtype=np.float32)), rayfl.Round(0, [0], 1))
    assert sorted(payload) == ["lr", "params", "prox_mu", "schedule", "weight_decay"]
    (rec,) = host.run(rayfl.fedavg_client, [0], 0, payload)
    text = PAGE.read_text()
    assert "4d + 40 bytes down" in text and "4d + 8 bytes up" in text
    assert (rec["bytes_down"], rec["bytes_up"]) == (4 * d + 40, 4 * d + 8)
