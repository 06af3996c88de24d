"""The FL literature's workloads: LEAF's FEMNIST CNN and character LSTM, data shaped like
FEMNIST, CIFAR-10 and Shakespeare (`data.dataset: lookalike`), and their `rayfl bench`
workloads' reference loop doing exactly rayfl's client work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfl.algorithms.fedavg import fedavg_client
from rayfl.algorithms.local import LocalSchedule
from rayfl.bench.reference import initial_params, run_reference_loop, sample_clients
from rayfl.bench.workloads import WORKLOADS, workload_config
from rayfl.cli import build_parser
from rayfl.config import ConfigError, load_config, section_config
from rayfl.data import build_federated_dataset
from rayfl.engine.host import ClientHostImpl
from rayfl.models import build_model


def lookalike(like: str, clients: int, *extra: str):
    cfg = load_config(None, ["data.dataset=lookalike", f"data.like={like}", "partition.method=natural",
                             f"partition.num_clients={clients}", f"algorithm.clients_per_round={min(clients, 10)}", *extra])
    return cfg, build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)


def test_leaf_networks_have_the_papers_shapes_and_sizes():
    cnn = build_model(section_config("model", name="femnist_cnn"), (1, 28, 28), 62)
    # conv 1*32*25+32, conv 32*64*25+64, dense 3136*2048+2048, logits 2048*62+62
    assert sum(p.numel() for p in cnn.parameters()) == 832 + 51_264 + 6_424_576 + 127_038
    assert cnn(torch.zeros(3, 1, 28, 28)).shape == (3, 62)
    assert cnn(torch.zeros(3, 784)).shape == (3, 62)  # flat rows of a square image
    lstm = build_model(section_config("model", name="char_lstm"), (80,), 80)
    # embedding 80*8; LSTM layers 4*256*(8+256) + 2*4*256 and 4*256*(256+256) + 2*4*256; logits 256*80+80
    assert sum(p.numel() for p in lstm.parameters()) == 640 + 272_384 + 526_336 + 20_560
    assert lstm(torch.zeros(3, 80, dtype=torch.long)).shape == (3, 80)


def test_leaf_network_keys_are_checked_in_one_line():
    for bad, key in ((["model.name=femnist_cnn", "model.channels=[32]"], "model.channels"),
                     (["model.name=femnist_cnn", "model.dense=0"], "model.dense"),
                     (["model.name=char_lstm", "model.hidden=0"], "model.hidden")):
        with pytest.raises(ConfigError, match=key) as err:
            load_config(None, bad)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("like, shape, classes, dtype", [
    ("femnist", (1, 28, 28), 62, np.float32), ("cifar10", (3, 32, 32), 10, np.float32),
    ("shakespeare", (80,), 80, np.int64)])
def test_lookalike_data_have_the_real_shapes(like, shape, classes, dtype):
    _, ds = lookalike(like, 12)
    assert ds.input_shape == shape and ds.num_classes == classes and ds.train_x.dtype == dtype
    assert len(ds.client_train) == 12
    assert ds.train_y.min() >= 0 and ds.train_y.max() < classes
    if dtype == np.float32:
        assert ds.train_x.min() >= 0.0 and ds.train_x.max() <= 1.0
    else:
        assert ds.train_x.min() >= 0 and ds.train_x.max() < classes


def test_femnist_writers_have_femnist_sizes_and_a_client_does_not_depend_on_the_population():
    cfg, ds = lookalike("femnist", 400, "data.test_fraction=0.1")
    sizes = np.array([len(a) + len(b) for a, b in zip(ds.client_train, ds.client_test, strict=True)])
    assert 190 < sizes.mean() < 260 and sizes.min() >= 10  # FEMNIST: about 226 a writer
    _, few = lookalike("femnist", 3, "data.test_fraction=0.1")
    np.testing.assert_array_equal(few.train_x[few.client_train[2]], ds.train_x[ds.client_train[2]])
    _, again = lookalike("femnist", 3, "data.test_fraction=0.1", "run.seed=1")
    assert not np.array_equal(again.train_x[again.client_train[0]][:1], few.train_x[few.client_train[0]][:1])


@pytest.mark.parametrize("like", ["femnist", "cifar10", "shakespeare"])
def test_lookalike_pools_are_the_split_of_all_clients_drawn_in_a_row(like):
    """Drawn client by client into the two pools, the data equal the plain build: every
    client's rows drawn into one array in a row, then each client's last rows split off
    (rayfl.data.synthetic.clients_as_pool), rows, labels and owners alike."""
    from rayfl.data.lookalike import (
        SHAPES,
        LookalikeConfig,
        _images,
        _text,
        draw_shared,
        load_lookalike,
    )
    from rayfl.data.synthetic import clients_as_pool
    from rayfl.rng import numpy_rng

    cfg, seed, count = LookalikeConfig(like=like, test_fraction=0.3), 5, 17
    shape, classes, _ = SHAPES[like]
    mu, sigma, low, high = cfg.size_law()
    sizes = np.array([int(min(np.floor(numpy_rng(seed, "lookalike.size", client=k).lognormal(mu, sigma)) + low, high))
                      for k in range(count)])
    x = np.empty((int(sizes.sum()), *shape), dtype=np.int64 if like == "shakespeare" else np.float32)
    y = np.empty(int(sizes.sum()), dtype=np.int64)
    draw, shared, at = (_text if like == "shakespeare" else _images), draw_shared(like, shape, classes, seed), 0
    for k, n in enumerate(sizes):
        draw(numpy_rng(seed, "lookalike", client=k), shared, x[at:at + n], y[at:at + n])
        at += n
    for got, want in zip(load_lookalike(cfg, seed, count), clients_as_pool(x, y, sizes, 0.3, classes, f"lookalike({like})"),
                         strict=True):
        assert got.x.dtype == want.x.dtype and (got.name, got.num_groups) == (want.name, want.num_groups)
        for field in ("x", "y", "groups"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)


def test_lookalike_labels_are_learnable():
    """Images are class prototypes plus noise: the class means are far apart; text labels
    follow the bigram chain, so the last character predicts the next better than chance."""
    _, ds = lookalike("cifar10", 20)
    x, y = ds.train_x.reshape(len(ds.train_y), -1), ds.train_y
    means = np.stack([x[y == c].mean(0) for c in range(10)])
    nearest = np.argmin(((x[:500, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (nearest == y[:500]).mean() > 0.9
    _, text = lookalike("shakespeare", 30)
    last, nxt = text.train_x[:, -1], text.train_y
    table = np.zeros((80, 80))
    np.add.at(table, (last, nxt), 1)
    assert table.max(axis=1).sum() / len(nxt) > 3 / 80


def test_cifar_lookalike_pools_for_a_dirichlet_split():
    cfg = load_config(None, ["data.dataset=lookalike", "data.like=cifar10", "partition.method=dirichlet",
                             "partition.alpha=0.3", "partition.num_clients=10"])
    ds = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    assert len(ds.client_train) == 10 and sum(len(c) for c in ds.client_train) == 4000  # 10 x 500, 20% held out
    skew = [np.bincount(ds.train_y[c], minlength=10).max() / max(1, len(c)) for c in ds.client_train]
    assert np.median(skew) > 0.3  # Dirichlet 0.3: most of a client's samples in few classes


def test_bad_lookalike_keys_are_one_line():
    for bad, key in ((["data.like=mnist"], "data.like"), (["data.min_client_samples=1"], "data.min_client_samples"),
                     (["data.max_samples=10"], "data.max_samples")):
        with pytest.raises(ConfigError, match=key) as err:
            load_config(None, ["data.dataset=lookalike", *bad])
        assert "\n" not in str(err.value)


# ---------------------------------------------------------------- the benchmarks' reference loop

SMALL = {
    "femnist-cnn": ["partition.num_clients=6", "algorithm.clients_per_round=3", "model.channels=[2,3]", "model.dense=16", "algorithm.lr=0.1",
                    "data.max_client_samples=40"],
    "cifar-resnet": ["partition.num_clients=6", "algorithm.clients_per_round=3", "model.width=4",
                     "data.min_client_samples=30", "data.max_client_samples=30"],
    "shakespeare-lstm": ["partition.num_clients=6", "algorithm.clients_per_round=3", "model.hidden=8",
                         "data.max_client_samples=30"],
}
ROUNDS = 2


@pytest.mark.parametrize("name", sorted(SMALL))
def test_reference_loop_does_rayfls_client_work_on_the_literature_networks(name):
    """rayfl's FedAvg client on an in-process host (the loop path `auto` takes on a CPU),
    averaged like `run_fedavg`, reaches the reference loop's model to float32 rounding; the
    loop in float64 ends near both (the scale of that rounding)."""
    cfg = workload_config(name, ROUNDS, *SMALL[name])
    ds = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    ref = run_reference_loop(cfg, ds, ROUNDS)
    host = ClientHostImpl(0, {"train_x": ds.train_x, "train_y": ds.train_y}, dict(enumerate(ds.client_train)), None,
                          cfg.model, tuple(ds.input_shape), ds.num_classes, cfg.run.seed, vectorize="auto")
    sizes, alg = ds.client_sizes(), cfg.algorithm
    x = initial_params(cfg, ds)
    for r in range(ROUNDS):
        ids = sample_clients(cfg.run.seed, r, sizes, alg.clients_per_round)
        recs = host.run(fedavg_client, ids, r, {"params": x, "lr": alg.lr,
                                                "schedule": LocalSchedule(alg.batch_size, alg.local_epochs, None)})
        w = sizes[ids] / sizes[ids].sum()
        x = (x + sum(wi * rec["values"]["delta"].astype(np.float64) for wi, rec in zip(w, recs, strict=True))).astype(np.float32)
    assert np.abs(ref.final - initial_params(cfg, ds)).max() > 1e-3  # it trained
    np.testing.assert_allclose(x, ref.final, rtol=0, atol=1e-5)
    double = run_reference_loop(cfg, ds, ROUNDS, dtype=torch.float64)
    assert double.final.dtype == np.float64 and np.abs(double.final - ref.final).max() < 1e-4


def test_every_workload_has_a_bench_command_with_its_defaults():
    p = build_parser()
    for name, spec in WORKLOADS.items():
        args = p.parse_args(["bench", name])
        assert (args.rounds, args.vectorize, args.hosts) == (spec.rounds, list(spec.vectorize), list(spec.hosts))
        assert args.out == f"bench/{name}.json"
    assert p.parse_args(["bench", "femnist-cnn"]).vectorize == ["auto", "on", "off"]
    assert workload_config("cifar-resnet", 3).partition.method == "dirichlet"
