"""The `rayfl` command line: run, partition, report, bench, validate, config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rayfl import __version__

EPILOG = """\
examples:
  rayfl run                                   the default job: FedAvg on Synthetic(1,1), 100 clients
  rayfl run jobs/digits_fedavg.yaml           a job file
  rayfl run jobs/digits_fedavg.yaml --set algorithm.lr=0.1 --set run.seed=3
  rayfl run jobs/x.yaml --address auto        on a running Ray cluster (or set RAY_ADDRESS)
  ray job submit --working-dir . -- rayfl run jobs/x.yaml
  rayfl sweep jobs/x.yaml --grid algorithm.lr=0.01,0.1 --seeds 0,1,2
                                              a grid x seeds, one run per trial on warm hosts, resumable
  rayfl resume results/default/<run_id>       continue a stopped or killed run from its checkpoint
  rayfl validate jobs/x.yaml                  check a job and print the resolved config
  rayfl validate jobs/x.yaml --explain        the same, each key's meaning as a comment above it
  rayfl config algorithm=scaffold             an entry's keys with type, default and meaning
  rayfl config privacy                        one section's keys (no argument: every section)
  rayfl list                                  every algorithm, model, dataset, partitioner and example job
  rayfl run --example digits_fedavg           an example job shipped with rayfl
  rayfl run job.yaml --set algorithm.name=mypkg.fednova:fednova
                                              your own code, named by import path (docs/guides/extending.md)
  rayfl partition jobs/x.yaml --plot part.png the client x class matrix of a job's partition
  rayfl report results/                       tables and plots from finished runs
  rayfl pool start --address auto             warm hosts on a running Ray: runs joining it start faster
  rayfl bench scale --clients 10000           seconds per round and peak memory at scale
  rayfl bench driver --hosts 2,4,8,16,32      the driver's CPU per round as the hosts grow (ms per host)
  rayfl bench memory --clients 10,40,100,400  each host's peak memory against the clients of a round
  rayfl bench async --clients 1000            stragglers: sync vs deadline vs FedBuff; async speed-up
  rayfl bench zo                              wall time of a ZO-HFL round vs FedAvg rounds (offline MNIST)
  rayfl bench fedavg-mlp                      rayfl (vectorised / loop, 1 and 2 hosts) vs a plain PyTorch loop
  rayfl bench fedprox-mlp                     the same with FedProx's proximal term (mu 0.01)
  rayfl bench femnist-cnn                     LEAF's FEMNIST CNN, 20 writers a round: defaults vs on / off vs the loop
  rayfl bench cifar-resnet                    ResNet-18-GN on CIFAR-10-shaped data, Dirichlet 0.3
  rayfl bench shakespeare-lstm                LEAF's character LSTM on Shakespeare-shaped sequences
  rayfl bench fedavg-mlp --device cuda --hosts 1,4,8   the same with the hosts sharing one GPU
  rayfl bench startup                         a 10-round fedavg-mlp run as a process: seconds outside its rounds
  rayfl bench table bench/*.json              the Markdown table of workload results (docs/benchmarks.md)

algorithms (algorithm.name; `rayfl config algorithm=X` prints X's keys and their meaning):
  first order     fedavg fedprox scaffold fedasync fedbuff
  ZO-HFL          zo_hfl
  FedRZO          fedrzo_nn fedrzo_bl fedrzo_minimax fedmspp scaffnew
  FFGG            ffgg local_ffgg async_ffgg br_ffgg local_gd scaffold_quadratic l2gd local_finetune
  ComFedL         comfedl drfa qfedavg per_fedavg tr_maml ditto fedavg_adapt
  (each paper's jobs are in jobs/<paper>/, its replication notes in docs/replications/)

Results land in <output.dir>/<experiment>/<run_id>/{rounds,clients,evals}/*.parquet:
  python -c "import rayfl.results as r; print(r.load('results').rounds)"
  duckdb -c "select * from read_parquet('results/*/*/rounds/*.parquet', union_by_name=true)"
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rayfl",
        description="rayfl: federated-learning simulation on Ray, with a simulated clock and Parquet results.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p.add_argument("--version", action="version", version=f"rayfl {__version__}")

    def job_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("job", nargs="?", help="job YAML (omit for the built-in default job)")
        sp.add_argument("--example", metavar="NAME",
                        help="a job shipped with rayfl instead of a file, e.g. digits_fedavg (`rayfl list examples`)")
        sp.add_argument(
            "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
            help="override one config value (YAML syntax), e.g. --set partition.alpha=0.1; repeatable",
        )

    run = sub.add_parser("run", help="run one experiment", formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Run a job on a local Ray instance or a cluster and stream results to Parquet.")
    job_args(run)
    run.add_argument("--address", help="Ray address ('auto' for a running cluster); default: RAY_ADDRESS or local")
    run.add_argument("--quiet", action="store_true", help="no progress bar or dataset summary")

    res = sub.add_parser(
        "resume", help="continue a stopped, killed or failed run from its last checkpoint",
        description="Continue a run in its own directory from its last checkpoint (saved every "
                    "output.checkpoint_every rounds and on SIGTERM / Ctrl-C). Rows written after the "
                    "checkpoint are dropped and produced again: the finished tables equal an "
                    "uninterrupted run's.",
    )
    res.add_argument("run_dir", help="the run's directory or URI: <output.dir>/<experiment>/<run_id>")
    res.add_argument("--quiet", action="store_true", help="no progress bar")
    res.add_argument("--trust-pickle", action="store_true",
                     help="resume from an older rayfl's checkpoint.pkl: loading pickle runs any code the file "
                          "holds, so only for a run directory you wrote yourself (checkpoint.npz needs no flag)")

    sw = sub.add_parser(
        "sweep", help="run a job over a grid of settings and seeds (warm hosts, resumable)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run one rayfl run per grid point and seed, as many side by side as the "
                    "cluster holds (each trial reserves its own client hosts, kept warm between "
                    "trials; each dataset is built once), into <output.dir>/<sweep name>/<run_id>/. "
                    "The job's `sweep:` block (grid, seeds, name, ...) is read too; the flags override "
                    "it. SIGTERM or Ctrl-C stops every running trial after its round (exit 130). "
                    "Rerunning the same sweep (same name) resumes it: completed runs are not run "
                    "again, interrupted ones continue from their checkpoints.",
    )
    job_args(sw)
    sw.add_argument("--grid", action="append", default=[], metavar="SECTION.KEY=V1,V2",
                    help="values to sweep for one key (YAML values), e.g. --grid algorithm.lr=0.01,0.1; repeatable")
    sw.add_argument("--seeds", metavar="S1,S2", help="seeds, each grid point runs once per seed (default: run.seed)")
    sw.add_argument("--name", help="the sweep's name = its experiment directory (default: <run.experiment>_sweep)")
    sw.add_argument("--max-concurrent", type=int, help="at most this many trials at once (default: as many as fit)")
    sw.add_argument("--max-failures", type=int, help="retries per failed trial (default 0; -1 forever)")
    sw.add_argument("--scheduler", choices=["fifo", "asha"], help="trial scheduler (default fifo; asha stops poor trials early, as Ray Tune trials)")
    sw.add_argument("--metric", help="metric ASHA compares (default test_accuracy)")
    sw.add_argument("--mode", choices=["max", "min"], help="whether the metric is maximised (default max)")
    sw.add_argument("--address", help="Ray address ('auto' for a running cluster); default: RAY_ADDRESS or local")

    pool = sub.add_parser(
        "pool", help="warm hosts on a running Ray, leased by the runs that join it (faster start-up)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Keep host processes that have already imported torch and rayfl on a running Ray "
                    "(`ray start --head`). A run joining that Ray (--address, RAY_ADDRESS) leases idle "
                    "ones instead of starting its own hosts (engine.pool: auto; CPU hosts), with the same "
                    "results, and hands them back emptied. A pooled host whose loaded code changed on "
                    "disk is replaced by a fresh one.",
        epilog="example:\n  ray start --head --num-cpus 2\n  rayfl pool start --hosts 2 --address auto\n"
               "  rayfl run jobs/x.yaml --address auto      leases the two warm hosts\n"
               "  rayfl pool stop --address auto",
    )
    pool.add_argument("action", choices=["start", "status", "stop"],
                      help="start: top the pool up to --hosts; status: one line per host; stop: kill them")
    pool.add_argument("--hosts", type=int, default=2, help="pooled hosts wanted (start; default 2)")
    pool.add_argument("--address", help="the running Ray ('auto' for the latest one started here); default: RAY_ADDRESS or auto")

    val = sub.add_parser("validate", help="check a job and print its resolved config",
                         description="Check a job (every key of its algorithm, model, dataset and partitioner, "
                                     "user code named by import path included) and print the resolved config: "
                                     "every key with its value or default.")
    job_args(val)
    val.add_argument("--explain", action="store_true",
                     help="print each key's meaning as a YAML comment above it (the output still loads as a job)")

    conf = sub.add_parser(
        "config", help="every config key with its type, default, allowed values and meaning",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print config keys with their type, default, allowed values and meaning: every "
                    "section's keys (no argument), one section's, or the keys of the entry a section "
                    "names (its own first, then the section's shared ones). The meanings are the "
                    "comments above the fields of the config dataclasses, as in the configuration "
                    "reference. For a job's resolved values with their meanings: rayfl validate JOB --explain.",
        epilog="examples:\n  rayfl config                        every section\n"
               "  rayfl config privacy system         two sections\n"
               "  rayfl config algorithm=scaffold     SCAFFOLD's keys\n"
               "  rayfl config dataset=mnist model=mlp partition=dirichlet callbacks=early_stopping",
    )
    conf.add_argument("targets", nargs="*", metavar="SECTION[=ENTRY]",
                      help="a section (run, data, ..., callbacks), or section=entry for an algorithm, model, "
                           "dataset, partitioner or callback (default: every section)")

    lst = sub.add_parser(
        "list", help="list what a job can name: algorithms, models, datasets, partitioners, examples",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Every registered entry of a kind with its one-line summary: rayfl's own, those "
                    "registered by installed packages (entry points rayfl.algorithms, rayfl.models, "
                    "rayfl.datasets, rayfl.partitioners), and the example jobs shipped with rayfl. A job "
                    "may also name user code by import path, 'package.module:attr'.",
        epilog="examples:\n  rayfl list                 everything\n  rayfl list models\n"
               "  rayfl config algorithm=fedprox    an entry's keys, defaults and meanings",
    )
    lst.add_argument("kind", nargs="?", choices=["algorithms", "models", "datasets", "partitions", "examples"],
                     help="one kind (default: all)")

    part = sub.add_parser("partition", help="print (and plot) the client x class matrix of a job's data")
    job_args(part)
    part.add_argument("--plot", metavar="PNG", help="also draw the partition to this file")

    rep = sub.add_parser("report", help="summarise finished runs: final metrics table and curves")
    rep.add_argument("path", nargs="?", default="results", help="a run, an experiment or a results root")
    rep.add_argument("--out", default=None, help="where to write figures (default: <path>/report)")
    rep.add_argument("--metric", default="test_accuracy")
    rep.add_argument("--target", type=float, default=None,
                     help="metric value compressed runs are timed to (default: the hardest multiple of 0.01 every run reaches)")

    bench = sub.add_parser("bench", help="benchmarks that write JSON results")
    bsub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    scale = bsub.add_parser("scale", help="many synthetic clients: seconds per round and peak memory")
    scale.add_argument("--clients", type=_int_list, default=[10000], help="registered clients, e.g. 10000,100000,1000000")
    scale.add_argument("--per-round", type=int, default=1000)
    scale.add_argument("--rounds", type=int, default=10)
    scale.add_argument("--eager", action="store_true", help="the in-memory dataset instead of a lazily generated population")
    scale.add_argument("--out", default="bench/scale.json")
    drv = bsub.add_parser("driver", help="the driver's CPU time per round against the number of hosts")
    drv.add_argument("--hosts", type=_int_list, default=[2, 4, 8, 16, 32], help="host counts, e.g. 2,4,8,16,32")
    drv.add_argument("--rounds", type=int, default=40)
    drv.add_argument("--out", default="bench/driver.json")
    mem = bsub.add_parser("memory", help="each host's peak memory against the clients of a round (19.2M-parameter MLP)")
    mem.add_argument("--clients", type=_int_list, default=[10, 40, 100, 400], help="clients a round, e.g. 10,40,100,400")
    mem.add_argument("--rounds", type=int, default=3)
    mem.add_argument("--vectorize", type=_vectorize_list, default=["off", "auto"],
                     help="engine.vectorize modes, each run at every size (default off,auto)")
    mem.add_argument("--out", default="bench/memory.json")
    asyn = bsub.add_parser(
        "async", help="stragglers: simulated time to accuracy (sync / deadline / FedBuff) and async wall speed-up"
    )
    asyn.add_argument("--clients", type=int, default=1000)
    asyn.add_argument("--target", type=float, default=0.6, help="test accuracy to reach")
    asyn.add_argument("--rounds", type=int, default=100, help="sync rounds (FedBuff gets twice as many steps)")
    asyn.add_argument("--updates", type=int, default=1000, help="applied async updates for the wall-clock part")
    asyn.add_argument("--vectorize", type=_vectorize_list, default=["auto"],
                      help="engine.vectorize modes for the wall-clock part, comma-separated (e.g. auto,off)")
    asyn.add_argument("--out", default="bench/async.json")
    swb = bsub.add_parser("sweep", help="a grid of the digits job as one `rayfl sweep` against a loop of `rayfl run`")
    swb.add_argument("--sizes", type=_int_list, default=[6, 48],
                     help="grids to time, by trial count: 2, 6 (3 lr x 2 seeds), 48 (4 lr x 2 methods x 6 seeds)")
    swb.add_argument("--rounds", type=int, default=20, help="rounds per run")
    swb.add_argument("--out", default="bench/sweep.json")
    zo = bsub.add_parser("zo", help="wall seconds of a ZO-HFL round vs FedAvg with the same local steps (10 clients, tau 20)")
    zo.add_argument("--rounds", type=int, default=6, help="rounds per run (the first and last are not timed)")
    zo.add_argument("--source", default="test_only", choices=["test_only", "full"], help="MNIST: the offline subset or all")
    zo.add_argument("--data-dir", default=None, help="where the MNIST files are (default: the job's data.data_dir)")
    zo.add_argument("--out", default="bench/zo.json")
    zo.add_argument("--vectorize", type=_vectorize_list, default=None,
                    help="engine.vectorize values to compare, e.g. off,on (default: the job's setting)")
    st = bsub.add_parser("startup", help="a short run as a whole process: seconds outside its rounds, by phase")
    st.add_argument("--workload", default="fedavg-mlp", choices=["fedavg-mlp", "fedavg-linear"])
    st.add_argument("--rounds", type=int, default=10)
    st.add_argument("--repeat", type=int, default=1, help="timed runs (the summary is the median one)")
    st.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="extra override for the run, e.g. --set engine.num_hosts=1; repeatable")
    st.add_argument("--warm", action="store_true",
                    help="time runs that join a head with warm pooled hosts (the bench starts and stops both)")
    st.add_argument("--hosts", type=int, default=2, help="pooled hosts with --warm (default 2)")
    st.add_argument("--out", default="bench/startup.json")
    tab = bsub.add_parser("table", help="the Markdown table of workload results (docs/benchmarks.md)")
    tab.add_argument("results", nargs="+", help="JSON files written by rayfl bench WORKLOAD")
    from rayfl.bench.workloads import WORKLOADS

    for workload, spec in WORKLOADS.items():
        fa = bsub.add_parser(workload, help=f"{workload}: rayfl vs a plain PyTorch loop doing the same client work "
                             f"({spec.model}; {spec.data})".replace("%", "%%"))  # argparse formats help with %
        fa.add_argument("--rounds", type=int, default=spec.rounds, help="rounds per run (round 0 and the last are not timed)")
        fa.add_argument("--hosts", type=_int_list, default=list(spec.hosts), help="engine.num_hosts values, e.g. 1,2")
        fa.add_argument("--vectorize", type=_vectorize_list, default=list(spec.vectorize),
                        help="engine.vectorize values, e.g. auto,on,off")
        fa.add_argument("--preaggregate", type=_on_off_list, default=list(spec.preaggregate),
                        help="engine.preaggregate values: off,on (host pre-aggregation)")
        fa.add_argument("--loop-threads", type=int, default=1, help="torch threads of the reference loop (0: torch's default)")
        fa.add_argument("--repeat", type=int, default=1,
                        help="timed (loop, rayfl) pairs per variant, in ABBA order; the ratio is their median")
        fa.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the loop on the GPU, and each variant's hosts sharing one GPU "
                        "(engine.num_gpus_per_host = 1 / hosts)")
        fa.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override for every rayfl run (not the loop), e.g. --set engine.channels_last=off to "
                        "time a setting against its default; repeatable")
        fa.add_argument("--algorithm", dest="algorithms", action="append", default=[], metavar="NAME[,KEY=VALUE...]",
                        help="also time this algorithm (a name or import path, with its own overrides) beside the "
                        "workload's, in the same invocation, e.g. myfl.fedavgm:FedAvgM,algorithm.beta=0; repeatable")
        fa.add_argument("--out", default=f"bench/{workload}.json")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. A user mistake (bad config value or file, unreadable data or trace, a
    resource request the cluster cannot meet, a taken run id) is one line on stderr and exit
    status 2, wherever it is found, Ray started or not; a local Ray that does not start is one
    line and status 1; anything else is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    early_head = argv is None and args.command in ("run", "sweep") and will_start_local_ray(args)
    if early_head:  # Ray starts beside the config's loading (engine/local_ray.py)
        from rayfl.engine.local_ray import start_early

        start_early()
    try:
        code = COMMANDS[args.command](args)
        if argv is None and args.command in ("run", "resume", "sweep"):
            exit_now(code)
        return code
    except user_errors() as e:
        print(f"rayfl: error: {one_line(raised_on_host(e) or e)}", file=sys.stderr)
        return 2
    except Exception as e:
        from rayfl.user_code import found_in, report

        if (mistake := raised_on_host(e)) is not None:
            print(f"rayfl: error: {one_line(mistake)}", file=sys.stderr)
            return 2

        if (err := found_in(e)) is not None:  # the user's own code raised: a short block, status 1
            print(report(err, getattr(e, "rayfl_error_log", None)), file=sys.stderr)
            return 1
        # the local Ray head did not start (an unusable RAY_TMPDIR, Ray failing on this machine):
        # not a bug of rayfl's, so one line too, with the reason Ray gave; status 1, not 2
        local_ray = sys.modules.get("rayfl.engine.local_ray")
        if local_ray is None or not isinstance(e, local_ray.HeadStartError):
            raise
        print(f"rayfl: error: {one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        # a RunInterrupted (a stop was asked for) exists only once the engine is imported:
        # looked up here, it spares commands that run nothing (`report`) torch's import
        runlog = sys.modules.get("rayfl.engine.runlog")
        if runlog is None or not isinstance(e, runlog.RunInterrupted):
            raise
        print(f"rayfl: {e}", file=sys.stderr)
        return 130
    finally:
        if early_head:  # a mistake or a failure before the run took the head: nothing left running
            from rayfl.engine.local_ray import discard_head

            discard_head()


def will_start_local_ray(args: argparse.Namespace) -> bool:
    """Whether `rayfl run` or `sweep` will start a Ray of its own, as far as the command line says (a
    job file naming engine.address is found later, and the early head then discarded)."""
    import os

    return not (os.environ.get("RAY_ADDRESS") or args.address
                or any(o.replace(" ", "").startswith("engine.address=") for o in args.overrides))


def exit_now(code: int) -> None:
    """End the `rayfl` process at once after a finished run, when nothing is left to do:
    results written and closed, output flushed, and Ray already shut down (a local one
    stopped, a cluster disconnected from). The interpreter's own teardown (finalising torch's,
    Ray's and pyarrow's modules) would add a second or more to every run. A process still
    connected to Ray exits normally, so that Ray's exit hooks tell it the driver is done."""
    import os

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "the user asked for something wrong", not "rayfl is broken"
    (ResourceError is a ConfigError; RunExistsError a FileExistsError from the writer)."""
    from rayfl.config import ConfigError
    from rayfl.data import DatasetError
    from rayfl.results.writer import RunExistsError

    return (ConfigError, DatasetError, RunExistsError)


def raised_on_host(e: BaseException) -> BaseException | None:
    """The user mistake a host found (a client state a checkpoint cannot hold), as the host
    raised it: Ray's task error around it would print the host's whole traceback."""
    cause = getattr(e, "cause", None)  # Ray's task error: the host's exception as raised there
    return cause if isinstance(cause, user_errors()) else None


def one_line(e: BaseException) -> str:
    """The message on a single line (some libraries' messages span several)."""
    return " ".join(str(e).split()) or type(e).__name__


def _load(args: argparse.Namespace):
    """The job's config. A job with a `sweep:` block runs (validates, partitions) as its base
    job, with a note that `rayfl sweep` runs the grid."""
    from rayfl.sweep import load_base_config

    overrides = list(args.overrides)
    if getattr(args, "address", None):
        overrides.append(f"engine.address={args.address}")
    job = job_path(args)
    cfg, has_sweep = load_base_config(job, overrides)
    if has_sweep:
        print(f"rayfl: {job} declares a sweep; this runs its base job only "
              f"(use `rayfl sweep {job}` for the grid)", file=sys.stderr)
    return cfg


def job_path(args: argparse.Namespace) -> str | None:
    """The job file a command runs: its argument, or the shipped example `--example` names."""
    example = getattr(args, "example", None)
    if example is None:
        return args.job
    from rayfl.config import ConfigError
    from rayfl.examples import example_path

    if args.job is not None:
        raise ConfigError("--example", f"give a job file or --example, not both ({args.job!r} and {example!r})")
    return str(example_path(example))


def cmd_run(args: argparse.Namespace) -> int:
    from rayfl.progress import mark, write_marks

    mark("cli")  # the interpreter started and rayfl.cli imported
    cfg = _load(args)
    mark("config")
    from rayfl.engine.local_ray import fork_workers_here

    fork_workers_here()  # an early head's workers: forked from this process, now torch and rayfl are in
    from rayfl.progress import RoundProgress
    from rayfl.runner import build_dataset, check_address, check_before_ray, run_experiment

    check_address(cfg)  # a Ray to join that is not there: said before the data are built
    check_before_ray(cfg, cfg.planned_clients(), cfg.run.run_id)  # hosts or GPUs this machine lacks, a taken run id
    dataset = build_dataset(cfg)
    mark("dataset")
    if not args.quiet:
        print(dataset.summary(), file=sys.stderr)
    with RoundProgress(cfg.run.rounds, enabled=not args.quiet) as bar:
        outcome = run_experiment(cfg, progress=bar.update, dataset=dataset)
    final = {k: v for k, v in outcome.summary.items() if isinstance(v, (int, float))}
    print(f"results: {outcome.run_dir}")
    print(json.dumps(final, indent=None, default=float))
    mark("printed")
    write_marks(run_dir=str(outcome.run_dir))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from rayfl.progress import RoundProgress
    from rayfl.runner import resume_experiment, resume_target

    with RoundProgress(resume_target(args.run_dir), enabled=not args.quiet) as bar:
        outcome = resume_experiment(args.run_dir, progress=bar.update, trust_pickle=args.trust_pickle)
    final = {k: v for k, v in outcome.summary.items() if isinstance(v, (int, float))}
    print(f"results: {outcome.run_dir}")
    print(json.dumps(final, indent=None, default=float))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from rayfl.sweep import run_sweep

    outcome = run_sweep(
        job_path(args), args.overrides, args.grid, args.seeds, address=args.address,
        name=args.name, max_concurrent=args.max_concurrent, max_failures=args.max_failures,
        scheduler=args.scheduler, metric=args.metric, mode=args.mode,
    )
    for run_id, status in outcome.statuses.items():
        print(f"{status or 'not started'}\t{run_id}")
    print(f"results: {outcome.sweep_dir}")
    for error in outcome.errors:
        print(f"rayfl: trial failed: {error}", file=sys.stderr)
    unfinished = [r for r, s in outcome.statuses.items() if s != "completed"]
    if outcome.errors:
        print(f"rayfl: {len(outcome.errors)} trial(s) failed; run the same command again to resume "
              "the sweep (completed runs are kept)", file=sys.stderr)
        return 1
    if unfinished:
        print(f"rayfl: {len(unfinished)} run(s) not completed (stopped early by the scheduler, or "
              "interrupted)", file=sys.stderr)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    import yaml

    cfg = _load(args)
    planned = cfg.planned_clients()
    if cfg.privacy.on and planned is not None:  # the privacy budget, as `rayfl run` checks it
        from rayfl.pipeline.server import resolve_noise

        resolve_noise(cfg, planned)
    if args.explain:
        from rayfl.config_explain import explain_yaml

        print(explain_yaml(cfg), end="")
        return 0
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from rayfl.config_explain import describe

    print(describe(args.targets), end="")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from rayfl.examples import examples
    from rayfl.registry import REGISTRIES

    kinds = {"algorithms": "algorithm", "models": "model", "datasets": "dataset", "partitions": "partitioner"}
    wanted = [args.kind] if args.kind else [*kinds, "examples"]
    for i, kind in enumerate(wanted):
        if len(wanted) > 1:
            print(("\n" if i else "") + f"{kind}:")
        if kind == "examples":
            rows = [(name, summary, "") for name, summary in examples().items()]
        else:
            rows = [listed(REGISTRIES[kinds[kind]], name) for name in REGISTRIES[kinds[kind]].names()]
        width = max((len(r[0]) for r in rows), default=0)
        for name, summary, origin in rows:
            print(f"  {name:<{width}}  {summary}{'  ' + origin if origin else ''}")
    return 0


def listed(registry: Any, name: str) -> tuple[str, str, str]:
    """(name, summary, where it comes from) of one entry; an installed entry point that does
    not load is listed with the reason, not a failure of the whole listing."""
    from rayfl.config import ConfigError

    try:
        entry = registry.get(name)
        return name, entry.describe(), "" if entry.origin == "built-in" else f"[{entry.origin}]"
    except ConfigError as e:
        return name, f"(cannot load: {str(e).partition(': ')[2]})", ""


def cmd_partition(args: argparse.Namespace) -> int:
    from rayfl.data import build_federated_dataset
    from rayfl.data.plot import format_class_matrix, plot_partition

    cfg = _load(args)
    fd = build_federated_dataset(cfg.data, cfg.partition, cfg.run.seed)
    print(fd.summary())
    print(format_class_matrix(fd))
    if args.plot:
        print(f"plot: {plot_partition(fd, Path(args.plot))}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from rayfl.report import write_report

    for line in write_report(args.path, Path(args.out) if args.out else None, args.metric, args.target):
        print(line)
    return 0


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _vectorize_list(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in ("auto", "on", "off") for v in values):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of auto, on, off; got {text!r}")
    return values


def _on_off_list(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in ("on", "off") for v in values):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of on, off; got {text!r}")
    return values


def cmd_pool(args: argparse.Namespace) -> int:
    import logging
    import os

    import ray

    from rayfl.config import ConfigError
    from rayfl.engine import pool
    from rayfl.engine.local_ray import unreachable

    if args.hosts < 0:
        raise ConfigError("--hosts", "must be >= 0")
    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    if (why := unreachable(address)) is not None:
        raise ConfigError("--address" if args.address else "RAY_ADDRESS", why)
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except ConnectionError as e:
        raise ConfigError("--address", f"no running Ray at {address!r} (start one with `ray start --head`): {e}") from None
    try:
        if args.action == "start":
            started = pool.start_pool(args.hosts)
            print(f"started {len(started)} pooled host(s)", file=sys.stderr)
        elif args.action == "stop":
            print(f"stopped {pool.stop_pool()} pooled host(s)", file=sys.stderr)
            return 0
        for st in pool.pool_status():
            state = f"leased by process {st['leased_by']}" if st["leased_by"] else "idle"
            stale = ", stale (replaced at the next run's end)" if st["stale"] else ""
            print(f"{st['name']}: pid {st['pid']}, {state}{stale}, {st['leases']} lease(s), {st['rss_mb']} MB")
    finally:
        ray.shutdown()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    result: dict[str, Any]
    if args.bench == "scale":
        from rayfl.bench.scale import run_scale_bench

        result = run_scale_bench(args.clients, args.per_round, args.rounds, Path(args.out), eager=args.eager)
    elif args.bench == "driver":
        from rayfl.bench.driver import run_driver_bench

        result = run_driver_bench(args.hosts, args.rounds, Path(args.out))
    elif args.bench == "memory":
        from rayfl.bench.memory import run_memory_bench

        result = run_memory_bench(args.clients, args.rounds, Path(args.out), tuple(args.vectorize))
    elif args.bench == "startup":
        from rayfl.bench.startup import run_startup_bench

        result = run_startup_bench(args.workload, args.rounds, args.repeat, Path(args.out), args.overrides,
                                   warm=args.warm, hosts=args.hosts)
    elif args.bench == "zo":
        from rayfl.bench.zo import run_zo_bench

        result = run_zo_bench(args.rounds, Path(args.out), args.source, args.data_dir, args.vectorize)
    elif args.bench == "table":
        from rayfl.bench.table import markdown_table

        print(markdown_table([Path(p) for p in args.results]), end="")
        return 0
    elif args.bench == "sweep":
        from rayfl.bench.sweep import run_sweep_bench

        result = run_sweep_bench(args.sizes, args.rounds, Path(args.out))
    elif args.bench == "async":
        from rayfl.bench.asynchronous import run_async_bench

        result = run_async_bench(args.clients, args.target, args.rounds, args.updates, Path(args.out),
                                 tuple(args.vectorize))
    else:  # a workload against the plain loop (rayfl.bench.workloads)
        from rayfl.bench.fedavg import run_fedavg_bench

        result = run_fedavg_bench(args.bench, args.rounds, Path(args.out), args.hosts, args.vectorize, args.loop_threads or None,
                                  args.preaggregate, args.device, args.repeat, args.overrides, args.algorithms)
    print(json.dumps(result, indent=2))
    return 0


COMMANDS = {
    "run": cmd_run,
    "resume": cmd_resume,
    "sweep": cmd_sweep,
    "validate": cmd_validate,
    "config": cmd_config,
    "list": cmd_list,
    "partition": cmd_partition,
    "report": cmd_report,
    "bench": cmd_bench,
    "pool": cmd_pool,
}


if __name__ == "__main__":
    sys.exit(main())
