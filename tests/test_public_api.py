"""rayfl from Python: the public namespace, `rayfl.run` / `rayfl.resume` and what they
return, datasets handed in as objects (stored with the run, so resumable), entries registered
in a notebook's `__main__`, and a user's batched client twin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from guide_blocks import environment
from test_plugins import write_guide_package
from test_resume import assert_same_tables, sigterm_after

import rayfl
import rayfl.registry
from rayfl.engine.evaluation import evaluate_arrays
from rayfl.engine.runlog import RunInterrupted
from rayfl.models import get_flat
from rayfl.results import load

TINY = ["data.dataset=digits", "partition.method=iid", "partition.num_clients=8", "algorithm.clients_per_round=4",
        "run.rounds=3", "engine.num_hosts=1", "engine.num_cpus_per_host=0.5"]


def test_import_rayfl_is_cheap_and_every_public_name_resolves() -> None:
    code = "import sys, rayfl; print(sorted(m for m in ('torch', 'ray', 'pandas') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment())
    assert done.stdout.strip() == "[]"
    for name in rayfl.__all__:
        assert getattr(rayfl, name) is not None, name
    assert set(rayfl.__all__) <= set(dir(rayfl))
    with pytest.raises(AttributeError):
        rayfl.not_a_thing  # noqa: B018


def test_registering_twice_or_something_not_callable_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        rayfl.register_algorithm("fedavg", lambda fed, cfg, run: {})
    with pytest.raises(TypeError, match="not callable"):
        rayfl.register_model("three", 3)
    with pytest.raises(TypeError, match="is a class"):
        rayfl.register_dataset("a_class", dict)


def test_run_returns_its_tables_and_final_model(ray_local, tmp_path: Path) -> None:
    run = rayfl.run(None, [*TINY, f"output.dir={tmp_path}"])
    assert list(run.rounds["round"]) == [0, 1, 2] and len(run.clients) == 12
    assert run.config.algorithm.name == "fedavg" and run.summary["tasks_issued"] == 12
    net = run.model()
    ds = run._dataset
    again = evaluate_arrays(net, get_flat(net).numpy(), ds.test_x, ds.test_y, prefix="test_")
    assert again["test_accuracy"] == pytest.approx(run.rounds["test_accuracy"].iloc[-1], abs=1e-12)


def test_a_dataset_object_is_stored_with_the_run_and_resumes(ray_local, tmp_path: Path) -> None:
    """A dataset made in Python (not from the config) is kept beside the results, so a
    stopped run resumes without the code that made it, to the uninterrupted run's tables."""
    from rayfl.data import FederatedDataset

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    owner = np.arange(300) % 6
    fd = FederatedDataset("mine", 2, (5,), x[:240], y[:240], x[240:], y[240:],
                          [np.flatnonzero(owner[:240] == k) for k in range(6)])
    common = [*TINY, "partition.num_clients=6", "run.rounds=6", "output.checkpoint_every=2", f"output.dir={tmp_path}"]
    whole = rayfl.run(None, [*common, "run.run_id=whole"], dataset=fd)
    from rayfl.runner import run_experiment

    cfg = rayfl.load_config(None, [*common, "run.run_id=stopped"])
    with pytest.raises(RunInterrupted):
        run_experiment(cfg, dataset=fd, on_start=sigterm_after(3))
    stopped = tmp_path / "default" / "stopped"
    assert (stopped / "dataset.npz").is_file()
    resumed = rayfl.resume(stopped)
    assert resumed.summary["tasks_issued"] > 0 and resumed._dataset.name == "mine"
    assert_same_tables(load(whole.dir), load(stopped))
    with pytest.raises(rayfl.ConfigError, match="^dataset: a dataset handed in from Python must be"):
        rayfl.run(None, [*TINY, f"output.dir={tmp_path}"], dataset={"x": x})


