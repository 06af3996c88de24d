"""FFGG's Table 1 pipeline (arXiv 2305.18285, §3.3 + App. E.3): (1)
non-personalized training with FedAvg, (2) personalized training with Local FFGG (Alg. 4) for
each personalization scheme (input layer, output layer, adapter), (3) local fine-tuning of the
personal parameters on every client, then test accuracy weighted by test size.

Each stage is an ordinary rayfl run from a job file `jobs/ffgg/table1_<dataset>_<stage>.yaml`
(stages fedavg, ffgg, finetune); a stage starts from the previous one's final model through
`model.init_from` (its run directory). Baselines (the paper does not say what its FedAvg row
is; rayfl's `FedAvg` is step 1's model as it is, plus two controls): step 1's model fine-tuned with
nothing personal (`FedAvg`), with everything personal (`FedAvg + FT (all)`), and with the
scheme's own w (`FedAvg + FT (<scheme>)`). Step 1 runs once (seed 0: the paper does not say which
stages its three seeds repeat, and one shared pretraining checkpoint keeps them comparable); steps 2-3 once per seed (run.seed: client sampling, w init, batches),
all on one data split (data.seed = 0), so no seed trains on another seed's test split.

Run ids inside `<output.dir>/ffgg_table1_<dataset>/`: pretrain, fedavg_ft_<scheme>_s<seed>,
ffgg_<scheme>_s<seed>, ffgg_<scheme>_ft_s<seed>. A run already completed is not run again, so
the same command continues an interrupted grid.

    python -m rayfl.papers.ffgg.pipeline --dataset mnist --seeds 0,1,2 --out /tmp/ffgg/results
    python -m rayfl.papers.ffgg.pipeline --dataset emnist --set data.data_dir=/data  # GPU cluster
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

SCHEMES = ("input", "output", "adapter")
BASELINE_SCHEMES = ("none", "all")
JOBS = Path(__file__).resolve().parents[3] / "jobs" / "ffgg"
DATA_SEED = 0  # one data split (and client subsample) for every stage and seed of the table


@dataclass(frozen=True)
class StageRun:
    """One rayfl run of the pipeline: its job file, run id and overrides; `after` names the
    run whose final model it starts from."""

    stage: str
    run_id: str
    overrides: tuple[str, ...]
    after: str | None = None


@dataclass
class Plan:
    dataset: str
    runs: list[StageRun] = field(default_factory=list)

    @property
    def experiment(self) -> str:
        return f"ffgg_table1_{self.dataset}"


def adapter_kind(model_name: str) -> str:
    """Pillutla et al.'s residual adapters where the model builds them, LoRA elsewhere (FFGG §3.3
    says only "low-rank adapter")."""
    from rayfl.registry import MODELS

    return "residual" if MODELS.config_class(model_name).builds_adapters else "lora"


def plan_table1(dataset: str, schemes: tuple[str, ...], seeds: tuple[int, ...], model_name: str) -> Plan:
    """Every run of the grid, in an order where each run's source comes first."""
    adapter = f"model.adapter={adapter_kind(model_name)}"
    plan = Plan(dataset)
    plan.runs.append(StageRun("fedavg", "pretrain", ("run.seed=0",)))
    for seed in seeds:
        s = f"run.seed={seed}"
        for scheme in (*BASELINE_SCHEMES, *schemes):
            extra = (adapter,) if scheme == "adapter" else ()
            plan.runs.append(
                StageRun("finetune", f"fedavg_ft_{scheme}_s{seed}", (s, f"algorithm.personal_scheme={scheme}", *extra), "pretrain")
            )
        for scheme in schemes:
            extra = (adapter,) if scheme == "adapter" else ()
            trained = f"ffgg_{scheme}_s{seed}"
            plan.runs.append(StageRun("ffgg", trained, (s, f"algorithm.personal_scheme={scheme}", *extra), "pretrain"))
            plan.runs.append(
                StageRun("finetune", f"ffgg_{scheme}_ft_s{seed}", (s, f"algorithm.personal_scheme={scheme}", *extra), trained)
            )
    return plan


def job_file(dataset: str, stage: str, jobs: Path = JOBS) -> Path:
    return jobs / f"table1_{dataset}_{stage}.yaml"


def run_plan(plan: Plan, out: str, overrides: list[str], jobs: Path = JOBS, log=print) -> dict[str, Path]:
    """Run every stage in order (skipping completed runs) on one Ray session; returns the run
    directories by run id."""
    from rayfl.config import load_config
    from rayfl.engine.local_ray import stop_ray
    from rayfl.runner import init_ray, run_experiment

    root = Path(out).expanduser().absolute() / plan.experiment
    dirs: dict[str, Path] = {}
    started = None
    try:
        for r in plan.runs:
            run_dir = root / r.run_id
            dirs[r.run_id] = run_dir
            if _completed(run_dir):
                log(f"[table1] {r.run_id}: already completed")
                continue
            sets = [
                f"output.dir={Path(out).expanduser().absolute()}", f"run.experiment={plan.experiment}",
                f"run.run_id={r.run_id}", "output.overwrite=true", f"data.seed={DATA_SEED}", *r.overrides, *overrides,
            ]
            if r.after is not None:
                sets.append(f"model.init_from={dirs[r.after]}")
            cfg = load_config(job_file(plan.dataset, r.stage, jobs), sets)
            cfg.output.checkpoint_every = cfg.run.rounds  # the final model lands in checkpoint.npz
            cfg.validate()
            if started is None:
                started = init_ray(cfg)
            log(f"[table1] {r.run_id}: {r.stage} ({' '.join(r.overrides)})")
            outcome = run_experiment(cfg)
            acc = outcome.summary.get("test_accuracy")
            log(f"[table1] {r.run_id}: done in {outcome.wall_seconds:.0f}s, test_accuracy={acc}")
    finally:
        if started:
            stop_ray()
    return dirs


def _completed(run_dir: Path) -> bool:
    manifest = run_dir / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("status") == "completed"
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="FFGG Table 1: FedAvg -> Local FFGG -> local fine-tuning")
    p.add_argument("--dataset", required=True, help="jobs/ffgg/table1_<dataset>_{fedavg,ffgg,finetune}.yaml")
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--seeds", default="0")
    p.add_argument("--out", default="results")
    p.add_argument("--jobs", default=str(JOBS))
    p.add_argument("--set", action="append", default=[], dest="overrides", help="key=value for every stage")
    args = p.parse_args(argv)
    from rayfl.config import load_config

    jobs = Path(args.jobs)
    model_name = load_config(job_file(args.dataset, "ffgg", jobs), args.overrides).model.name
    schemes = tuple(s for s in args.schemes.split(",") if s)
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        p.error(f"--schemes: unknown {unknown}; choose from {list(SCHEMES)}")
    plan = plan_table1(args.dataset, schemes, tuple(int(s) for s in args.seeds.split(",")), model_name)
    run_plan(plan, args.out, args.overrides, jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
