"""Typed, validated experiment configuration.

A job is a YAML file with one mapping per section (run, data, partition, model, algorithm,
engine, system, output). Every section is a dataclass; unknown keys, wrong types and bad values
raise `ConfigError` naming the dotted key and the allowed values *before* the run joins Ray, so
a typo never costs a cluster allocation.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Union, get_args, get_origin

import yaml

from rayfl.checks import choice as _choice
from rayfl.checks import fraction as _fraction
from rayfl.checks import non_negative as _non_negative
from rayfl.checks import positive as _positive
from rayfl.checks import positive_float as _positive_float
from rayfl.errors import ConfigError


class _NotFinite(ConfigError):
    """A NaN or infinite number: reported as such even where a union (`float | None`) would
    otherwise fall back to the generic "expected float or null"."""


DEFAULT_CLIENTS_PER_ROUND = 10


@dataclass
class RunConfig:
    """What to run and for how long."""

    # The experiment's name (no '/'): results go under `<output.dir>/<experiment>/`.
    experiment: str = "default"
    # The seed every random stream of the run derives from (sampling, local minibatches, noise); the
    # data split too unless data.seed is set. Integer >= 0.
    seed: int = 0
    # Server rounds to run (> 0); asynchronous algorithms count server steps.
    rounds: int = 50
    # Evaluate the global model every this many rounds (> 0), and always after the last one.
    eval_every: int = 1
    # The run's directory name under the experiment; null: `<algorithm>-s<seed>-<time>-<pid>`. A
    # taken one is an error unless output.overwrite.
    run_id: str | None = None

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        _positive("run.rounds", self.rounds)
        _positive("run.eval_every", self.eval_every)
        _non_negative("run.seed", self.seed)
        if not self.experiment or "/" in self.experiment:
            raise ConfigError("run.experiment", "must be a non-empty name without '/'")
        rid = self.run_id
        if rid is not None and (not rid or "/" in rid or rid in (".", "..")):
            raise ConfigError("run.run_id", f"must be a name without '/' (or null), got {rid!r}")


@dataclass
class DataConfig:
    """Fields every dataset shares; `dataset` picks the entry (rayfl.registry.DATASETS), whose
    own config class (a subclass of this one) adds its keys, e.g. synthetic's `alpha`.

    A dataset that is a pool of samples is split into train and test with `test_fraction`
    unless it has its own test set, capped at `max_samples` first (seeded), and partitioned
    across clients by `partition.method`; `server_fraction` of the training pool goes to the
    server first. `seed` fixes the data split and partition (null: run.seed), so run.seed can
    vary the training randomness on one split (FFGG's Table 1 pipeline chains runs that way)."""

    # The dataset entry: a registered name or 'package.module:attr'. Its own keys: rayfl config
    # data=NAME.
    dataset: str = "synthetic"
    # Where downloaded or stored files are looked for and written (~ expanded; a relative path is
    # made absolute against the working directory). A job that leaves it out gets $RAYFL_DATA_DIR
    # when that environment variable is set (an offline copy), else ~/.rayfl/data.
    data_dir: str = "~/.rayfl/data"
    # Download missing files into data_dir; false: a missing file is an error naming what to fetch.
    download: bool = True
    # Fraction of a pool dataset held out as the global test set, in [0, 1); datasets with their own
    # test split ignore it.
    test_fraction: float = 0.2
    # Fraction of the training pool given to the server before partitioning, in [0, 1) (ZO-HFL's
    # server data; server_as_client).
    server_fraction: float = 0.0
    # Cap the pool at this many samples (a seeded subset) before splitting; null: all of it.
    max_samples: int | None = None
    # Seed of the data split and partition; null: run.seed. Fixing it lets run.seed vary training
    # randomness on one split.
    seed: int | None = None

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        if self.seed is not None:
            _non_negative("data.seed", self.seed)
        _fraction("data.test_fraction", self.test_fraction, open_right=True)
        if not 0.0 <= self.server_fraction < 1.0:
            raise ConfigError("data.server_fraction", f"must be in [0, 1), got {self.server_fraction}")
        if self.max_samples is not None:
            _positive("data.max_samples", self.max_samples)

    def has_own_clients(self) -> bool:
        """Whether the dataset comes with its own clients (`partition.method: natural`)."""
        return False

    def splittable(self) -> bool:
        """Whether the dataset is a pool a partitioner can split (else only its own clients)."""
        return True

    def has_labels(self) -> bool:
        """Whether the rows carry class labels (a data attack, label flipping, needs them)."""
        return True

    def planned_clients(self, partition: PartitionConfig) -> int | None:
        """The client count the config alone gives (None: known once the data are loaded)."""
        return None if partition.keeps_dataset_clients else partition.num_clients

    def check_partition(self, partition: PartitionConfig) -> None:
        """Whether `partition` can split this dataset: `natural` needs its own clients, a
        partitioner a pool to split."""
        if partition.keeps_dataset_clients and not self.has_own_clients():
            raise ConfigError(
                "partition.method",
                f"{partition.method!r} keeps a dataset's own clients, and {self.dataset!r} has none "
                "(a file dataset gets them from its client column: data.client_column, or data.client_key for npz); "
                "choose a partitioner, e.g. iid or dirichlet",
            )
        if not partition.keeps_dataset_clients and not self.splittable():
            raise ConfigError(
                "partition.method",
                f"{self.dataset!r} comes with its own clients and is not split by a partitioner; use partition.method: natural",
            )

    def generated_by_rayfl(self) -> bool:
        """Whether rayfl.data's own code makes the rows from this config alone, so a built
        dataset may be cached under a key of the config and that code (rayfl.data.cache)."""
        return False


def _check_entry_kwargs(section: str, name: str, positional: int, kwargs: dict[str, Any]) -> None:
    """`kwargs` of an entry registered without a config class, against its callable's keywords
    (after its `positional` parameters)."""
    from rayfl.registry import BY_SECTION, check_kwargs

    check_kwargs(f"{section}.kwargs", BY_SECTION[section].get(name).load(), positional, kwargs)


@dataclass
class GenericDataConfig(DataConfig):
    """The config of a dataset registered without a config class of its own: `kwargs` are
    handed to its loader as keyword arguments."""

    # Keyword arguments handed to the loader of a dataset registered without a config class (checked
    # against its signature).
    kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        super().validate()
        _check_entry_kwargs("data", self.dataset, 2, self.kwargs)


@dataclass
class PartitionConfig:
    """How the training pool is split across clients; `method` picks the partitioner
    (rayfl.registry.PARTITIONERS), whose own config class adds its keys (dirichlet's `alpha`).

    `num_clients` clients (with `natural`, how many the dataset generates or keeps: null keeps
    all of a dataset's own clients). `client_test: proportional` splits the test set across
    clients with each client's label mix, `equal` gives each `client_test_size` IID test
    samples (null: pool // clients), for methods that evaluate personalized models."""

    # The partitioner entry: natural keeps a dataset's own clients, the others split the pool (iid,
    # dirichlet, shards, ...). Its own keys: rayfl config partition=NAME.
    method: str = "natural"
    # Clients to split the pool into (> 0); with natural, how many of the dataset's own clients to
    # keep or generate (null: all).
    num_clients: int | None = 100
    # Per-client test sets for personalized evaluation: none; proportional (the test set split with
    # each client's label mix); equal (client_test_size IID samples each).
    client_test: Literal["none", "proportional", "equal"] = "none"
    # Test samples per client with client_test: equal; null: the test pool // number of clients.
    client_test_size: int | None = None
    # The dataset's own clients are kept (natural), not a split of its pool.
    keeps_dataset_clients: ClassVar[bool] = False

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        if self.client_test_size is not None:
            _positive("partition.client_test_size", self.client_test_size)
        if self.num_clients is None and not self.keeps_dataset_clients:
            raise ConfigError("partition.num_clients", f"partitioner {self.method!r} needs a number of clients")
        if self.num_clients is not None:
            _positive("partition.num_clients", self.num_clients)


@dataclass
class GenericPartitionConfig(PartitionConfig):
    """The config of a partitioner registered without a config class of its own: `kwargs` are
    handed to it as keyword arguments."""

    # Keyword arguments handed to a partitioner registered without a config class (checked against
    # its signature).
    kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        super().validate()
        _check_entry_kwargs("partition", self.method, 4, self.kwargs)


@dataclass
class ModelConfig:
    """Fields every model shares; `name` picks the entry (rayfl.registry.MODELS), whose own
    config class adds its keys (resnet18's `width`), handed to its factory as keyword arguments.
    Parameters travel as one flat float32 vector.

    `adapter: lora` adds rank-`adapter_rank` adapters to the network's weight matrices
    (rayfl.models.adapters), starting as the identity edit; `residual` (Pillutla et al. 2022)
    exists for models that build adapters themselves (resnet18, transformer). `init_from`
    starts from other parameters instead of a fresh init: a .npy flat vector, or a run directory
    (its checkpoint's model, matched by parameter name; rayfl.models.init_from)."""

    # The model entry: a registered name or 'package.module:attr'. Its own keys: rayfl config
    # model=NAME.
    name: str = "linear"
    # Parameter-efficient fine-tuning: none; lora (rank-adapter_rank adapters on weight matrices,
    # starting as the identity edit); residual (for models that build adapters themselves: resnet18,
    # transformer).
    adapter: Literal["none", "residual", "lora"] = "none"
    # Rank of each LoRA / residual adapter (> 0); read only when adapter is not none.
    adapter_rank: int = 16
    # Start from other parameters instead of a fresh init: a .npy flat vector, or a run directory
    # (its checkpoint's model, matched by parameter name); null: a fresh seeded init.
    init_from: str | None = None
    # The factory takes `adapter` and `adapter_rank` itself (else LoRA is added around it).
    builds_adapters: ClassVar[bool] = False

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        _positive("model.adapter_rank", self.adapter_rank)
        if self.adapter == "residual" and not self.builds_adapters:
            raise ConfigError("model.adapter", f"residual adapters exist for models that build them (resnet18, transformer), not {self.name!r}")
        if self.init_from is not None and not self.init_from:
            raise ConfigError("model.init_from", "must be a path (or null)")

    def factory_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the model's factory: this class's own fields (and the
        adapter's, for a model that builds them), or `kwargs` for a generic model."""
        base = {f.name for f in dataclasses.fields(ModelConfig)}
        if self.builds_adapters:
            base -= {"adapter", "adapter_rank"}
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in base}
        return dict(own.pop("kwargs", {}), **own)


@dataclass
class GenericModelConfig(ModelConfig):
    """The config of a model registered without a config class of its own: `kwargs` are handed
    to its factory as keyword arguments."""

    # Keyword arguments handed to the factory of a model registered without a config class (checked
    # against its signature).
    kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        super().validate()
        _check_entry_kwargs("model", self.name, 2, self.kwargs)


@dataclass
class AlgorithmConfig:
    """Fields every algorithm shares. Each algorithm subclasses this with its own
    hyper-parameters (see `rayfl.algorithms`); `name` picks the subclass."""

    # The algorithm entry: a registered name or 'package.module:attr'. Its own keys: rayfl config
    # algorithm=NAME.
    name: str = "fedavg"
    # Clients sampled uniformly per round (> 0, at most partition.num_clients). Set this or
    # participation, the other null; neither gives 10.
    clients_per_round: int | None = None
    # Fraction of all clients sampled per round, in (0, 1] (rounded half up, at least 1); null:
    # clients_per_round is used.
    participation: float | None = None
    # Passes over its data each sampled client makes per round (> 0). Set exactly one of
    # local_epochs and local_steps, the other null.
    local_epochs: int | None = 1
    # Minibatch steps each sampled client takes per round (>= 0), whatever its data size; null:
    # local_epochs is used.
    local_steps: int | None = None
    # Samples per local minibatch (> 0); a client with fewer uses all it has.
    batch_size: int = 32
    # The clients' local SGD step size (> 0).
    lr: float = 0.05
    # L2 penalty coefficient added to the local gradient (wd * w), >= 0.
    weight_decay: float = 0.0
    # A client answer with NaN / Inf is never applied: `drop` logs it (outcome nonfinite) and
    # goes on, `fail` stops the run.
    nonfinite: Literal["drop", "fail"] = "drop"
    # The keys of a client's answer that are model-shaped and only ever averaged by the server
    # (FedAvg's "delta"): what the round pipeline (privacy, compression, robust) transforms.
    # An algorithm declares them on its config class; none means the pipeline refuses it.
    uploads: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        # Resolved here, not as the field default, so that a job giving only `participation`
        # samples a fraction, while one giving both is caught by validate().
        if self.clients_per_round is None and self.participation is None:
            self.clients_per_round = DEFAULT_CLIENTS_PER_ROUND

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        if self.clients_per_round is not None and self.participation is not None:
            raise ConfigError(
                "algorithm.participation",
                f"both algorithm.participation={self.participation} and "
                f"algorithm.clients_per_round={self.clients_per_round} are set; keep one and set "
                "the other to null (e.g. --set algorithm.clients_per_round=null for a fraction)",
            )
        if self.clients_per_round is not None:
            _positive("algorithm.clients_per_round", self.clients_per_round)
        if self.participation is not None:
            _fraction("algorithm.participation", self.participation, open_left=True)
        if (self.local_epochs is None) == (self.local_steps is None):
            raise ConfigError("algorithm.local_steps", "set exactly one of local_epochs and local_steps (the other to null)")
        if self.local_epochs is not None:
            _positive("algorithm.local_epochs", self.local_epochs)
        if self.local_steps is not None:
            _non_negative("algorithm.local_steps", self.local_steps)
        _positive("algorithm.batch_size", self.batch_size)
        _positive_float("algorithm.lr", self.lr)
        _non_negative("algorithm.weight_decay", self.weight_decay)


@dataclass
class CallbackConfig:
    """Fields every callback shares. Each callback subclasses this with its own settings (see
    `rayfl.callbacks`); `name` picks it: a registered name or an import path."""

    # The callback entry: a registered name or 'package.module:attr'. Its own keys: rayfl config
    # callbacks=NAME.
    name: str = ""

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("callbacks.name", "must name a callback (a registered name or 'package.module:attr')")


@dataclass
class GenericCallbackConfig(CallbackConfig):
    """The config of a callback registered without a config class of its own: its factory
    gets `kwargs` as keyword arguments."""

    # Keyword arguments handed to the factory of a callback registered without a config class.
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenericAlgorithmConfig(AlgorithmConfig):
    """The config of a server loop registered without a config class of its own: it reads
    its own settings from `kwargs`."""

    # Settings handed to a server loop registered without a config class, which reads them itself.
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineConfig:
    """How clients are placed on Ray. `clients_per_host: auto` packs clients into one host per
    `num_cpus_per_host` CPUs (or per GPU fraction); `1` gives one actor per client."""

    # The Ray to join ('auto', or 'ray://host:10001'); null: RAY_ADDRESS, else a local Ray started
    # for the run.
    address: str | None = None
    # Host actors to start, each holding a share of the clients; null: from clients_per_host, else
    # one per num_cpus_per_host CPUs (or GPU share) of the cluster.
    num_hosts: int | None = None
    # Clients per host actor (an integer > 0), or auto: hosts are sized from the cluster's CPUs (or
    # GPUs) and the clients split evenly; ignored when num_hosts is set.
    clients_per_host: int | Literal["auto"] = "auto"
    # CPUs Ray reserves for each host actor (>= 0; fractions allowed); with auto placement, one host
    # per this many CPUs.
    num_cpus_per_host: float = 1.0
    # GPUs Ray reserves for each host (>= 0; 0.25 lets four hosts share one GPU); > 0 puts the
    # clients' work on the GPU with device auto.
    num_gpus_per_host: float = 0.0
    # torch intra-op threads in each host process (> 0); keep it at most num_cpus_per_host.
    torch_threads: int = 1
    # Where clients compute: auto (the GPU where Ray gave the host a share, num_gpus_per_host > 0,
    # else the CPU), cpu or cuda.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Hosts replaced per run (>= 0) after one dies or hangs past task_timeout: its clients' state
    # comes back from the last checkpoint plus the tasks accepted since, its unfinished tasks re-run
    # with the same seeds; one more failure fails the run.
    max_restarts: int = 3
    # Wall seconds a host may take on one call before it counts as hung and is replaced (> 0); null:
    # no limit.
    task_timeout: float | None = None
    # Seconds to wait for every host to start before failing with what was asked and what the
    # cluster has (an autoscaler may need minutes to add nodes: raise it there).
    start_timeout: float = 120.0
    # Fault injection for soak tests: kill a seeded-random host after every this many launched
    # client tasks (0: never).
    kill_host_every: int = 0
    # Run a host's clients of one call as one batch (rayfl.engine.vectorized) where the algorithm
    # offers a batched client function: auto where it pays (rayfl's MLP / linear kernel, other
    # networks on a GPU), on, or off (the plain loop; equal to float32 tolerance).
    vectorize: Literal["auto", "on", "off"] = "auto"
    # Most clients a host holds model-sized outputs of at once (an integer > 0), or auto: as many as
    # 1 GiB holds at two copies of the model each (6 for a 19.2M-parameter MLP; any call of rayfl's
    # small models). A batched call runs in chunks of this many clients, and a pre-aggregated call
    # of more keeps partial sums instead of its outputs, so a host's memory follows the model, not
    # its cohort (rayfl bench memory). The same results for any value.
    clients_per_chunk: int | Literal["auto"] = "auto"
    # Train 2-D convolutions with channels-last weights in rayfl.local_sgd's client loop
    # (rayfl.models.channels_last): auto on a CPU where the model runs that way (1.1-1.2x a
    # convnet's round), on (also on a GPU; an error for a model that cannot), or off (PyTorch's
    # NCHW). The same parameters, with bits that differ from NCHW's by float32 rounding and are the
    # same on every host layout.
    channels_last: Literal["auto", "on", "off"] = "auto"
    # auto spreads a call's clients over the hosts by expected work (rayfl.engine.balance; stateless
    # client functions: FedAvg, FedProx), so rounds of few unequal clients end sooner; off runs each
    # on its own host. The same results either way.
    balance: Literal["auto", "off"] = "auto"
    # Hosts send one exact partial sum (rayfl.engine.exact_sum) of what the server only sums
    # (FedAvg's and SCAFFOLD's deltas) instead of one vector per client: the same bits as off. auto
    # is on unless a robust aggregator needs every update.
    preaggregate: Literal["auto", "on", "off"] = "auto"
    # Warm hosts (rayfl.engine.pool, `rayfl pool start` on a running head): `auto` leases the
    # joined Ray's idle pooled hosts instead of starting fresh ones (CPU hosts only; the same
    # results), `off` always starts fresh hosts.
    pool: Literal["auto", "off"] = "auto"

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        _choice("engine.vectorize", self.vectorize, ("auto", "on", "off"))
        _choice("engine.channels_last", self.channels_last, ("auto", "on", "off"))
        _choice("engine.pool", self.pool, ("auto", "off"))
        _choice("engine.balance", self.balance, ("auto", "off"))
        _choice("engine.preaggregate", self.preaggregate, ("auto", "on", "off"))
        if self.num_hosts is not None:
            _positive("engine.num_hosts", self.num_hosts)
        if self.clients_per_host != "auto":
            _positive("engine.clients_per_host", self.clients_per_host)
        if self.clients_per_chunk != "auto":
            _positive("engine.clients_per_chunk", self.clients_per_chunk)
        if self.num_cpus_per_host < 0:
            raise ConfigError("engine.num_cpus_per_host", "must be >= 0")
        if self.num_gpus_per_host < 0:
            raise ConfigError("engine.num_gpus_per_host", "must be >= 0 (fractions like 0.25 share a GPU)")
        _positive("engine.torch_threads", self.torch_threads)
        _non_negative("engine.max_restarts", self.max_restarts)
        if self.task_timeout is not None:
            _positive_float("engine.task_timeout", self.task_timeout)
        _positive_float("engine.start_timeout", self.start_timeout)
        _non_negative("engine.kill_host_every", self.kill_host_every)


@dataclass
class Distribution:
    """A seeded per-client distribution. `value` is the constant, the lognormal median, the
    Pareto minimum, or the maximum of `inverse_pareto` (value / Pareto draw: for speeds, heavy-
    tailed slowdowns, so task durations get a Pareto tail: the straggler model); `sigma` the
    lognormal log-std; `shape` the Pareto tail index (heavier for smaller shape, infinite
    variance below 2); `low`/`high` scale a uniform; `tiers` draws one of `values` with
    probabilities `probs`. In YAML a bare number means a constant."""

    # The distribution each client's value is drawn from once, seeded: constant; uniform (value *
    # U(low, high)); lognormal (median value); pareto (minimum value, heavy right tail);
    # inverse_pareto (value / Pareto draw: at most value, a heavy tail of slow clients); tiers.
    dist: Literal["constant", "uniform", "lognormal", "pareto", "inverse_pareto", "tiers"] = "constant"
    # The constant, the lognormal median, the Pareto minimum or the inverse_pareto maximum (> 0), in
    # the field's units.
    value: float = 1.0
    # lognormal only: the log-space standard deviation (>= 0).
    sigma: float = 0.5
    # pareto and inverse_pareto only: the tail index (> 0); smaller is heavier, infinite variance
    # below 2.
    shape: float = 1.5
    # uniform only: the lower factor on value (0 < low <= high).
    low: float = 0.5
    # uniform only: the upper factor on value.
    high: float = 1.5
    # tiers only: the values a client may get (each > 0), one per tier.
    values: list[float] = field(default_factory=list)
    # tiers only: each tier's probability (>= 0, summing to 1; as many as values).
    probs: list[float] = field(default_factory=list)

    def validate_as(self, key: str) -> None:
        if not self.value > 0:
            raise ConfigError(f"{key}.value", f"must be > 0, got {self.value}")
        if self.dist == "lognormal" and self.sigma < 0:
            raise ConfigError(f"{key}.sigma", f"must be >= 0, got {self.sigma}")
        if self.dist in ("pareto", "inverse_pareto") and not self.shape > 0:
            raise ConfigError(f"{key}.shape", f"the Pareto tail index must be > 0, got {self.shape}")
        if self.dist == "uniform" and not 0 < self.low <= self.high:
            raise ConfigError(f"{key}.low", f"need 0 < low <= high, got low={self.low}, high={self.high}")
        if self.dist == "tiers":
            if not self.values or len(self.values) != len(self.probs):
                raise ConfigError(f"{key}.values", "tiers need `values` and `probs` of equal, non-zero length")
            if any(v <= 0 for v in self.values):
                raise ConfigError(f"{key}.values", "tier values must be > 0")
            if any(p < 0 for p in self.probs) or abs(sum(self.probs) - 1.0) > 1e-6:
                raise ConfigError(f"{key}.probs", f"must be >= 0 and sum to 1, got {self.probs}")


def constant(value: float) -> Distribution:
    return Distribution("constant", value)


@dataclass
class Tier:
    """Explicit tier: each client falls in it with probability `fraction` and has its speed
    multiplied by `speed_factor` (e.g. fraction 0.1, speed_factor 0.1: about 10% of clients are
    10x slower)."""

    # The probability that a client is in this tier, in [0, 1] (from the client's own seeded draw,
    # so a tier is about this fraction of any population, disjoint from the other tiers'; all tiers'
    # at most 1 together).
    fraction: float = 0.1
    # The tier's speed multiplier (> 0): 0.1 makes its clients 10x slower.
    speed_factor: float = 0.1


@dataclass
class Availability:
    """When clients are online. `always`; `periodic`: each client is online for
    `online_fraction` of every `period` simulated seconds, with a seeded random phase; `trace`:
    the intervals in `system.trace` (columns available_from, available_to)."""

    # When clients are online to be sampled: always; periodic (online_fraction of every period,
    # seeded phase per client); trace (the intervals of system.trace).
    kind: Literal["always", "periodic", "trace"] = "always"
    # periodic only: the cycle length in simulated seconds (> 0).
    period: float = 3600.0
    # periodic only: the fraction of each period a client is online, in (0, 1].
    online_fraction: float = 0.5


@dataclass
class SystemConfig:
    """The device / network model behind the simulated clock, and the round policy.

    A client task takes flops / speed + bytes_down / down_bandwidth + bytes_up / up_bandwidth +
    latency simulated seconds: speed in FLOP/s (1e9: a phone-class effective rate), bandwidths
    in bytes/s, latency in s. FLOPs are those of the samples the client actually processed; a
    forward+backward pass costs `backward_cost` forward passes (zeroth-order evaluations are
    forward only). Profiles are drawn per client from the distributions, or read from `trace`
    (CSV or Parquet with a `client` column and any of speed, up_bandwidth, down_bandwidth,
    latency, dropout, available_from, available_to; one row per availability interval).

    Policies for synchronous rounds (`fed.call`): `sync` waits for every selected client;
    `deadline` closes the round `deadline` simulated seconds after dispatch, and late clients are
    dropped (`late_policy: drop`) or stop local work in time and send what they have
    (`partial`); `over_selection` selects ceil((1 + over_selection) K) and keeps the first K to
    finish. `dropout` is each task's probability of failing mid-way (never applied).
    Asynchronous algorithms (fedasync, fedbuff) order arrivals on the same clock.
    """

    # Each client's compute speed in FLOP/s (a distribution, or a bare number for a constant); 1e9
    # is a phone-class effective rate.
    speed: Distribution = field(default_factory=lambda: constant(1e9))
    # Each client's upload bandwidth in bytes/s (a distribution or a number).
    up_bandwidth: Distribution = field(default_factory=lambda: constant(1.25e6))
    # Each client's download bandwidth in bytes/s (a distribution or a number).
    down_bandwidth: Distribution = field(default_factory=lambda: constant(2.5e6))
    # Each client's per-task latency in simulated seconds, added to compute and transfer time (a
    # distribution or a number; 0 allowed).
    latency: Distribution = field(default_factory=lambda: constant(0.05))
    # Explicit speed tiers applied after speed is drawn: a list of {fraction, speed_factor}.
    tiers: list[Tier] = field(default_factory=list)
    # Cost of a forward+backward pass in forward passes (> 0); zeroth-order evaluations count
    # forward only.
    backward_cost: float = 3.0
    # Each client task's probability of failing mid-way, in [0, 1]; a dropped task's update is never
    # applied.
    dropout: float = 0.0
    # When clients are online (sub-keys below).
    availability: Availability = field(default_factory=Availability)
    # A CSV or Parquet file of per-client profiles (a client column and any of speed, up_bandwidth,
    # down_bandwidth, latency, dropout, available_from, available_to) that replaces the drawn ones;
    # null: none.
    trace: str | None = None
    # Synchronous round policy: sync waits for every selected client; deadline closes the round
    # deadline simulated seconds after dispatch; over_selection selects ceil((1 + over_selection) K)
    # and keeps the first K to finish.
    policy: Literal["sync", "deadline", "over_selection"] = "sync"
    # policy deadline only: simulated seconds from dispatch to the round's close (> 0).
    deadline: float | None = None
    # policy deadline only: drop the clients that miss it, or partial (they stop local work in time
    # and send what they have).
    late_policy: Literal["drop", "partial"] = "drop"
    # policy over_selection only: the extra fraction of clients selected (>= 0).
    over_selection: float = 0.3

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        for name in ("speed", "up_bandwidth", "down_bandwidth"):
            getattr(self, name).validate_as(f"system.{name}")
        if not (self.latency.dist == "constant" and self.latency.value == 0):  # zero latency is allowed
            self.latency.validate_as("system.latency")
        for i, t in enumerate(self.tiers):
            _fraction(f"system.tiers[{i}].fraction", t.fraction, open_left=False)
            _positive_float(f"system.tiers[{i}].speed_factor", t.speed_factor)
        if sum(t.fraction for t in self.tiers) > 1 + 1e-9:
            raise ConfigError("system.tiers", "tier fractions must sum to at most 1")
        _positive_float("system.backward_cost", self.backward_cost)
        _fraction("system.dropout", self.dropout, open_left=False)
        _positive_float("system.availability.period", self.availability.period)
        _fraction("system.availability.online_fraction", self.availability.online_fraction)
        if self.availability.kind == "trace" and self.trace is None:
            raise ConfigError("system.availability.kind", "'trace' needs system.trace (a CSV or Parquet file)")
        if self.trace is not None:
            path = Path(self.trace).expanduser()
            if path.suffix.lower() not in (".csv", ".parquet", ".pq"):
                raise ConfigError("system.trace", f"{path} must be a .csv or .parquet file")
            if not path.is_file():
                raise ConfigError("system.trace", f"file {path} does not exist")
        if self.policy == "deadline" and (self.deadline is None or not self.deadline > 0):
            raise ConfigError("system.deadline", "policy 'deadline' needs system.deadline > 0 (simulated seconds)")
        if self.over_selection < 0:
            raise ConfigError("system.over_selection", f"must be >= 0, got {self.over_selection}")


@dataclass
class OutputConfig:
    """Where results go: `<dir>/<experiment>/<run_id>/{rounds,clients,evals}/part-*.parquet`.

    `dir` is a local path or a pyarrow filesystem URI (`s3://bucket/prefix`, `gs://...`); on a
    cluster use an absolute shared path or a URI, since a relative one lands on the driver's
    working directory. A run id that already holds a run is an error unless `overwrite` is set,
    which removes the old run first (results are never replaced by accident).

    Rows are buffered and written as one part file per table at each flush: when `flush_rows`
    rows are buffered (all tables together: the limit bounds the driver's memory, and flushing
    the tables together keeps them consistent with each other on disk), when the oldest buffered
    row is `flush_seconds` old (what a killed run can lose), at every checkpoint and when the run
    ends. A run that completes has each table's parts merged into one file (`compact`), so it
    reads back fast; a killed, failed or interrupted one keeps its parts for `rayfl resume`."""

    # Where results go: a local path or a pyarrow filesystem URI (s3://bucket/prefix, gs://...); on
    # a cluster, an absolute shared path or a URI.
    dir: str = "results"
    # Write buffered rows as one part file per table once this many are buffered, all tables
    # together (> 0): bounds the driver's memory.
    flush_rows: int = 50_000
    # Write buffered rows once the oldest is this many wall seconds old (> 0): what a killed run can
    # lose.
    flush_seconds: float = 10.0
    # Also flush after every this many server rounds (null: only by rows and time). Runs
    # recorded by older rayfl versions carry 1 here, which still works.
    flush_every_rounds: int | None = None
    # Merge each table's part files into one (a new one per 1,000,000 rows) when a run completes.
    compact: bool = True
    # Write the clients table (one row per client task: timing, outcome, loss); false keeps only
    # rounds and evals.
    log_clients: bool = True
    # Remove an existing run of the same run id first; false: a taken run id is an error.
    overwrite: bool = False
    # Save a checkpoint (server state, client states, clock, tasks in flight) every this many
    # server rounds, and always when a run is stopped by SIGTERM / Ctrl-C; 0 only on a stop.
    # `rayfl resume <run dir>` continues from it.
    checkpoint_every: int = 10

    def validate(self) -> None:
        """Raise ConfigError naming the first key out of range: load_config calls it before anything runs."""
        _positive("output.flush_rows", self.flush_rows)
        _positive_float("output.flush_seconds", self.flush_seconds)
        if self.flush_every_rounds is not None:
            _positive("output.flush_every_rounds", self.flush_every_rounds)
        _non_negative("output.checkpoint_every", self.checkpoint_every)

    def writer_options(self) -> dict[str, Any]:
        """The `RunWriter` / `RunWriter.reopen` keyword arguments these settings give."""
        return {"flush_rows": self.flush_rows, "flush_seconds": self.flush_seconds, "compact": self.compact}


# The sections of the round pipeline (privacy, compression, robust) and of the asynchronous
# driver are defined with them.
from rayfl.driver.checks import check_driver, check_server_optimizer  # noqa: E402
from rayfl.driver.settings import AsynchronyConfig, ServerConfig  # noqa: E402
from rayfl.pipeline.sections import (  # noqa: E402
    CompressionConfig,
    PrivacyConfig,
    RobustSection,
    check_pipeline,
)


@dataclass
class Config:
    """A whole job: one field per section of the YAML file, each a typed dataclass. Build it with
    `load_config` (a file, defaults and `section.key=value` overrides, validated), not by hand."""

    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    robust: RobustSection = field(default_factory=RobustSection)
    asynchrony: AsynchronyConfig = field(default_factory=AsynchronyConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    callbacks: list[CallbackConfig] = field(default_factory=list)

    def validate(self) -> None:
        """Validate every section, then what spans sections (the round pipeline and driver the algorithm
        accepts, clients_per_round within partition.num_clients, a system trace's contents)."""
        for f in dataclasses.fields(self):
            if f.name == "callbacks":
                for i, cb in enumerate(self.callbacks):
                    try:
                        cb.validate()
                    except ConfigError as e:  # which item of the list: callbacks[i].key
                        raise ConfigError(e.key.replace("callbacks", f"callbacks[{i}]", 1), str(e).partition(": ")[2]) from None
            elif f.name == "compression":
                self.compression.validate_as("compression")
            else:
                getattr(self, f.name).validate()
        from rayfl.registry import algorithm_class

        algorithm = algorithm_class(self)
        check_pipeline(self, algorithm)
        check_driver(self, algorithm)
        check_server_optimizer(self, algorithm)
        data, partition = self.data, self.partition
        data.check_partition(partition)
        alg = self.algorithm
        clients = partition.num_clients
        if alg.clients_per_round is not None and clients is not None and alg.clients_per_round > clients:
            raise ConfigError(
                "algorithm.clients_per_round",
                f"{alg.clients_per_round} exceeds partition.num_clients={clients}",
            )
        if getattr(alg, "server_as_client", False) and data.server_fraction == 0:
            raise ConfigError(
                "algorithm.server_as_client",
                "the server owns no data; set data.server_fraction > 0",
            )
        if self.system.trace is not None:
            # Read the trace's contents now (types, ranges, client ids), before Ray starts.
            from rayfl.engine.system import read_trace

            read_trace(Path(self.system.trace).expanduser(), clients)

    def planned_clients(self) -> int | None:
        """How many clients the run will have, when the config alone says it (None: known
        once the data are loaded, e.g. a dataset's own writers)."""
        return self.data.planned_clients(self.partition)

    def to_dict(self) -> dict[str, Any]:
        """The job as nested plain dicts and lists, as a YAML job writes it (what a run's manifest stores)."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- loading


SECTIONS: dict[str, type] = typing.get_type_hints(Config)


def section_class(section: str, values: Mapping[str, Any]) -> type:
    """The dataclass a job's `section` is built with: the named entry's own config class for
    the extensible sections (algorithm, model, data, partition), else the section's class."""
    from rayfl.registry import BY_SECTION

    registry = BY_SECTION.get(section)
    if registry is None:
        return SECTIONS[section]
    selector = registry.key.split(".")[1]
    default = getattr(SECTIONS[section], selector)
    return registry.config_class(values.get(selector, default))


def algorithm_config_class(name: str) -> type[AlgorithmConfig]:
    """The config dataclass of the algorithm `name` (a registered name or an import path)."""
    return section_class("algorithm", {"name": name})


def section_config(section: str, **values: Any) -> Any:
    """One section's config built from keyword values as a job's would be (the named entry's
    class, types checked), e.g. `section_config("model", name="mlp", hidden=[16])`."""
    return build_section(section_class(section, values), values, section)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML job, apply overrides and validate it, so a mistake is found before
    anything expensive happens.

    Args:
        path: the YAML job file; None: the defaults.
        overrides: `section.key=value` strings (values in YAML syntax), as `--set` takes.

    Returns:
        The validated job.

    Raises:
        ConfigError: the first key that is unknown or out of range, by its dotted name."""
    from rayfl.registry import searching

    raw = read_job_file(path) if path is not None else {}
    for item in overrides or []:
        apply_override(raw, item)
    with searching(Path(path).absolute().parent if path is not None else None):
        return config_from_dict(raw)


def read_job_file(path: str | Path) -> dict[str, Any]:
    """A job file's top-level mapping (sections to mappings), with one-line errors naming the
    file. Nothing is validated yet: `rayfl sweep` takes its `sweep:` block out first."""
    p = Path(path)
    if not p.is_file():
        problem = f"{p} is not a file" if p.exists() else f"file {p} does not exist"
        raise ConfigError("job", problem)
    try:
        loaded = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError("job", f"cannot read {p}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError("job", f"{p} is not a text (UTF-8) YAML file") from e
    except yaml.YAMLError as e:
        raise ConfigError("job", f"{p} is not valid YAML: {_yaml_problem(e)}") from e
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, Mapping):
        raise ConfigError("job", f"{p} must be a mapping of sections {sorted(SECTIONS)}")
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in loaded.items()}


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `section.key=value` (or `section.key.sub=value`) override; the value is parsed
    as YAML (so 0.1, true, null, [64, 64], {dist: pareto, shape: 1.2} work)."""
    if "=" not in item:
        raise ConfigError(item, "an override must look like section.key=value")
    dotted, _, text = item.partition("=")
    section, _, key = dotted.strip().partition(".")
    if not key:
        raise ConfigError(dotted, f"an override must name section.key; sections are {sorted(SECTIONS)}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(dotted, f"cannot parse value {text!r}: {_yaml_problem(e)}") from e
    node = raw.setdefault(section, {})
    if not isinstance(node, dict):
        raise ConfigError(section, "must be a mapping")
    *parents, leaf = key.split(".")
    for i, part in enumerate(parents):
        child = node.get(part)
        if child is None or isinstance(child, (int, float)):
            child = {} if child is None else {"dist": "constant", "value": child}
            node[part] = child
        if not isinstance(child, dict):
            raise ConfigError(f"{section}.{'.'.join(parents[: i + 1])}", "is not a mapping, so it has no sub-keys")
        node = child
    node[leaf] = value


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        bad = sorted(unknown)[0]
        raise ConfigError(bad, f"unknown section; allowed sections are {sorted(SECTIONS)}")
    sections: dict[str, Any] = {}
    for name in SECTIONS:
        if name == "callbacks":
            sections[name] = build_callbacks(raw.get(name))
            continue
        values = raw.get(name) or {}
        if not isinstance(values, Mapping):
            raise ConfigError(name, "must be a mapping of keys to values")
        if name == "robust":
            values = robust_defaults(type(sections["algorithm"]), values)
        if name == "data":
            values = data_dir_default(values)
        sections[name] = build_section(section_class(name, values), values, name)
    cfg = Config(**sections)
    cfg.validate()
    return cfg


DATA_DIR_ENV = "RAYFL_DATA_DIR"  # the one setting that points every job at an offline copy of the data


def data_dir_default(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `data:` section, with `data_dir` from $RAYFL_DATA_DIR (made absolute here, so hosts and
    sweep trials in other directories read the same files) when the job names none. Jobs then
    stay machine-independent: a laptop downloads into ~/.rayfl/data, CI points at its copy."""
    import os

    from_env = os.environ.get(DATA_DIR_ENV, "").strip()
    if "data_dir" in values or not from_env:
        return values
    return {**values, "data_dir": str(Path(from_env).expanduser().absolute())}


def robust_defaults(algorithm: type, values: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `robust:` section, with an algorithm's own default aggregator (BR-FFGG: the
    authors' bucketed median) where the job names none."""
    default = getattr(algorithm, "robust_aggregator", None)
    if default is None or "aggregator" in values:
        return values
    return {**values, "aggregator": dict(default)}


def build_callbacks(raw: Any) -> list[CallbackConfig]:
    """The job's `callbacks:` list: each item a mapping whose `name` picks the callback (a
    registered name or an import path) and whose other keys are that callback's settings."""
    from rayfl.registry import CALLBACKS

    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError("callbacks", "must be a list of mappings, each with a `name`")
    built = []
    for i, item in enumerate(raw):
        key = f"callbacks[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, Mapping) or "name" not in item:
            raise ConfigError(key, "must be a mapping with a `name` (or just the name)")
        try:
            cls = CALLBACKS.config_class(item["name"])
        except ConfigError as e:
            raise ConfigError(f"{key}.name", str(e).partition(": ")[2]) from None
        built.append(build_section(cls, item, key))
    return built


def build_section(cls: type, values: Mapping[str, Any], prefix: str) -> Any:
    """Construct dataclass `cls` from a mapping, checking keys and coercing types."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in names:
            raise ConfigError(f"{prefix}.{key}", unknown_key(cls, prefix, key, names, values))
        kwargs[key] = coerce(f"{prefix}.{key}", value, hints[key])
    return cls(**kwargs)


# Keys that moved: old key -> new key. Within `data` when each dataset got its own config class;
# FFGG's robust settings to the round pipeline's `robust:` section, for every algorithm.
MOVED_KEYS: dict[str, str] = {
    **{f"data.synthetic_{k}": f"data.{k}" for k in ("alpha", "beta", "iid", "features", "classes", "size_mu", "size_sigma", "lazy", "eval_clients")},
    "data.synthetic_min_samples": "data.min_client_samples",
    "data.synthetic_max_samples": "data.max_client_samples",
    **{f"data.quadratic_{k}": f"data.{k}" for k in ("n", "d_theta", "d_w", "planted")},
    "algorithm.aggregator": "robust.aggregator",
    "algorithm.attack": "robust.attack",
}


def is_path_key(key: str) -> bool:
    """Whether a config key holds a local path, by its name: `path`, `init_from`, `trace`, or
    a name ending in `_path`, `_dir` or `_file` (built-ins and users' config classes alike)."""
    return key in ("path", "init_from", "trace") or key.endswith(("_path", "_dir", "_file"))


def absolute_local_paths(raw: dict[str, Any], base: str | Path | None = None) -> None:
    """Relative local paths (e.g. `data.data_dir: ../data`) made absolute against `base`
    (default: the working directory), in place: a sweep's trials run in directories of their
    own, a resumed run wherever `rayfl resume` is called. `output.dir` is left alone (the
    sweep makes it absolute itself; a resumed run is addressed by its directory)."""
    root = Path(base) if base is not None else Path.cwd()
    for section, values in raw.items():
        if section == "output":
            continue
        for item in (values if isinstance(values, list) else [values]):  # `callbacks:` is a list
            if isinstance(item, dict):
                _absolute_paths_in(item, root)


def _absolute_paths_in(values: dict[str, Any], root: Path) -> None:
    from rayfl.results.storage import is_uri

    for key, value in values.items():
        if is_path_key(key) and isinstance(value, str) and value and not is_uri(value) \
                and not Path(value).expanduser().is_absolute():
            values[key] = str((root / value).resolve())


def config_from_manifest(raw: Mapping[str, Any]) -> Config:
    """The config a run's manifest recorded. A run recorded before each model, dataset and
    partitioner had its own config class carries every flat key: moved keys get their new
    names (and sections), and keys the named entry does not have (the flat sections' other
    defaults) go."""
    raw = _moved_across_sections(raw)
    return config_from_dict({name: _recorded_section(name, values) if isinstance(values, Mapping) else values
                             for name, values in raw.items()})


def _moved_across_sections(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded config with the keys that left their section put where they are now (e.g.
    FFGG's `algorithm.aggregator` into `robust.aggregator`); the recorded value wins."""
    out = {name: dict(values) if isinstance(values, Mapping) else values for name, values in raw.items()}
    for old, new in MOVED_KEYS.items():
        (section, key), (target, new_key) = old.split(".", 1), new.split(".", 1)
        if section != target and isinstance(out.get(section), dict) and key in out[section]:
            moved = out[section].pop(key)
            out[target] = {**(out.get(target) or {}), new_key: moved}
    return out


def _recorded_section(name: str, values: Mapping[str, Any]) -> dict[str, Any]:
    values = {MOVED_KEYS.get(f"{name}.{k}", f"{name}.{k}").partition(".")[2]: v for k, v in values.items()}
    if name not in ("model", "data", "partition"):
        return values
    keep = {f.name for f in dataclasses.fields(section_class(name, values))}
    return {k: v for k, v in values.items() if k in keep}


def recorded_section(name: str, values: Mapping[str, Any]) -> Any:
    """One section of a recorded config (see `config_from_manifest`), built."""
    values = _recorded_section(name, values)
    return build_section(section_class(name, values), values, name)


def unknown_key(cls: type, prefix: str, key: str, names: list[str], values: Mapping[str, Any]) -> str:
    """The message for a key `cls` does not have: where it moved, or which keys there are."""
    moved = MOVED_KEYS.get(f"{prefix}.{key}")
    section = moved.partition(".")[0] if moved is not None else None
    if moved is not None and section != prefix:
        return f"this key moved: it is now {moved} (the job's `{section}:` section, for every algorithm)"
    if moved is not None and moved.partition(".")[2] in names:
        return f"this key moved: it is now {moved} (a key of the dataset's own config)"
    from rayfl.registry import BY_SECTION

    registry = BY_SECTION.get(prefix)
    if registry is None:
        return f"unknown key; allowed keys are {names}"
    selector = registry.key.split(".")[1]
    chosen = values.get(selector, getattr(cls, selector, None))
    return f"unknown key of {registry.kind} {chosen!r}; its keys are {names}"


def coerce(key: str, value: Any, hint: Any) -> Any:
    """Check `value` against a type hint, with the mild coercions YAML needs (int -> float)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        for option in get_args(hint):
            try:
                return coerce(key, value, option)
            except _NotFinite:
                raise
            except ConfigError:
                continue
        raise ConfigError(key, f"got {value!r}; expected {_describe(hint)}")
    if hint is type(None):
        if value is None:
            return None
        raise ConfigError(key, "expected null")
    if origin is Literal:
        if isinstance(value, bool) and ("on" if value else "off") in get_args(hint):
            return "on" if value else "off"  # YAML 1.1 reads a bare on / off as a boolean
        if value in get_args(hint):
            return value
        raise ConfigError(key, f"got {value!r}; allowed values are {list(get_args(hint))}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(key, f"got {value!r}; expected a list")
        (item,) = get_args(hint)
        return [coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"got {value!r}; expected a mapping")
        return dict(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"got {value!r}; expected true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(key, f"got {value!r}; expected an integer")
    if hint is float:
        number = _as_number(value)
        if number is None:
            raise ConfigError(key, f"got {value!r}; expected a number")
        if not math.isfinite(number):
            raise _NotFinite(key, f"got {value!r}; expected a finite number (not NaN or infinity)")
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(key, f"got {value!r}; expected a string")
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        if hint is Distribution and _as_number(value) is not None:
            return constant(coerce(key, value, float))  # a bare number is a constant distribution
        if isinstance(value, hint):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"got {value!r}; expected a mapping with keys {[f.name for f in dataclasses.fields(hint)]}")
        return build_section(hint, value, key)
    raise ConfigError(key, f"unsupported type {hint}")


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's error on one line: the problem and where (its str() spans several lines)."""
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e)
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


def _as_number(value: Any) -> float | None:
    """A float from a YAML number, or from a numeric string (PyYAML reads 5.0e7, without an
    exponent sign, as a string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _describe(hint: Any) -> str:
    parts = []
    for option in get_args(hint):
        if option is type(None):
            parts.append("null")
        elif get_origin(option) is Literal:
            parts.extend(repr(a) for a in get_args(option))
        else:
            parts.append(getattr(option, "__name__", str(option)))
    return " or ".join(parts)
