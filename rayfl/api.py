"""rayfl from Python: `rayfl.run` a job (a file, a mapping or a Config) in a notebook or a
script and get its results back as DataFrames and its final model as a module."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayfl.config import Config, ConfigError, apply_override, config_from_dict, load_config

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import torch

    from rayfl.callbacks.base import Callback
    from rayfl.data import FederatedDataset
    from rayfl.results import Results


@dataclass
class Run:
    """A finished (or stopped) run: where its results are, its config and summary, the
    final global model the server loop returned, and its tables, read on first use."""

    dir: str | Path
    config: Config
    summary: dict[str, Any]
    final_params: np.ndarray | None = None
    _dataset: Any = field(default=None, repr=False)

    @functools.cached_property
    def results(self) -> Results:
        """Every table of the run, read from its directory on first use and kept."""
        from rayfl.results import load as load_results

        return load_results(self.dir)

    @property
    def rounds(self) -> pd.DataFrame:
        """One row per server round (simulated and wall time, metrics)."""
        return self.results.rounds

    @property
    def clients(self) -> pd.DataFrame:
        """One row per client task (outcome, timings, bytes, local loss)."""
        return self.results.clients

    @property
    def evals(self) -> pd.DataFrame:
        """One row per evaluation (client -1 is the global model)."""
        return self.results.evals

    def model(self) -> torch.nn.Module:
        """The run's network holding the final global model (in eval mode)."""
        import torch

        from rayfl.models import build_model, set_flat

        if self.final_params is None:
            raise ValueError(f"the server loop of {self.config.algorithm.name!r} returned no final_params")
        ds = self._dataset
        net = build_model(self.config.model, tuple(ds.input_shape), ds.num_classes)
        set_flat(net, torch.as_tensor(self.final_params))
        return net.eval()


def run(
    job: str | Path | Mapping[str, Any] | Config | None = None,
    overrides: Sequence[str] = (),
    *,
    dataset: FederatedDataset | None = None,
    address: str | None = None,
    progress: bool = False,
    callbacks: Sequence[Callback] = (),
) -> Run:
    """Run one experiment to completion and return it: `rayfl run` from Python.

    Args:
        job: a job file, a mapping of sections (as a YAML job reads), a `Config`, or None for
            the default job.
        overrides: `section.key=value` strings, as `rayfl run --set` takes.
        dataset: replaces the config's data (it is stored with the run, so `resume` works).
        address: a running Ray to join (else RAY_ADDRESS, else a local Ray started and stopped
            here, unless this process is already connected to one).
        progress: draw a progress bar.
        callbacks: `rayfl.Callback` objects, run after the job's own `callbacks:` list.

    Returns:
        The finished run: its directory, config, summary, tables and final model.

    Raises:
        ConfigError: a mistake in the job, before Ray starts."""
    from rayfl.runner import build_dataset, run_experiment

    cfg = _config(job, [*overrides, *([f"engine.address={address}"] if address else [])])
    if dataset is None:
        dataset = build_dataset(cfg)
    out = _with_progress(cfg.run.rounds, progress, lambda bar: run_experiment(cfg, progress=bar, dataset=dataset,
                                                                                  callbacks=callbacks))
    return Run(out.run_dir, cfg, out.summary, out.final_params, dataset)


def resume(run_dir: str | Path, *, progress: bool = False, callbacks: Sequence[Callback] = (),
           trust_pickle: bool = False) -> Run:
    """Continue a stopped or killed run from its last checkpoint (see `rayfl resume`).

    Args:
        run_dir: the run's directory (`results/EXPERIMENT/RUN_ID`).
        progress: draw a progress bar.
        callbacks: the `rayfl.Callback` objects the run was started with, given again (their
            state is in the checkpoint).
        trust_pickle: resume from an older rayfl's `checkpoint.pkl`; pickle runs any code the
            file holds, so only for a run directory you wrote yourself.

    Returns:
        The finished run, as `rayfl.run` returns it."""
    from rayfl.runner import resume_experiment, resume_target

    out = _with_progress(resume_target(run_dir), progress,
                         lambda bar: resume_experiment(run_dir, progress=bar, callbacks=callbacks,
                                                           trust_pickle=trust_pickle))
    return Run(out.run_dir, out.config, out.summary, out.final_params, out.dataset)


def _config(job: Any, overrides: list[str]) -> Config:
    if job is None or isinstance(job, (str, Path)):
        return load_config(job, overrides)
    if isinstance(job, Config):
        if not overrides:
            return job
        job = job.to_dict()
    if isinstance(job, Mapping):
        raw = {k: dict(v) if isinstance(v, Mapping) else v for k, v in job.items()}
        for item in overrides:
            apply_override(raw, item)
        return config_from_dict(raw)
    raise ConfigError("job", f"expected a job file, a mapping of sections or a rayfl.Config, got {type(job).__name__}")


def _with_progress(total: int, enabled: bool, body: Any) -> Any:
    from rayfl.progress import RoundProgress

    with RoundProgress(total, enabled=enabled) as bar:
        return body(bar.update if enabled else None)