@pytest.mark.slow
def test_entries_registered_in_a_notebooks_main_reach_every_host(tmp_path: Path) -> None:
    """Functions defined in `__main__` cannot be imported by a host: they travel by value."""
    script = (
        "import numpy as np, rayfl\n"
        "from torch import nn\n"
        "@rayfl.register_model('tiny_mlp')\n"
        "def tiny_mlp(input_shape, num_classes, width=7):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))\n"
        "@rayfl.register_partitioner('halves')\n"
        "def halves(labels, num_clients, cfg, rng):\n"
        "    return np.array_split(rng.permutation(len(labels)), num_clients)\n"
        "run = rayfl.run(None, ['data.dataset=digits', 'partition.method=halves', 'partition.num_clients=4',\n"
        "                       'model.name=tiny_mlp', 'model.kwargs={width: 9}', 'algorithm.clients_per_round=4',\n"
        "                       'run.rounds=2', 'engine.num_hosts=2', 'engine.pool=off', 'output.dir=results'])\n"
        "print('PARAMS', sum(p.numel() for p in run.model().parameters()), sorted(set(run.clients.host)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=environment(), capture_output=True,
                          text=True, timeout=300)
    assert "PARAMS 685 [0, 1]" in done.stdout, (done.stdout + done.stderr)[-3000:]  # 64*9+9 + 9*10+10


def forget_myfl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another test's copy of the guide's package may be imported in this process already, its
    directory on sys.path and among the roots rayfl added: all of it is put back afterwards."""
    for name in [m for m in sys.modules if m == "myfl" or m.startswith("myfl.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p or ".") / "myfl").is_dir()])
    monkeypatch.setattr(rayfl.registry, "_added_roots", [])


def test_a_job_elsewhere_names_a_package_beside_it_and_the_hosts_find_it(ray_local, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process on a running Ray: the job's directory is searched for `myfl`, and the hosts
    (fresh processes of that Ray) are told where it was found."""
    package = write_guide_package(tmp_path / "pkg")
    forget_myfl(monkeypatch)
    monkeypatch.chdir(tmp_path)
    run = rayfl.run(package / "job.yaml", ["run.rounds=2", f"data.path={package / 'femnist.parquet'}",
                                          f"output.dir={tmp_path / 'results'}", "engine.num_hosts=1"])
    assert len(run.rounds) == 2 and run.summary["host_failures"] == 0
    assert str(package) in [str(Path(p).resolve()) for p in rayfl.registry.added_roots()]


def test_a_users_batched_twin_runs_under_vectorize_and_matches_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = write_guide_package(tmp_path)
    forget_myfl(monkeypatch)
    monkeypatch.syspath_prepend(str(package))
    import myfl.feddyn as feddyn

    from rayfl.config import section_config
    from rayfl.data.federated import load_entry
    from rayfl.engine.host import ClientHostImpl
    from rayfl.engine.vectorized import batched_version

    data = load_entry(section_config("data", dataset="myfl.femnist:femnist", path=str(package / "femnist.parquet")), 0, None)
    arrays = {"train_x": data.x, "train_y": data.y}
    clients = {k: np.flatnonzero(data.groups == k)[: 10 + 3 * k] for k in range(4)}  # unequal sizes, unequal steps
    model = {"name": "myfl.cnn:lenet", "conv1": 2, "conv2": 3, "hidden": 8}
    twin = batched_version(feddyn.feddyn_client)
    calls = []
    monkeypatch.setattr(feddyn.feddyn_client, "__rayfl_batched__", lambda ctxs, kw: calls.append(len(ctxs)) or twin(ctxs, kw))
    x0 = rayfl.get_flat(rayfl.build_model(section_config("model", **model), (1, 28, 28), 62)).numpy()
    payload = {"params": x0, "lr": 0.1, "alpha": 0.05, "schedule": rayfl.LocalSchedule(8, 2, None)}
    out, hosts = {}, {}
    for mode in ("off", "on"):
        hosts[mode] = host = ClientHostImpl(0, arrays, clients, None, model, (1, 28, 28), 62, seed=3, vectorize=mode)
        for r in range(2):  # round 1 starts from the g_k round 0 left in each client's state
            out[mode] = host.run(feddyn.feddyn_client, list(clients), round=r, broadcast=payload)
    assert calls == [4, 4]  # the loop under "off", the twin once a round for the host's 4 clients under "on"
    for loop, vec in zip(out["off"], out["on"], strict=True):
        assert loop["local_steps"] == vec["local_steps"] > 0
        np.testing.assert_allclose(vec["values"]["delta"], loop["values"]["delta"], atol=2e-5)
    for k in clients:
        np.testing.assert_allclose(hosts["on"].states[k]["g"].numpy(), hosts["off"].states[k]["g"].numpy(), atol=1e-6)
    assert len({r["local_steps"] for r in out["off"]}) > 1
