"""Bad configs fail before any work starts, naming the key; overrides and defaults work."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfl.config import ConfigError, load_config
from rayfl.sweep import load_base_config


def write_job(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


def test_default_config_is_the_default_job():
    cfg = load_config()
    assert cfg.data.dataset == "synthetic"
    assert cfg.partition.num_clients == 100
    assert cfg.algorithm.name == "fedavg"


def test_overrides_parse_yaml_values(tmp_path):
    job = write_job(tmp_path, "algorithm: {name: fedprox, mu: 0.1}\nmodel: {name: mlp}\n")
    cfg = load_config(job, ["algorithm.lr=0.2", "model.hidden=[16, 8]", "engine.num_hosts=3", "data.max_samples=null"])
    assert cfg.algorithm.name == "fedprox"
    assert cfg.algorithm.mu == 0.1
    assert cfg.algorithm.lr == 0.2
    assert cfg.model.hidden == [16, 8]
    assert cfg.engine.num_hosts == 3


def test_int_accepted_for_float_field():
    cfg = load_config(None, ["algorithm.lr=1"])
    assert isinstance(cfg.algorithm.lr, float)


@pytest.mark.parametrize(
    ("overrides", "key", "hint"),
    [
        (["algorithm.learning_rate=0.1"], "algorithm.learning_rate", "its keys are"),  # unknown key
        (["algorithm.lr=fast"], "algorithm.lr", "expected a number"),  # wrong type
        (["algorithm.name=fedsgdx"], "algorithm.name", "fedavg"),  # unknown algorithm
        (["data.dataset=imagenet"], "data.dataset", "mnist"),  # unknown dataset
        (["partition.num_clients=-5"], "partition.num_clients", "> 0"),  # negative count
        (["partition.method=dirichlet", "partition.alpha=0"], "partition.alpha", "> 0"),  # alpha <= 0
        (["run.rounds=2.5"], "run.rounds", "integer"),  # non-integer count
        (["engine.clients_per_host=many"], "engine.clients_per_host", "auto"),  # bad union
        (["algorithm.local_steps=5"], "algorithm.local_steps", "exactly one"),  # both set
        (["algorithm.clients_per_round=500"], "algorithm.clients_per_round", "num_clients"),
        (["training.lr=0.1"], "training", "allowed sections"),  # unknown section
        (["data.dataset=digits"], "partition.method", "natural"),  # natural needs synthetic
        (["data.dataset=mnist", "data.split=random"], "data.split", "pooled"),  # bad literal
        (["data.dataset=mnist", "partition.method=iid", "data.download=false", "data.data_dir=/nonexistent/x"], "data.data_dir", "does not exist"),
        (["algorithm.mu=-1", "algorithm.name=fedprox"], "algorithm.mu", ">= 0"),
        (["algorithm.name=fedbuff", "algorithm.server_as_client=true"], "algorithm.server_as_client", "asynchronous"),
    ],
)
def test_bad_values_name_the_key(overrides, key, hint):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert e.value.key == key
    assert hint in str(e.value)


def test_missing_job_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_unknown_key_in_file(tmp_path):
    job = write_job(tmp_path, "partition:\n  method: dirichlet\n  alhpa: 0.3\n")
    with pytest.raises(ConfigError) as e:
        load_config(job, ["data.dataset=digits"])
    assert e.value.key == "partition.alhpa"
    assert "alpha" in str(e.value)


def test_bad_config_fails_before_ray_starts(tmp_path, capsys):
    """The CLI reports the key and exits 2 without ever initialising Ray."""
    import ray

    from rayfl.cli import main

    was = ray.is_initialized()
    job = write_job(tmp_path, "algorithm:\n  name: fedavg\n  lr: -0.5\n")
    assert main(["run", str(job)]) == 2
    err = capsys.readouterr().err
    assert "algorithm.lr" in err
    assert ray.is_initialized() == was


def test_shipped_jobs_validate():
    jobs = sorted((Path(__file__).resolve().parents[1] / "jobs").glob("*.yaml"))
    assert jobs, "no jobs/*.yaml shipped"
    for job in jobs:  # the data dir may be absent on a user machine; sweep jobs hold a base job
        load_base_config(job, ["data.download=true"])


@pytest.mark.parametrize(
    "text", [".nan", ".inf", "-.inf", ".NaN", "nan", "inf", "'-inf'", "Infinity"]
)
@pytest.mark.parametrize(
    ("prefix", "key"),
    [
        ([], "algorithm.lr"),
        ([], "algorithm.weight_decay"),
        (["algorithm.name=fedprox"], "algorithm.mu"),  # an algorithm subclass's own field
        (["algorithm.name=zo_hfl"], "algorithm.eta"),
        (["algorithm.clients_per_round=null"], "algorithm.participation"),  # float | None
        ([], "data.test_fraction"),
        (["partition.method=dirichlet"], "partition.alpha"),  # a partitioner's own field
        ([], "engine.num_cpus_per_host"),
        ([], "system.speed"),  # a bare number for a Distribution
        ([], "system.latency.sigma"),  # inside the nested Distribution
        (["system.policy=deadline"], "system.deadline"),
    ],
)
def test_non_finite_floats_are_rejected_naming_the_key(prefix, key, text):
    with pytest.raises(ConfigError) as e:
        load_config(None, [*prefix, f"{key}={text}"])
    assert e.value.key == key
    assert "finite" in str(e.value)


def test_non_finite_float_in_a_job_file(tmp_path):
    job = write_job(tmp_path, "algorithm:\n  name: fedprox\n  mu: .nan\n")
    with pytest.raises(ConfigError) as e:
        load_config(job)
    assert e.value.key == "algorithm.mu"


def test_participation_and_clients_per_round():
    assert load_config().algorithm.clients_per_round == 10  # neither: 10 clients per round
    cfg = load_config(None, ["algorithm.participation=0.3"])  # only participation: a fraction
    assert (cfg.algorithm.participation, cfg.algorithm.clients_per_round) == (0.3, None)
    cfg = load_config(None, ["algorithm.clients_per_round=null"])  # null counts as not given
    assert cfg.algorithm.clients_per_round == 10
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.participation=0.3", "algorithm.clients_per_round=5"])
    assert e.value.key == "algorithm.participation" and "clients_per_round" in str(e.value)


def test_both_participation_and_clients_per_round_in_a_job(tmp_path):
    job = write_job(tmp_path, "algorithm: {clients_per_round: 10, participation: 0.5}\n")
    with pytest.raises(ConfigError, match="both"):
        load_config(job)
    default_job = Path(__file__).resolve().parents[1] / "jobs" / "default.yaml"
    with pytest.raises(ConfigError, match="clients_per_round=null"):  # a --set on top of a job
        load_config(default_job, ["algorithm.participation=0.5"])
    both = ["algorithm.participation=0.5", "algorithm.clients_per_round=null"]
    assert load_config(default_job, both).algorithm.participation == 0.5


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model.name=mlp", "model.hidden=[]"], "model.hidden"),
        (["model.name=relu1", "model.hidden=[]"], "model.hidden"),
        (["engine.start_timeout=0"], "engine.start_timeout"),
        (["run.run_id=a/b"], "run.run_id"),
        (["run.run_id=.."], "run.run_id"),
    ],
)
def test_more_bad_values(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert e.value.key == key


def test_linear_model_needs_no_hidden_width():
    cfg = load_config()  # the default model is linear: its config has no hidden width at all
    assert cfg.model.name == "linear" and not hasattr(cfg.model, "hidden")
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.hidden=[]"])
    assert e.value.key == "model.hidden" and "unknown key of model 'linear'" in str(e.value)
    with pytest.raises(ConfigError, match="needs a hidden width") as e:  # an mlp does need one
        load_config(None, ["model.name=mlp", "model.hidden=[]"])
    assert e.value.key == "model.hidden"


def test_yaml_errors_are_one_line(tmp_path):
    job = write_job(tmp_path, "algorithm: {name: fedavg\nrun:\n  rounds: [1\n")
    with pytest.raises(ConfigError) as e:
        load_config(job)
    assert e.value.key == "job" and str(job) in str(e.value) and "\n" not in str(e.value)
    assert "line" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.lr=[1"])
    assert e.value.key == "algorithm.lr" and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="is not a file"):
        load_config(tmp_path)


def test_data_dir_comes_from_rayfl_data_dir_unless_the_job_names_one(tmp_path, monkeypatch):
    """RAYFL_DATA_DIR is the one setting that points jobs at an offline copy: it fills in a
    job's missing data.data_dir, made absolute (sweep trials and hosts run elsewhere), and a
    data_dir the job names still wins."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAYFL_DATA_DIR", "offline")
    assert load_config().data.data_dir == str(tmp_path / "offline")
    assert load_config(None, ["data.data_dir=/elsewhere"]).data.data_dir == "/elsewhere"
    monkeypatch.delenv("RAYFL_DATA_DIR")
    assert load_config().data.data_dir == "~/.rayfl/data"


def test_jobs_name_no_data_directory_of_their_own():
    """Jobs leave data.data_dir out, so a clone runs them against ~/.rayfl/data (downloading)
    or RAYFL_DATA_DIR, and none points at a copy outside the repository."""
    import yaml

    jobs = sorted((Path(__file__).resolve().parents[1] / "jobs").rglob("*.yaml"))
    assert len(jobs) > 30
    naming = [str(j) for j in jobs if "data_dir" in ((yaml.safe_load(j.read_text()) or {}).get("data") or {})]
    assert naming == []
