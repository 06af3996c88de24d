"""A host's memory over a pre-aggregated call follows the model, not its clients
(rayfl.engine.partials): beyond `engine.clients_per_chunk` clients it keeps partial sums, not one
output per client, and any sum it is asked for has the bits of the held outputs' sum."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from host_fixtures import sized_host

from rayfl.algorithms.fedavg import fedavg_client
from rayfl.algorithms.local import LocalSchedule
from rayfl.config import ConfigError, load_config, section_config
from rayfl.engine.exact_sum import PRESUM, common_exponent, fixed_point_sum, max_abs
from rayfl.engine.partials import Expected

FEATURES, CLASSES, SEED = 64, 10, 5
MODEL = section_config("model", name="mlp", hidden=[4096, 256])  # 1.3M parameters: 5.3 MB a copy
ROWS = 16  # a client's rows: two local steps of 8
STATUS = Path("/proc/self/status")


def host(clients: int, chunk: int | str, vectorize: str = "off"):
    return sized_host(dict.fromkeys(range(clients), ROWS), FEATURES, CLASSES, MODEL, SEED, 0.0, vectorize,
                      device="cpu", clients_per_chunk=chunk)


def model_bytes(h) -> int:
    return sum(p.numel() * p.element_size() for p in h.model.parameters())


def broadcast(h) -> dict:
    params = np.concatenate([p.detach().numpy().ravel() for p in h.model.parameters()]).astype(np.float32)
    return {"params": params, "lr": 0.1, "prox_mu": 0.0, "schedule": LocalSchedule(8, 1, None)}


def call(h, ids: list[int], round: int, payload: dict, exponent: int | None = None) -> list[dict]:
    """One FedAvg call keeping `delta`, with the weights of every client accepted (task id = client)."""
    weights = {c: 1.0 / len(ids) for c in ids}
    return h.run(fedavg_client, ids, round, payload, task_ids={c: c for c in ids}, keep=("delta",),
                 presum={"delta": Expected(exponent, weights, 1.0)})


def grid(records: list[dict], weights: dict[int, float]) -> int:
    return common_exponent(list(weights.values()), [max_abs(r["values"]["delta"]) for r in records if r["client"] in weights])


def rss_kb(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", STATUS.read_text()).group(1))


def peak_growth(h, ids: list[int], round: int, payload: dict) -> int:
    """Bytes the process's resident peak rose above its resident size over one call and its sum
    (the kernel's high-water mark, reset first; freed heap stays resident: retain_freed_memory)."""
    Path("/proc/self/clear_refs").write_text("5")
    before = rss_kb("VmRSS")
    records = call(h, ids, round, payload)
    weights = {c: 1.0 / len(ids) for c in ids}
    h.reduce("delta", weights, grid(records, weights))
    return (rss_kb("VmHWM") - before) * 1024


@pytest.mark.skipif(not STATUS.exists(), reason="needs Linux's /proc")
def test_a_hosts_peak_memory_does_not_grow_with_its_clients():
    """4 then 16 clients on a host of chunks of 2: the 16-client call's peak is no more than
    a few model copies above the 4-client call's (holding every output it would be 12 more)."""
    h = host(16, chunk=2)
    payload = broadcast(h)
    size = model_bytes(h)
    peak_growth(h, [0, 1, 2, 3], 0, payload)  # warm-up: torch's and the sums' first allocations
    few = peak_growth(h, [0, 1, 2, 3], 1, payload)
    many = peak_growth(h, list(range(16)), 2, payload)
    assert many - few < 3 * size, (few / size, many / size)


@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_partial_sums_and_replays_give_the_held_outputs_bits(vectorize):
    """A call of 6 clients on chunks of 2 keeps no output: the sum with every client's weight
    comes from its partial sums (on the guessed grid or a neighbour), a sum without client 3
    (dropped) from running the call again; both the bits of the sum of the held outputs."""
    held, chunked = host(6, "auto", vectorize), host(6, 2, vectorize)
    payload = broadcast(held)
    ids = list(range(6))
    records = call(held, ids, 0, payload)
    outputs = {r["client"]: held.partials.values[r["client"]]["delta"] for r in records}
    all_in = {c: 1.0 / 6 for c in ids}
    dropped = {c: 1.0 / 5 for c in ids if c != 3}
    chunked_records = call(chunked, ids, 0, payload)
    assert chunked.partials.values == {}  # nothing held beyond a chunk
    assert PRESUM not in chunked_records[0]  # its partial sums stay on the host for `reduce`
    for weights in (all_in, dropped):
        e = grid(records, weights)
        want = fixed_point_sum([(outputs[c], w) for c, w in sorted(weights.items())], e, outputs[0].shape)
        made = e in chunked.partials.sums.get("delta", {})
        assert made == (weights is all_in)  # the guessed grids hold the sum of all; the dropped client's is run again
        np.testing.assert_array_equal(chunked.reduce("delta", weights, e), want)
    one = chunked.reduce("delta", {4: 0.5}, None)  # a sum of one term: float64(v) * w
    np.testing.assert_array_equal(one, np.multiply(outputs[4], 0.5, dtype=np.float64))


def test_clients_per_chunk_is_validated():
    with pytest.raises(ConfigError, match="engine.clients_per_chunk"):
        load_config(None, ["engine.clients_per_chunk=0"])
