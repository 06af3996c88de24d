"""`Federation`: the driver-side handle an algorithm's server loop uses.

The algorithm is plain Python; the Federation hides Ray (hosts, object store, futures), the
simulated clock and the results writer. A synchronous step is

    results = fed.call(client_ids, client_fn, round=r, params=x, lr=0.1)

which ships the broadcast payload once through the object store, makes one remote call per
host, gathers the records, charges each client's task on the simulated clock and logs one
`clients` row per task. Results come back sorted by client id, so any aggregation the algorithm
does in that order is identical whatever the number of hosts or the order futures finish in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfl.config import Config
from rayfl.data import FederatedDataset
from rayfl.engine.asyncpool import AsyncPool
from rayfl.engine.clock import SimClock
from rayfl.engine.host import ClientFn, remote_host_class
from rayfl.engine.payload import payload_nbytes
from rayfl.engine.placement import Placement, plan_placement
from rayfl.engine.system import SystemModel, forward_flops_per_sample
from rayfl.engine.tasks import OUTCOMES, ClientResult, close_round, plan_task, settle
from rayfl.models import build_model
from rayfl.models.params import get_flat, set_flat
from rayfl.rng import derive_seed, numpy_rng

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass
class ServerData:
    """Data the server itself owns (ZO-HFL's f1 term), sampled with its own seeded stream."""

    x: torch.Tensor
    y: torch.Tensor
    seed: int

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    def batch(self, batch_size: int, round: int, purpose: str = "server.batch") -> tuple[torch.Tensor, torch.Tensor]:
        rng = numpy_rng(self.seed, purpose, round)
        idx = torch.from_numpy(rng.choice(self.num_samples, size=min(batch_size, self.num_samples), replace=False))
        return self.x[idx], self.y[idx]


class Federation:
    """Hosts, clock, evaluation and logging for one run."""

    def __init__(
        self,
        cfg: Config,
        dataset: FederatedDataset,
        writer: Any | None = None,
        progress: ProgressFn | None = None,
    ):
        import ray

        self.cfg = cfg
        self.dataset = dataset
        self.writer = writer
        self.progress = progress
        self.seed = cfg.run.seed
        self.clock = SimClock()
        self._wall_start = time.perf_counter()
        self._round_bytes = 0
        self._outcomes = dict.fromkeys(OUTCOMES, 0)
        self._keep: dict[int, int] = {}
        self.model_version = 0

        self.model = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
        self.num_params = sum(p.numel() for p in self.model.parameters())
        self.forward_flops = forward_flops_per_sample(self.model, dataset.input_shape)
        self.system = SystemModel(cfg.system, dataset.num_clients, self.forward_flops, self.seed)
        self.placement: Placement = plan_placement(cfg.engine, dataset.num_clients, ray.cluster_resources())
        self._host_of = self.placement.host_of()
        self.hosts = self._start_hosts()

    # ------------------------------------------------------------------ set-up

    def _start_hosts(self) -> list[Any]:
        import ray

        ds = self.dataset
        arrays_ref = ray.put({"train_x": ds.train_x, "train_y": ds.train_y, "test_x": ds.test_x, "test_y": ds.test_y})
        actor = remote_host_class().options(
            num_cpus=self.placement.num_cpus,
            num_gpus=self.placement.num_gpus,
            max_restarts=self.cfg.engine.max_restarts,
        )
        hosts = []
        for h, ids in enumerate(self.placement.assignment):
            train = {int(c): ds.client_train[c] for c in ids}
            test = {int(c): ds.client_test[c] for c in ids} if ds.client_test is not None else None
            hosts.append(
                actor.remote(
                    h,
                    arrays_ref,
                    train,
                    test,
                    self.cfg.model,
                    tuple(ds.input_shape),
                    ds.num_classes,
                    self.seed,
                    self.cfg.engine.torch_threads,
                    self.cfg.engine.device,
                    self.forward_flops,
                    self.cfg.system.backward_cost,
                )
            )
        self.host_info = ray.get([h.info.remote() for h in hosts])
        return hosts

    def shutdown(self) -> None:
        import ray

        for h in self.hosts:
            ray.kill(h)
        self.hosts = []

    # ------------------------------------------------------------------ clients

    @property
    def num_clients(self) -> int:
        return self.dataset.num_clients

    @property
    def client_sizes(self) -> np.ndarray:
        return self.dataset.client_sizes()

    def client_weights(self, client_ids: list[int] | None = None, kind: str = "samples") -> np.ndarray:
        """Aggregation weights over `client_ids` summing to 1: by sample count or uniform."""
        ids = np.arange(self.num_clients) if client_ids is None else np.asarray(client_ids)
        w = self.client_sizes[ids].astype(np.float64) if kind == "samples" else np.ones(len(ids))
        return w / w.sum()

    @property
    def now(self) -> float:
        """Simulated seconds since the start of the run."""
        return self.clock.now

    @property
    def wall_time(self) -> float:
        return time.perf_counter() - self._wall_start

    def host_of(self, client: int) -> int:
        return int(self._host_of[client])

    def online_clients(self) -> np.ndarray:
        """Clients online now (an error if nobody is: the availability model is then broken)."""
        avail = self.system.availability
        online = np.array([c for c in range(self.num_clients) if avail.online(c, self.now)], dtype=np.int64)
        if len(online) == 0:
            raise RuntimeError(f"no client is online at simulated time {self.now:.1f}s; check system.availability")
        return online

    def sample(self, round: int, k: int | None = None, fraction: float | None = None) -> list[int]:
        """Uniform participation without replacement among the clients online now, seeded by
        (seed, 'sample', round): the same clients whatever the placement. Under
        `over_selection` it picks ceil((1 + o) k) and the round keeps the first k to finish."""
        if k is None:
            k = self.num_clients if fraction is None else max(1, round_half_up(fraction * self.num_clients))
        candidates = np.arange(self.num_clients) if self.cfg.system.availability.kind == "always" else self.online_clients()
        k = min(k, len(candidates))
        picks = k
        if self.cfg.system.policy == "over_selection":
            picks = min(len(candidates), int(np.ceil((1.0 + self.cfg.system.over_selection) * k - 1e-9)))
            self._keep[round] = k
        rng = numpy_rng(self.seed, "sample", round)
        return sorted(int(c) for c in rng.choice(candidates, size=picks, replace=False))

    def sample_idle(self, busy: set[int], key: int) -> int | None:
        """One client, uniformly among those online and not busy, for an async slot."""
        candidates = self.online_clients() if self.cfg.system.availability.kind != "always" else np.arange(self.num_clients)
        idle = np.setdiff1d(candidates, np.fromiter(busy, dtype=np.int64, count=len(busy)))
        if len(idle) == 0:
            return None
        return int(numpy_rng(self.seed, "async.sample", key).choice(idle))

    def async_pool(self) -> AsyncPool:
        """A pool of asynchronous tasks committed in simulated-time order (see AsyncPool)."""
        return AsyncPool(self)

    def advance_version(self) -> int:
        """Count one more global-model version (staleness = versions applied since download)."""
        self.model_version += 1
        return self.model_version

    def initial_params(self) -> np.ndarray:
        """The initial global model: the model's own default initialisation under a torch seed
        derived from (seed, 'model.init'), so every run with the same seed starts equal."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, "model.init"))
            model = build_model(self.cfg.model, self.dataset.input_shape, self.dataset.num_classes)
        return get_flat(model).numpy()

    def call(
        self,
        client_ids: list[int],
        fn: ClientFn,
        *,
        round: int,
        per_client: Mapping[int, Mapping[str, Any]] | None = None,
        phase: str = "train",
        timed: bool = True,
        **payload: Any,
    ) -> list[ClientResult]:
        """One synchronous step: run `fn(ctx, **payload, **per_client[c])` on every client,
        apply the round policy on the simulated clock (sync, deadline, over-selection; dropouts
        and clients going offline), advance the clock and log every task. Returns the tasks the
        round counts (outcome ok), sorted by client id; late and failed tasks are only logged.
        `timed=False` runs a side computation (e.g. personalized evaluation) off the clock."""
        import ray

        ids = sorted(int(c) for c in client_ids)
        if not ids:
            return []
        start = self.clock.now
        sys_cfg = self.cfg.system
        plans = {c: plan_task(self.system, self.seed, c, round, round, start, self.model_version) for c in ids}
        budgets = None
        if timed and sys_cfg.policy == "deadline" and sys_cfg.late_policy == "partial":
            # upload assumed as large as the download (model in, model out) when budgeting
            base = payload_nbytes(payload)
            budgets = {}
            for c in ids:
                down = base + (payload_nbytes(per_client.get(c)) if per_client else 0)
                budgets[c] = self.system.compute_budget(c, sys_cfg.deadline, down, down)
        by_host: dict[int, list[int]] = {}
        for c in ids:
            by_host.setdefault(self.host_of(c), []).append(c)
        payload_ref = ray.put(payload)  # shipped once; hosts read it zero-copy
        futures = []
        for h, hids in by_host.items():
            sub = {c: per_client[c] for c in hids if c in per_client} if per_client else None
            bud = {c: budgets[c] for c in hids} if budgets is not None else None
            futures.append(self.hosts[h].run.remote(fn, hids, round, payload_ref, sub, bud))
        records = sorted((rec for batch in ray.get(futures) for rec in batch), key=lambda r: r["client"])
        results = [settle(plans[rec["client"]], rec, self.system, round) for rec in records]
        if not timed:
            for r in results:
                r.finish_time, r.outcome = start, "ok"
            self.record_tasks(results, round, phase)
            return results
        end = close_round(results, sys_cfg.policy, start, sys_cfg.deadline, self._keep.get(round))
        self.clock.advance_to(end)
        self.record_tasks(results, round, phase)
        return [r for r in results if r.ok]

    def record_tasks(self, results: list[ClientResult], round: int, phase: str) -> None:
        """Count outcomes and bytes for the round row, and write one `clients` row per task."""
        for r in results:
            self._outcomes[r.outcome] += 1
            self._round_bytes += r.bytes_up + r.bytes_down
        if self.writer is None or not self.cfg.output.log_clients:
            return
        rows = []
        for r in results:
            row = {
                "round": round,
                "phase": phase,
                "client": r.client,
                "host": r.host,
                "outcome": r.outcome,
                "dispatch_time": r.dispatch_time,
                "finish_time": r.finish_time,
                "compute_seconds": r.timing.compute,
                "download_seconds": r.timing.download,
                "upload_seconds": r.timing.upload,
                "version": r.version,
                "staleness": r.staleness,
                "num_samples": r.num_samples,
                "local_steps": r.local_steps,
                "truncated": r.truncated,
                "forward_samples": r.forward_samples,
                "backward_samples": r.backward_samples,
                "bytes_up": r.bytes_up,
                "bytes_down": r.bytes_down,
            }
            loss = r.values.get("loss") if isinstance(r.values, dict) else None
            if isinstance(loss, (int, float, np.floating)):
                row["local_loss"] = float(loss)
            rows.append(row)
        self.writer.extend("clients", rows)

    # ------------------------------------------------------------------ server side

    @property
    def server_data(self) -> ServerData | None:
        idx = self.dataset.server_train
        if idx is None or len(idx) == 0:
            return None
        return ServerData(
            torch.from_numpy(self.dataset.train_x[idx]),
            torch.from_numpy(self.dataset.train_y[idx]),
            self.seed,
        )

    def evaluate(self, params: np.ndarray, batch_size: int = 2048) -> dict[str, float]:
        """Loss and accuracy of a global model on the global test set (on the driver)."""
        return evaluate_arrays(self.model, params, self.dataset.test_x, self.dataset.test_y, batch_size, prefix="test_")

    # ------------------------------------------------------------------ logging

    def log_round(self, round: int, **metrics: Any) -> None:
        """One row of `rounds`; flushes the writer every `output.flush_every_rounds` rounds."""
        row = {
            "round": round,
            "sim_time": self.clock.now,
            "wall_time": self.wall_time,
            "bytes": self._round_bytes,
            **{f"clients_{k}": v for k, v in self._outcomes.items()},
            **{k: _scalar(v) for k, v in metrics.items()},
        }
        self._round_bytes = 0
        self._outcomes = dict.fromkeys(OUTCOMES, 0)
        if self.writer is not None:
            self.writer.append("rounds", row)
            if (round + 1) % self.cfg.output.flush_every_rounds == 0:
                self.writer.flush()
                self.writer.update_manifest(last_round=round, sim_time=self.clock.now)
        if self.progress is not None:
            self.progress(row)

    def log_eval(self, round: int, metrics: Mapping[str, Any], client: int = -1, split: str = "test") -> None:
        """One row of `evals`: client -1 is the global model."""
        if self.writer is None:
            return
        row = {"round": round, "sim_time": self.clock.now, "wall_time": self.wall_time, "client": client, "split": split}
        row.update({k: _scalar(v) for k, v in metrics.items()})
        self.writer.append("evals", row)


def evaluate_arrays(
    model: torch.nn.Module,
    params: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = 2048,
    prefix: str = "",
) -> dict[str, float]:
    """Mean cross-entropy and accuracy of `params` on (x, y)."""
    set_flat(model, torch.as_tensor(params))
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for xb, yb in iterate(x, y, batch_size):
            logits = model(xb)
            loss_sum += torch.nn.functional.cross_entropy(logits, yb, reduction="sum").item()
            correct += int((logits.argmax(1) == yb).sum())
    n = max(len(y), 1)
    return {f"{prefix}loss": loss_sum / n, f"{prefix}accuracy": correct / n}


def iterate(x: np.ndarray, y: np.ndarray, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for start in range(0, len(y), batch_size):
        yield torch.from_numpy(x[start : start + batch_size]), torch.from_numpy(y[start : start + batch_size])


def round_half_up(v: float) -> int:
    return int(np.floor(v + 0.5))


def _scalar(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    return v
